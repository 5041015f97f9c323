"""The device path of the training transform: uint8 workers, float conversion and random erasing after transfer."""

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torchvision import transforms

from kpca.vision_cls.cli import main
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.input import TrainData
from kpca.vision_cls.input.device.tail import BatchRandomErasing, DeviceTail, uint8_to_unit
from kpca.vision_cls.input.workers.random_erasing import PixelSpaceRandomErasing
from tests.cli_support import CONFIGS, run_cli, smoke_options

HEIGHT, WIDTH = 24, 40  # not square, so a box drawn with h and w swapped shows in the aspect statistics
DRAWS = 4000


def erasure_statistics(erased: torch.Tensor) -> dict[str, float]:
    """Fraction of erased images, mean box area (fraction of the image) and mean log aspect h / w of the boxes.

    Args:
        erased: (N, H, W) bool, True where a pixel was erased.
    """
    hit = erased.flatten(1).any(1)  # (N,)
    boxes = erased[hit]  # (M, H, W)
    heights = boxes.any(2).sum(1).double()  # (M,)
    widths = boxes.any(1).sum(1).double()  # (M,)
    assert torch.equal(boxes.flatten(1).sum(1).double(), heights * widths), "every erased region is one box"
    return {
        "fraction": hit.double().mean().item(),
        "area": (heights * widths).mean().item() / (HEIGHT * WIDTH),
        "log_aspect": (heights / widths).log().mean().item(),
        "top_row": boxes.any(2).double().argmax(1).double().mean().item(),
    }


def reference_erased(probability: float) -> torch.Tensor:
    """(DRAWS, H, W) erased pixels of today's per-image PixelSpaceRandomErasing (seeded Python random)."""
    random.seed(0)
    erasing = PixelSpaceRandomErasing(probability, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    canvas = torch.full((3, HEIGHT, WIDTH), float("nan"))
    return torch.stack([erasing(canvas).isfinite()[0] for _ in range(DRAWS)])


def batched_erased(probability: float) -> torch.Tensor:
    """(DRAWS, H, W) erased pixels of BatchRandomErasing on one batch (seeded torch)."""
    torch.manual_seed(0)
    erasing = BatchRandomErasing(probability, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    return erasing(torch.full((DRAWS, 3, HEIGHT, WIDTH), float("nan"))).isfinite()[:, 0]


def random_photo(seed: int = 0, size: tuple[int, int] = (37, 29)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def seed_all(seed: int) -> None:
    """Seed every generator the PIL stages draw from (Python, numpy, torch)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_uint8_to_unit_is_bit_identical_to_to_tensor():
    image = random_photo()
    every_level = Image.fromarray(np.arange(256, dtype=np.uint8).repeat(3).reshape(16, 16, 3))
    for picture in (image, every_level):
        expected = transforms.ToTensor()(picture)  # (3, H, W) float32
        assert torch.equal(uint8_to_unit(transforms.PILToTensor()(picture)), expected)


def test_uint8_to_unit_refuses_float_images():
    with pytest.raises(TypeError, match="uint8"):
        uint8_to_unit(torch.zeros(3, 4, 4))


def test_an_unknown_fill_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"mode='zeros' is not one of 'pixel', 'rand', 'const'; choose one of timm's"):
        BatchRandomErasing(1.0, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, mode="zeros")


def test_device_path_without_erasing_equals_the_reference_transform():
    reference = ImageNetDataModule(builtin="digits", image_size=16, train=TrainData(re_prob=0.0, augment_on="workers"))
    device = ImageNetDataModule(builtin="digits", image_size=16, train=TrainData(re_prob=0.0, augment_on="device"))
    image = random_photo()
    seed_all(3)
    expected = reference.train_input.transform()(image)  # (3, 16, 16) float32
    seed_all(3)
    worker = device.train_input.transform()(image)  # (3, 16, 16) uint8
    assert worker.dtype == torch.uint8 and expected.dtype == torch.float32
    assert torch.equal(device.train_input.device_tail(worker[None])[0], expected)
    assert torch.equal(reference.train_input.device_tail(expected[None])[0], expected)  # workers: passed through


@pytest.mark.parametrize("probability", [0.25, 1.0])
def test_batched_erasing_has_the_distribution_of_pixel_space_random_erasing(probability: float):
    reference = erasure_statistics(reference_erased(probability))
    batched = erasure_statistics(batched_erased(probability))
    assert batched["fraction"] == pytest.approx(reference["fraction"], abs=0.025)  # 0.3 instead of 0.25 fails
    assert batched["fraction"] == pytest.approx(probability, abs=0.025)
    assert batched["area"] == pytest.approx(reference["area"], rel=0.08)
    assert batched["log_aspect"] == pytest.approx(reference["log_aspect"], abs=0.06)
    assert batched["top_row"] == pytest.approx(reference["top_row"], abs=0.6)


def test_batched_erasing_detects_a_wrong_probability():
    assert abs(erasure_statistics(batched_erased(0.3))["fraction"] - 0.25) > 0.025


def test_batched_erasing_fills_with_deit_noise_in_pixel_space():
    torch.manual_seed(0)
    erasing = BatchRandomErasing(1.0, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, mode="pixel")
    images = erasing(torch.full((256, 3, HEIGHT, WIDTH), float("nan")))  # (256, 3, H, W)
    mean = torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1)
    std = torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1)
    z = ((images.flatten(2) - mean) / std).transpose(0, 1).flatten(1)  # (3, erased pixels per channel)
    z = z[:, z[0].isfinite()]
    assert z.mean(1).abs().max() < 0.02 and (z.std(1) - 1).abs().max() < 0.02


def test_batched_erasing_const_mode_fills_the_mean():
    erasing = BatchRandomErasing(1.0, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, mode="const")
    images = erasing(torch.full((8, 3, HEIGHT, WIDTH), float("nan")))
    fills = images.permute(1, 0, 2, 3).flatten(1)  # (3, B * H * W)
    fills = fills[:, fills[0].isfinite()]
    assert torch.allclose(fills, torch.tensor(IMAGENET_DEFAULT_MEAN)[:, None].expand_as(fills))


def test_on_after_batch_transfer_finishes_training_batches_and_passes_the_others(tmp_path: Path):
    data = ImageNetDataModule(builtin="digits", cache_dir=str(tmp_path), train=TrainData(re_prob=0.0))
    images = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    labels = torch.tensor([1, 2])
    data.trainer = SimpleNamespace(training=True)  # what Lightning's training loop reports
    finished, same_labels = data.on_after_batch_transfer((images, labels), 0)
    assert torch.equal(finished, images.float() / 255) and same_labels is labels
    evaluation = (finished, labels)
    data.trainer = SimpleNamespace(training=False)  # validation, test, predict
    assert data.on_after_batch_transfer(evaluation, 0) is evaluation


def test_the_device_tail_follows_re_prob_and_augment_on():
    assert ImageNetDataModule(builtin="digits", train=TrainData(re_prob=0.0)).train_input.device_tail.erasing is None
    tail = ImageNetDataModule(builtin="digits", train=TrainData(re_prob=0.25, re_mode="rand")).train_input.device_tail
    assert isinstance(tail, DeviceTail) and tail.to_float and tail.erasing.mode == "rand"
    workers = ImageNetDataModule(builtin="digits", train=TrainData(augment_on="workers")).train_input.device_tail
    assert not workers.to_float and workers.erasing is None and workers.rand_augment is None


def test_evaluation_images_are_unchanged_by_augment_on(digits_cache_dir: Path):
    images = []
    for augment_on in ("device", "workers"):
        dm = ImageNetDataModule(
            builtin="digits",
            cache_dir=str(digits_cache_dir),
            image_size=32,
            num_workers=0,
            train=TrainData(augment_on=augment_on),
        )
        dm.setup("validate")
        images.append(dm.val_set[0][0])  # resized to 36 (crop_pct 0.875), center-cropped to 32, float
    assert images[0].dtype == torch.float32 and torch.equal(*images)


@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_fit_on_the_smoke_config_with_the_device_path(tmp_path: Path, digits_cache_dir: Path):
    options = smoke_options(CONFIGS / "vision_cls" / "smoke.yaml", tmp_path, digits_cache_dir)
    cli = run_cli(main, "vision-cls", "fit", *options, "--data.train.augment_on=device", "--trainer.fast_dev_run=2")
    assert cli.datamodule.train.augment_on == "device" and cli.datamodule.train.re_prob > 0
    assert cli.trainer.state.finished and cli.trainer.global_step == 2
