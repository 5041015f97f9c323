"""The DALI training input path (data.train.input=dali) on CPU operators, against timm's PIL recipe; one GPU test."""

import math
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_sample_images
from timm.data import IMAGENET_DEFAULT_MEAN
from timm.data import auto_augment as timm_auto_augment
from timm.data.transforms import RandomResizedCropAndInterpolation
from torch.utils.data import DistributedSampler
from torchvision.datasets import ImageFolder

from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.input import TrainData
from kpca.vision_cls.input.dali.loader import DaliTrainLoader, image_folder_samples
from kpca.vision_cls.input.dali.recipe import DaliTrainRecipe
from kpca.vision_cls.input.dali.tables import rand_augment_specs
from kpca.vision_cls.input.options import check_dali_policy
from kpca.vision_cls.input.policy import parse_rand_augment
from kpca.vision_cls.input.samplers import RepeatAugSampler
from tests.cli_support import CONFIGS, CPU

CLASSES = ("n01440764", "n01443537", "n01484850")
SIZES = ((500, 375), (375, 500), (97, 81), (300, 300), (64, 64), (211, 170), (120, 150))  # (width, height)
DEIT = "rand-m9-mstd0.5-inc1"
CPU_DEVICE = torch.device("cpu")


def smooth_image(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A distinct, JPEG-friendly RGB image: 6x8 random colours upsampled smoothly to ``width`` x ``height``."""
    cells = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    return Image.fromarray(cells).resize((width, height), Image.BICUBIC)


def write_tree(root: Path) -> Path:
    """A tiny ImageNet layout: 7 train images per class at varied sizes (real photos, generated images, one PNG and
    one grayscale JPEG among them), 2 val images per class."""
    rng = np.random.default_rng(0)
    photos = load_sample_images().images
    for c, wnid in enumerate(CLASSES):
        train, val = root / "train" / wnid, root / "val" / wnid
        train.mkdir(parents=True)
        val.mkdir(parents=True)
        for k, (width, height) in enumerate(SIZES):
            image = smooth_image(rng, width, height)
            if k == 0 and c < len(photos):
                image = Image.fromarray(photos[c]).resize((width, height), Image.BICUBIC)
            if c == 1 and k == 3:
                image.save(train / f"img{k}.png")
            else:
                (image.convert("L") if c == 2 and k == 4 else image).save(train / f"img{k}.JPEG", quality=90)
        for k in range(2):
            smooth_image(rng, 80, 60).save(val / f"val{k}.JPEG", quality=90)
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tree(tmp_path_factory.mktemp("imagenet"))


def recipe(size: int, scale=(0.08, 1.0), hflip=0.5, auto_augment: str | None = DEIT) -> DaliTrainRecipe:
    return DaliTrainRecipe.from_timm(size, scale, hflip, auto_augment, "bicubic", IMAGENET_DEFAULT_MEAN)


def loader(samples, sampler, train_recipe, batch_size=4, seed=0, threads=1, device=CPU_DEVICE) -> DaliTrainLoader:
    return DaliTrainLoader(samples, sampler, train_recipe, batch_size, device, num_threads=threads, seed=seed)


def single_rank(samples, seed: int = 0) -> DistributedSampler:
    return DistributedSampler(samples, num_replicas=1, rank=0, shuffle=True, seed=seed)


def epoch(dali: DaliTrainLoader, number: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    dali.sampler.set_epoch(number)
    return list(dali)


def whole_image(path: str, size: int) -> np.ndarray:
    """(size, size, 3) uint8: the file decoded by PIL and resized whole, bicubic: what timm's RandomResizedCrop
    gives with scale (1, 1) for an aspect ratio inside (3/4, 4/3), except the 1-2 % of draws whose window rounds
    one pixel short (DALI's and timm's alike)."""
    return np.asarray(Image.open(path).convert("RGB").resize((size, size), Image.BICUBIC))


def mean_differences(images: torch.Tensor, paths: list[str]) -> np.ndarray:
    """Mean |image - whole_image(path)| per (C, S, S) uint8 image, in uint8 levels."""
    size = images.shape[-1]
    pixels = [image.permute(1, 2, 0).numpy().astype(int) for image in images]
    return np.array([np.abs(p - whole_image(path, size)).mean() for p, path in zip(pixels, paths, strict=True)])


def test_samples_are_image_folders(tree: Path):
    folder = ImageFolder(str(tree / "train"))
    assert image_folder_samples(tree / "train", folder.classes) == folder.samples
    assert folder.classes == list(CLASSES) and len(folder.samples) == 21


def test_batches_are_the_files_of_the_sampler_with_their_labels_and_timm_pixels(tree: Path):
    """Without random stages (scale (1, 1), no flip, no RandAugment) every output is timm's crop of the
    file the sampler put there (DALI's libjpeg-turbo decode is PIL's; cubic resizing is within interpolation
    noise), and its label is ImageFolder's."""
    samples = image_folder_samples(tree / "train", CLASSES)
    dali = loader(samples, single_rank(samples), recipe(224, scale=(1.0, 1.0), hflip=0.0, auto_augment=None))
    batches = epoch(dali, 0)
    assert len(batches) == len(dali) == 21 // 4
    expected = dali.epoch_samples()
    images = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1] for b in batches])
    assert images.shape == (20, 3, 224, 224) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64 and labels.tolist() == [label for _, label in expected]
    differences = mean_differences(images, [path for path, _ in expected])
    assert np.mean(differences < 0.5) >= 0.9 and differences.max() < 3, differences


def test_deit_recipe_batches(tree: Path):
    samples = image_folder_samples(tree / "train", CLASSES)
    dali = loader(samples, single_rank(samples), recipe(224), batch_size=7)
    batches = epoch(dali, 0)
    assert [tuple(images.shape) for images, _ in batches] == [(7, 3, 224, 224)] * 3
    images = torch.cat([b[0] for b in batches]).float()
    assert 40 < images.mean() < 215 and images.std() > 20  # real pictures, not blank or saturated
    assert torch.cat([b[1] for b in batches]).tolist() == [label for _, label in dali.epoch_samples()]


def fingerprints(tree: Path, size: int) -> dict[str, torch.Tensor]:
    """Each training file's deterministic DALI output (scale (1, 1), no flip, no RandAugment), by path."""
    samples = image_folder_samples(tree / "train", CLASSES)
    sampler = DistributedSampler(samples, num_replicas=1, rank=0, shuffle=False)
    dali = loader(samples, sampler, recipe(size, (1.0, 1.0), 0.0, None), batch_size=len(samples))
    (images, _), *_ = list(dali)
    return {path: image for (path, _), image in zip(samples, images, strict=True)}


def identify(images: torch.Tensor, prints: dict[str, torch.Tensor]) -> list[str]:
    """The file behind each image: the nearest fingerprint, which must be unambiguous."""
    paths = list(prints)
    reference = torch.stack([prints[p] for p in paths]).float()  # (N, C, S, S)
    found = []
    for image in images.float():
        distance = (reference - image).abs().mean(dim=(1, 2, 3))  # (N,)
        nearest = distance.argsort()
        assert distance[nearest[0]] < 4 and distance[nearest[1]] > 4 * distance[nearest[0]] + 4
        found.append(paths[nearest[0]])
    return found


def test_two_ranks_read_every_image_once_per_epoch(tree: Path):
    """Rank r reads DistributedSampler's share in its order (checked on the pixels), so an epoch covers the dataset
    without overlap except the sampler's padding, minus the partial batch each rank drops; epochs differ."""
    size, batch = 16, 4
    prints = fingerprints(tree, size)
    samples = image_folder_samples(tree / "train", CLASSES)
    deterministic = recipe(size, (1.0, 1.0), 0.0, None)
    ranks = [DistributedSampler(samples, num_replicas=2, rank=r, shuffle=True, seed=7) for r in range(2)]
    loaders = [loader(samples, sampler, deterministic, batch) for sampler in ranks]
    assert [len(d) for d in loaders] == [11 // batch] * 2  # ceil(21 / 2) = 11 per rank, 2 full batches
    orders = []
    for number in range(2):
        read = []
        for dali in loaders:
            batches = epoch(dali, number)
            paths = identify(torch.cat([images for images, _ in batches]), prints)
            assert paths == [path for path, _ in dali.epoch_samples()]
            assert len(set(paths)) == len(paths) == 2 * batch
            read.append(paths)
        counts = Counter(read[0] + read[1])
        padding = 2 * 11 - len(samples)
        assert sum(count - 1 for count in counts.values()) <= padding
        assert len(prints) - len(counts) <= len(samples) - 2 * 2 * batch + padding  # what the dropped tails held
        orders.append(read)
    assert orders[0] != orders[1]


def test_repeated_augmentation_sampler_orders_the_dali_loader(tree: Path):
    samples = image_folder_samples(tree / "train", CLASSES)
    sampler = RepeatAugSampler(samples, num_replicas=1, rank=0, num_repeats=3, seed=0)
    dali = loader(samples, sampler, recipe(32), batch_size=3)
    labels = torch.cat([labels for _, labels in epoch(dali, 0)])
    assert labels.tolist() == [samples[i][1] for i in list(sampler)[: len(dali) * 3]]
    assert [path for path, _ in dali.epoch_samples()][:3] == [dali.epoch_samples()[0][0]] * 3  # 3 copies in a row


def test_seeded_batches_repeat_and_depend_on_the_seed(tree: Path):
    samples = image_folder_samples(tree / "train", CLASSES)

    def images(seed: int, threads: int) -> torch.Tensor:
        dali = loader(samples, single_rank(samples, seed), recipe(32), seed=seed, threads=threads)
        return torch.cat([images for images, _ in epoch(dali, 1)])

    first = images(3, 1)
    assert torch.equal(first, images(3, 2))  # per-sample random streams: the thread count does not matter
    assert not torch.equal(first, images(4, 1))


def coordinate_image(folder: Path) -> Path:
    """A 240x180 PNG whose red channel is the column and green channel the row of each pixel."""
    columns, rows = np.meshgrid(np.arange(240, dtype=np.uint8), np.arange(180, dtype=np.uint8))
    path = folder / "coordinates.png"
    Image.fromarray(np.stack([columns, rows, np.zeros_like(rows)], axis=-1)).save(path)
    return path


def test_flip_and_crop_statistics_match_timm(tmp_path: Path):
    """Crop windows read back from a coordinate image: DALI's area, aspect and centre statistics are timm's
    ``RandomResizedCrop``'s on the same image, and half of the crops are flipped."""
    draws, size = 800, 64
    samples = [(str(coordinate_image(tmp_path)), 0)] * draws
    dali = loader(samples, single_rank(samples), recipe(size, auto_augment=None), batch_size=200)
    images = torch.cat([images for images, _ in epoch(dali, 0)]).double()  # (N, C, S, S)
    columns, rows = images[:, 0], images[:, 1]  # (N, S, S)
    flipped = columns[:, :, -1].mean(1) < columns[:, :, 0].mean(1)  # (N,)
    left, right = columns[:, :, 0].mean(1), columns[:, :, -1].mean(1)
    width = (left - right).abs() * size / (size - 1) + 1  # (N,): pixel centres span width - 1 pixels
    height = (rows[:, -1, :].mean(1) - rows[:, 0, :].mean(1)) * size / (size - 1) + 1
    dali_stats = {
        "area": (width * height).mean().item() / (240 * 180),
        "log_aspect": (width / height).log().mean().item(),
        "centre_x": ((left + right) / 2).mean().item() / 240,
    }
    random.seed(0)
    canvas = Image.new("RGB", (240, 180))
    boxes = np.array(
        [RandomResizedCropAndInterpolation.get_params(canvas, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(20000)]
    )
    top, left_edge, box_h, box_w = boxes.T
    timm_stats = {
        "area": np.mean(box_h * box_w) / (240 * 180),
        "log_aspect": np.mean(np.log(box_w / box_h)),
        "centre_x": np.mean(left_edge + box_w / 2) / 240,
    }
    assert abs(flipped.double().mean().item() - 0.5) < 0.07
    assert dali_stats == pytest.approx(timm_stats, abs=0.035)


@pytest.mark.parametrize(
    "config",
    ["rand-m9-mstd0.5-inc1", "rand-m7-n3-mstd101-p0.8", "rand-m10-mmax12-inc0", "rand-n1"],
)
def test_rand_augment_strings_parse_as_timm(config: str):
    ours = parse_rand_augment(config)
    theirs = timm_auto_augment.rand_augment_transform(config, {})
    assert ours.num_layers == theirs.num_layers
    assert ours.magnitude == theirs.ops[0].magnitude and ours.prob == theirs.ops[0].prob
    assert ours.magnitude_std == theirs.ops[0].magnitude_std
    assert ours.magnitude_max == (theirs.ops[0].magnitude_max or 10)
    assert [spec.name for spec in rand_augment_specs(ours)] == [op.name for op in theirs.ops] + ["Identity"]


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ("original", "no RandAugment policy"),
        ("augmix-m5", "no RandAugment policy"),
        ("rand-m9-tweights", "section 'tweights'"),
        ("rand-m9-x3", "section 'x3'"),
    ],
)
def test_policies_without_a_dali_mirror_are_refused(config: str, why: str):
    with pytest.raises(ValueError, match=f"auto_augment='{config}'.*{why}"):
        parse_rand_augment(config)
    with pytest.raises(ValueError, match=f"data.train.input=dali mirrors .*{why}.*data.train.input=timm"):
        check_dali_policy(config)


def test_rand_augment_changes_images_as_often_as_timm(tree: Path):
    """With only RandAugment random (scale (1, 1), no flip), the share of untouched images is timm's: no op in
    either layer (prob 0.5 each) or only ops that leave the image as is, about 1/4 here."""
    samples = image_folder_samples(tree / "train", CLASSES)[:1] * 256
    plain = loader(samples, single_rank(samples), recipe(32, (1.0, 1.0), 0.0, None), batch_size=256)
    augmented = loader(samples, single_rank(samples), recipe(32, (1.0, 1.0), 0.0, DEIT), batch_size=256)
    (reference, _), *_ = epoch(plain, 0)
    (images, _), *_ = epoch(augmented, 0)
    untouched = (images == reference).flatten(1).all(1).double().mean().item()
    assert 0.25 - 0.1 < untouched < 0.25 + 0.12


def test_datamodule_refuses_what_dali_cannot_do(tree: Path):
    with pytest.raises(ValueError, match="data.builtin='digits'"):
        ImageNetDataModule(builtin="digits", train=TrainData(input="dali"))
    with pytest.raises(ValueError, match="data.train.augment_on=workers"):
        ImageNetDataModule(root=str(tree), train=TrainData(input="dali", augment_on="workers"))
    with pytest.raises(ValueError, match="data.train.color_jitter"):
        ImageNetDataModule(root=str(tree), train=TrainData(input="dali", auto_augment=None, color_jitter=0.4))
    with pytest.raises(ValueError, match="'original'"):
        ImageNetDataModule(root=str(tree), train=TrainData(input="dali", auto_augment="original"))
    with pytest.raises(ValueError, match="data.train.bad_files=skip needs DataLoader workers"):
        ImageNetDataModule(root=str(tree), train=TrainData(input="dali", bad_files="skip"))


def test_missing_dali_names_the_extra(tree: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # what an install without the extra gives
    with pytest.raises(ImportError, match=r"pip install 'kpca-vision-cls\[dali\]'"):
        ImageNetDataModule(root=str(tree), train=TrainData(input="dali"))


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2], ids=["one_process", "ddp_2_processes"])
def test_fit_through_the_console_script_on_cpu(tree: Path, tmp_path: Path, devices: int):
    """``vision-cls fit --data.train.input dali`` on CPU trainers: two epochs, each left after 3 of its 5 batches (one
    process; DeiT's repeated-augmentation sampler) or 2 of its 2 (two DDP processes, batch 8 over 2 ranks)."""
    steps = 3 if devices == 1 else 2
    command = [
        str(Path(sys.executable).parent / "vision-cls"), "fit", "-c", CPU, "-c", CONFIGS / "vision_cls" / "smoke.yaml",
        "--data.builtin=null", f"--data.root={tree}", "--data.train.input=dali", f"--data.batch_size={4 * devices}",
        "--data.num_workers=1", f"--trainer.devices={devices}", "--trainer.max_epochs=2",
        f"--trainer.limit_train_batches={steps}", "--trainer.limit_val_batches=2",
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false", *(["--trainer.strategy=ddp"] if devices > 1 else []),
    ]  # fmt: skip
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Training input: DALI on CPU operators" in done.stderr + done.stdout
    (last,) = tmp_path.glob("runs/**/last.ckpt")
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 2 * steps and checkpoint["epoch"] == 1


@pytest.mark.gpu
def test_gpu_pipeline_decodes_with_nvjpeg(tree: Path):
    """Device ``mixed`` (nvJPEG) and GPU operators: the same shapes, labels and (near) pixels as the CPU path."""
    pytest.importorskip("nvidia.dali", reason="not available: NVIDIA DALI is not installed (kpca-vision-cls[dali])")
    samples = image_folder_samples(tree / "train", CLASSES)
    device = torch.device("cuda", 0)
    exact = loader(samples, single_rank(samples), recipe(224, (1.0, 1.0), 0.0, None), device=device)
    batches = epoch(exact, 0)
    images, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    assert images.device.type == "cuda" and images.dtype == torch.uint8 and images.shape == (20, 3, 224, 224)
    assert labels.tolist() == [label for _, label in exact.epoch_samples()]
    differences = mean_differences(images.cpu(), [path for path, _ in exact.epoch_samples()])
    assert np.mean(differences < 1.5) >= 0.9 and differences.max() < 4, differences  # nvJPEG's IDCT is not PIL's
    deit = loader(samples, single_rank(samples), recipe(224), batch_size=7, device=device)
    shapes = [(tuple(images.shape), images.device.type) for images, _ in epoch(deit, 0)]
    assert shapes == [((7, 3, 224, 224), "cuda")] * 3
    assert math.isfinite(torch.cat([images for images, _ in epoch(deit, 1)]).float().mean().item())
