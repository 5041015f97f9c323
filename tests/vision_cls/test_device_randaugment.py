"""``data.train.augment_on: device_randaugment``: the workers stop after crop and flip, RandAugment runs on the batch.

The batched op itself is held to timm and Pillow in test_batch_rand_augment.py; here, its wiring: what the workers
leave out, what the device tail runs and in which order, and a fit through the console script.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN
from timm.data.auto_augment import RandAugment

from kpca.vision_cls.cli import main
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.input import TrainData
from kpca.vision_cls.input.device.rand_augment import BatchRandAugment
from kpca.vision_cls.input.device.tail import uint8_to_unit
from kpca.vision_cls.input.policy import timm_train_hparams
from kpca.vision_cls.input.workers.turbo import TensorHorizontalFlip, hwc_to_chw
from tests.cli_support import CONFIGS, run_cli, smoke_options

DEIT = "rand-m9-mstd0.5-inc1"


def write_tree(root: Path, size: tuple[int, int] = (48, 40)) -> Path:
    """A two-class ImageFolder (train and val) of small random JPEGs; returns its root."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for synset in ("n00000001", "n00000002"):
            folder = root / split / synset
            folder.mkdir(parents=True)
            for i in range(4):
                pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.JPEG", quality=90)
    return root


@pytest.mark.parametrize("path", ["turbo", "timm"])
def test_the_workers_leave_randaugment_out_and_stop_at_uint8(tmp_path: Path, path: str):
    root = write_tree(tmp_path / "tree")
    on_device = ImageNetDataModule(
        root=str(root), image_size=32, train=TrainData(input=path, augment_on="device_randaugment")
    )
    in_workers = ImageNetDataModule(root=str(root), image_size=32, train=TrainData(input=path, augment_on="device"))
    moved, kept = on_device.train_input.transform().transforms, in_workers.train_input.transform().transforms
    assert any(isinstance(stage, RandAugment) for stage in kept)
    assert not any(isinstance(stage, RandAugment) for stage in moved)
    if path == "turbo":
        assert isinstance(moved[-2], TensorHorizontalFlip) and moved[-1] is hwc_to_chw  # flip, then (3, S, S)
    source = (root / "train" / "n00000001" / "0.JPEG").read_bytes() if path == "turbo" else None
    transform = on_device.train_input.transform()
    image = transform(source if path == "turbo" else Image.open(root / "train/n00000001/0.JPEG"))
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32)


def test_the_device_tail_runs_randaugment_then_the_float_conversion_then_erasing(tmp_path: Path):
    data = ImageNetDataModule(
        root=str(write_tree(tmp_path / "tree")),
        image_size=32,
        train=TrainData(augment_on="device_randaugment", re_prob=0.25),
    )
    tail = data.train_input.device_tail
    assert isinstance(tail.rand_augment, BatchRandAugment) and tail.erasing is not None
    assert timm_train_hparams(32, IMAGENET_DEFAULT_MEAN, "bicubic").items() <= tail.rand_augment.hparams.items()
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    torch.manual_seed(3)
    finished = tail(images)
    torch.manual_seed(3)
    expected = tail.erasing(uint8_to_unit(BatchRandAugment(DEIT, tail.rand_augment.hparams)(images)))
    assert finished.dtype == torch.float32 and torch.equal(finished, expected)
    torch.manual_seed(3)
    assert not torch.equal(finished, tail.erasing(uint8_to_unit(images)))  # RandAugment did change pixels
    assert (
        ImageNetDataModule(builtin="digits", train=TrainData(augment_on="device")).train_input.device_tail.rand_augment
        is None
    )


@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_fit_with_randaugment_on_the_device(tmp_path: Path, digits_cache_dir: Path):
    options = smoke_options(CONFIGS / "vision_cls" / "smoke.yaml", tmp_path, digits_cache_dir)
    cli = run_cli(
        main, "vision-cls", "fit", *options, "--data.train.augment_on=device_randaugment",
        f"--data.train.auto_augment={DEIT}",
        "--trainer.fast_dev_run=2",
    )  # fmt: skip
    assert cli.datamodule.train.augment_on == "device_randaugment"
    assert isinstance(cli.datamodule.train_input.device_tail.rand_augment, BatchRandAugment)
    assert cli.trainer.state.finished and cli.trainer.global_step == 2
