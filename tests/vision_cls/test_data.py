"""ImageNetDataModule, its samplers and transforms, on generated ImageFolder trees and the built-in digits."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data.distributed_sampler import RepeatAugSampler as TimmRepeatAugSampler
from torch.utils.data import DistributedSampler
from torchvision import transforms

from kpca.training.data import require_datamodule
from kpca.vision_cls.builtin_data import write_digits_imagefolder
from kpca.vision_cls.corrupted import CorruptedDataset
from kpca.vision_cls.data import ImageNetDataModule, VisionData
from kpca.vision_cls.eval_data import EvalData, EvalSet
from kpca.vision_cls.input import TrainData
from kpca.vision_cls.input.samplers import RepeatAugSampler
from kpca.vision_cls.input.workers.random_erasing import PixelSpaceRandomErasing

A_WNIDS = ["n01770081", "n01784675"]  # in the ImageNet-A and the ImageNet-O class lists
R_WNID = "n01784675"  # in the ImageNet-R class list too (n01770081 is not)
NOT_A_WNID = "n01440764"  # tench: in none of A, R and O
WNIDS = sorted([NOT_A_WNID, *A_WNIDS])
FAST = {"num_workers": 0, "pin_memory": False, "image_size": 32, "batch_size": 4}


def make_tree(root: Path, classes: list[str], per_class: int = 2, size: tuple[int, int] = (40, 48)) -> Path:
    """Random JPEGs in root/<class>/<i>.JPEG."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.JPEG")
    return root


@pytest.fixture
def imagenet(tmp_path: Path) -> Path:
    root = tmp_path / "imagenet"
    make_tree(root / "train", WNIDS)
    make_tree(root / "val", WNIDS)
    return root


@pytest.fixture(scope="module")
def digits_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    write_digits_imagefolder(cache / "digits-32px", image_size=32)
    return cache


def test_digits_tree_counts_classes_and_sizes(digits_cache: Path):
    root = digits_cache / "digits-32px"
    counts = {
        split: {c: len(list((root / split / c).glob("*.png"))) for c in map(str, range(10))}
        for split in ("train", "val")
    }
    assert sum(counts["train"].values()) + sum(counts["val"].values()) == 1797
    assert sum(counts["val"].values()) == 360  # 20 %, stratified
    assert all(n >= 14 for n in counts["val"].values())
    with Image.open(next((root / "val" / "3").glob("*.png"))) as image:
        assert image.size == (32, 32) and image.mode == "RGB"
    assert [p.name for p in digits_cache.iterdir()] == ["digits-32px"]  # no temporary folder left behind


def test_digits_tree_is_written_once(digits_cache: Path, tmp_path: Path):
    root = digits_cache / "digits-32px"
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*.png")}
    assert write_digits_imagefolder(root, image_size=32) == root
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.png")} == before
    (tmp_path / "half").mkdir()
    with pytest.raises(ValueError, match="not a complete digits tree"):
        write_digits_imagefolder(tmp_path / "half")


def test_digits_datamodule_batches(digits_cache: Path):
    dm = ImageNetDataModule(
        builtin="digits", cache_dir=str(digits_cache), **{**FAST, "batch_size": 16}, train=TrainData(re_prob=0.0)
    )
    assert dm.num_classes == 10
    dm.prepare_data()
    dm.setup("fit")
    train = dm.train_dataloader()
    assert isinstance(train.sampler, RepeatAugSampler)
    assert len(train) == 1437 // 256 * 256 // 16  # DeiT's epoch: rounded to 256 samples, repeats included
    raw, labels = next(iter(train))
    assert raw.shape == (16, 3, 32, 32) and raw.dtype == torch.uint8  # augment_on=device: finished after transfer
    images = dm.train_input.device_tail(raw)
    assert images.dtype == torch.float32 and torch.equal(images, raw.float() / 255)
    assert labels.dtype == torch.int64 and labels.min() >= 0 and labels.max() <= 9
    assert images.min() >= 0.0 and images.max() <= 1.0
    images, _ = next(iter(dm.val_dataloader()))
    assert images.shape == (16, 3, 32, 32) and images.min() >= 0.0 and images.max() <= 1.0 and images.max() > 0.5


def test_imagenet_tree_batches_and_classes(imagenet: Path):
    dm = ImageNetDataModule(root=str(imagenet), **FAST, train=TrainData(re_prob=0.0, repeated_aug=1))
    assert dm.classes == WNIDS and dm.num_classes == 3
    assert dm.mean == pytest.approx((0.485, 0.456, 0.406)) and dm.std == pytest.approx((0.229, 0.224, 0.225))
    dm.prepare_data()
    dm.setup("fit")
    raw, labels = next(iter(dm.train_dataloader()))
    images = dm.train_input.device_tail(raw)
    assert images.shape == (4, 3, 32, 32) and images.min() >= 0.0 and images.max() <= 1.0
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (4, 3, 32, 32) and labels.tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("kwargs", [{}, {"root": "x", "builtin": "digits"}])
def test_root_xor_builtin(kwargs: dict):
    with pytest.raises(ValueError, match="exactly one of data.root and data.builtin"):
        ImageNetDataModule(**kwargs)


def test_layout_errors_name_the_path_and_layout(tmp_path: Path, imagenet: Path):
    with pytest.raises(FileNotFoundError, match=r"missing/train is not a directory.*root/train/<class>/\*\.JPEG"):
        ImageNetDataModule(root=str(tmp_path / "missing")).prepare_data()
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"empty/train has no class sub-folders.*root/val/<class>/\*"):
        _ = ImageNetDataModule(root=str(tmp_path / "empty")).num_classes
    (imagenet / "val" / "n09999999").mkdir()
    with pytest.raises(ValueError, match=r"only in val: \['n09999999'\]"):
        ImageNetDataModule(root=str(imagenet)).prepare_data()


def test_setup_splits_the_global_batch(imagenet: Path):
    dm = ImageNetDataModule(root=str(imagenet), **{**FAST, "batch_size": 6})
    dm.trainer = SimpleNamespace(world_size=2, global_rank=1)
    dm.setup("validate")
    assert dm.batch_size_per_device == 3
    dm.trainer = SimpleNamespace(world_size=4, global_rank=1)
    with pytest.raises(ValueError, match="batch_size=6 .* world_size=4"):
        dm.setup("validate")


def test_invalid_arguments():
    with pytest.raises(ValueError, match="Unknown corruption.*'gausian_noise'"):
        ImageNetDataModule(builtin="digits", eval=EvalData(corruptions=("gausian_noise",)))
    with pytest.raises(ValueError, match=r"Severities \[6\]"):
        ImageNetDataModule(builtin="digits", eval=EvalData(severities=(6,)))
    with pytest.raises(ValueError, match="data.train.repeated_aug=0"):
        ImageNetDataModule(builtin="digits", train=TrainData(repeated_aug=0))
    with pytest.raises(ValueError, match=r"data.builtin='cifar' is not one of 'digits'; choose it, or set data.root"):
        ImageNetDataModule(builtin="cifar")
    with pytest.raises(ValueError, match=r"data.train.re_mode='zero' is not one of 'pixel', 'rand', 'const'"):
        ImageNetDataModule(builtin="digits", train=TrainData(re_mode="zero"))
    with pytest.raises(ValueError, match=r"data.interpolation='lanczos' is not one of 'bicubic', 'bilinear', 'near"):
        ImageNetDataModule(builtin="digits", interpolation="lanczos")


def epoch_indices(sampler_cls: type, n: int, replicas: int, epoch: int = 0, **kwargs) -> list[list[int]]:
    ranks = []
    for rank in range(replicas):
        sampler = sampler_cls(range(n), num_replicas=replicas, rank=rank, **kwargs)
        sampler.set_epoch(epoch)
        ranks.append(list(sampler))
        assert len(ranks[-1]) == len(sampler)
    return ranks


def test_repeat_aug_sampler_deals_repeats_over_ranks():
    ranks = epoch_indices(RepeatAugSampler, 10, replicas=2, num_repeats=3)
    assert [len(r) for r in ranks] == [5, 5]  # ceil(10 / 2): an epoch keeps the plain length
    dealt = [i for pair in zip(*ranks, strict=True) for i in pair]  # undo the round-robin deal
    generator = torch.Generator().manual_seed(0)
    assert dealt == torch.repeat_interleave(torch.randperm(10, generator=generator), 3)[:10].tolist()
    counts = np.bincount(dealt, minlength=10)
    assert sorted(counts[counts > 0])[1:] == [3, 3, 3]  # every selected image 3 times, but the one cut at the end
    three = epoch_indices(RepeatAugSampler, 300, replicas=3, num_repeats=3, selected_round=0)
    assert all(len({*r}) == 100 for r in three) and set(three[0]) == set(three[1]) == set(three[2])


def test_repeat_aug_sampler_epochs_seeds_and_timm():
    assert epoch_indices(RepeatAugSampler, 50, 2, epoch=1) == epoch_indices(RepeatAugSampler, 50, 2, epoch=1)
    assert epoch_indices(RepeatAugSampler, 50, 2, epoch=1) != epoch_indices(RepeatAugSampler, 50, 2, epoch=2)
    assert epoch_indices(RepeatAugSampler, 50, 2, seed=1) != epoch_indices(RepeatAugSampler, 50, 2, seed=2)
    for n in (50, 1000):
        ours = epoch_indices(RepeatAugSampler, n, 2, epoch=3)
        assert ours == epoch_indices(TimmRepeatAugSampler, n, 2, epoch=3)
    assert len(ours[0]) == 1000 // 256 * 256 // 2
    sampler = RepeatAugSampler(range(7))
    assert isinstance(sampler, DistributedSampler)  # so Lightning keeps it instead of wrapping it
    assert (sampler.num_replicas, sampler.rank) == (1, 0)  # torch.distributed not initialised
    assert list(RepeatAugSampler(range(4), shuffle=False, num_repeats=2)) == [0, 0, 1, 1]


def test_pixel_space_random_erasing_fill():
    torch.manual_seed(0)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    image = torch.full((3, 96, 96), 0.5)
    erased = PixelSpaceRandomErasing(1.0, mean, std)(image.clone())
    changed = erased != image  # (3, H, W)
    assert changed.any() and torch.equal(changed[0], changed[1])
    z = (erased - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    z = z[changed]
    assert abs(z.mean().item()) < 0.1 and 0.9 < z.std().item() < 1.1  # N(0, 1) in normalised space, unclipped
    assert erased.min() < 0.0 or erased.max() > 1.0
    assert torch.equal(PixelSpaceRandomErasing(0.0, mean, std)(image.clone()), image)


def test_train_transform_is_deit(imagenet: Path):
    text = repr(ImageNetDataModule(root=str(imagenet), train=TrainData(augment_on="workers")).train_input.transform())
    assert "RandomResizedCropAndInterpolation" in text and "RandAugment" in text and "bicubic" in text
    assert "ColorJitter" not in text and "Normalize" not in text and "PixelSpaceRandomErasing" in text
    data = ImageNetDataModule(root=str(imagenet))  # augment_on=device: erasing moves to the device tail
    assert "pil_to_chw" in repr(data.train_input.transform()) and "Erasing" not in repr(data.train_input.transform())
    assert "BatchRandomErasing(p=0.25, mode=pixel)" in repr(data.train_input.device_tail)
    no_policy = ImageNetDataModule(root=str(imagenet), train=TrainData(auto_augment=None, re_prob=0.0))
    text = repr(no_policy.train_input.transform())
    assert "ColorJitter" in text and "RandomErasing" not in text


@pytest.mark.parametrize("corruption", ["gaussian_noise", "impulse_noise"])
def test_corrupted_dataset_is_deterministic(corruption: str):
    rng = np.random.default_rng(0)
    base = [(Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)), k) for k in range(2)]
    dataset = CorruptedDataset(base, corruption, severity=3)
    np.random.seed(1)
    first, label = dataset[1]
    state = np.random.get_state()
    np.random.seed(2)
    again, _ = dataset[1]
    np.random.set_state(state)
    assert label == 1 and first.shape == (3, 32, 32) and first.dtype == torch.float32
    assert torch.equal(first, again)
    assert not torch.equal(first, dataset[0][0])
    assert not torch.equal(first, CorruptedDataset(base, corruption, severity=4)[1][0])
    np.random.seed(3)
    expected = np.random.rand()
    np.random.seed(3)
    _ = dataset[0]
    assert np.random.rand() == expected  # the global NumPy RNG is left as it was


@pytest.fixture
def robustness(tmp_path: Path, imagenet: Path) -> dict[str, str]:
    for corruption in ("fog", "gaussian_noise"):
        for severity in (1, 2):
            make_tree(tmp_path / "c" / corruption / str(severity), WNIDS, per_class=1)
    make_tree(tmp_path / "a", A_WNIDS, per_class=1)
    make_tree(tmp_path / "r", [R_WNID], per_class=2)
    make_tree(tmp_path / "o", A_WNIDS, per_class=1)
    return {"root": str(imagenet), **{f"imagenet_{k}": str(tmp_path / k) for k in "caro"}}


def test_eval_sets_order_and_loaders(robustness: dict[str, str]):
    roots = {key: path for key, path in robustness.items() if key != "root"}
    eval_data = EvalData(**roots, corruptions=("speckle_noise",), severities=(1, 2))
    dm = ImageNetDataModule(root=robustness["root"], eval=eval_data, **FAST)
    assert [s.name for s in dm.eval_sets] == [
        "clean",
        "corrupted/speckle_noise/1",
        "corrupted/speckle_noise/2",
        "imagenet_c/gaussian_noise/1",  # ImageNet-C's order, not the folders' alphabetical order
        "imagenet_c/gaussian_noise/2",
        "imagenet_c/fog/1",
        "imagenet_c/fog/2",
        "imagenet_a",
        "imagenet_r",
        "imagenet_o",
        "imagenet_o_in",
    ]
    assert dm.eval_sets[3] == EvalSet("imagenet_c/gaussian_noise/1", "imagenet_c", "gaussian_noise", 1)
    dm.prepare_data()
    dm.setup("test")
    loaders = dm.test_dataloader()
    labels = {}
    for eval_set, loader in zip(dm.eval_sets, loaders, strict=True):
        batches = list(loader)
        images = torch.cat([b[0] for b in batches])
        assert images.shape[1:] == (3, 32, 32) and images.min() >= 0.0 and images.max() <= 1.0
        labels[eval_set.name] = torch.cat([b[1] for b in batches]).tolist()
    assert labels["clean"] == [0, 0, 1, 1, 2, 2]
    assert labels["imagenet_c/fog/2"] == [0, 1, 2]
    assert labels["imagenet_a"] == [0, 1] and labels["imagenet_r"] == [0, 0]
    assert labels["imagenet_o"] == [-1, -1]
    assert labels["imagenet_o_in"] == [0, 0, 1, 1]  # only the val images of the ImageNet-O wnids
    o_in = dm.test_sets[-1]
    assert {Path(path).parent.name for path, _ in o_in.samples} == set(A_WNIDS)
    by_kind = {s.kind: dm.class_indices(s) for s in dm.eval_sets}
    assert by_kind["clean"] is None and by_kind["imagenet_a"] == by_kind["imagenet_o_in"] == [1, 2]  # A and O wnids
    assert by_kind["imagenet_r"] == [2]
    assert require_datamodule(SimpleNamespace(datamodule=dm), VisionData) is dm


@pytest.mark.parametrize(("kind", "folders"), [("a", [NOT_A_WNID]), ("r", A_WNIDS), ("o", [NOT_A_WNID, A_WNIDS[0]])])
def test_a_robustness_root_of_another_set_is_refused(tmp_path: Path, imagenet: Path, kind: str, folders: list[str]):
    make_tree(tmp_path / kind, folders, per_class=1)
    dm = ImageNetDataModule(root=str(imagenet), eval=EvalData(**{f"imagenet_{kind}": str(tmp_path / kind)}), **FAST)
    with pytest.raises(
        ValueError, match=rf"class folders that are not imagenet_{kind} wnids .*point data\..*imagenet_{kind}"
    ):
        dm.prepare_data()


def test_eval_subset_spreads_over_classes(robustness: dict[str, str]):
    dm = ImageNetDataModule(root=robustness["root"], **FAST, eval=EvalData(subset=3))
    dm.setup("test")
    assert [label for _, label in dm.test_sets[0]] == [0, 1, 2]


def test_imagenet_c_layout_errors(tmp_path: Path, imagenet: Path):
    make_tree(tmp_path / "c" / "fog" / "1", WNIDS, per_class=1)
    dm = ImageNetDataModule(root=str(imagenet), eval=EvalData(imagenet_c=str(tmp_path / "c"), severities=(1, 2)))
    with pytest.raises(FileNotFoundError, match=r"fog/2 is not a directory.*<corruption>/<severity>/<wnid>"):
        dm.prepare_data()
    (tmp_path / "c" / "fogg").mkdir()
    with pytest.raises(ValueError, match=r"folders \['fogg'\] that are not corruption names"):
        _ = dm.eval_sets


def test_imagenet_c_images_are_only_center_cropped_as_in_the_benchmark(tmp_path: Path, imagenet: Path):
    """Released ImageNet-C files are 224x224: Hendrycks' test.py and the authors' eval_OOD.py only CenterCrop(224)."""
    folder = tmp_path / "c" / "fog" / "3"
    make_tree(folder, WNIDS[:2], per_class=1, size=(224, 224))
    rng = np.random.default_rng(1)
    (folder / WNIDS[2]).mkdir()
    Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(folder / WNIDS[2] / "0.png")
    dm = ImageNetDataModule(
        root=str(imagenet),
        eval=EvalData(imagenet_c=str(tmp_path / "c"), severities=(3,)),
        **{**FAST, "image_size": 224},
    )
    dm.setup("test")
    dataset = dm.test_sets[dm.eval_sets.index(EvalSet("imagenet_c/fog/3", "imagenet_c", "fog", 3))]
    assert len(dataset) == 3
    for (path, label), (image, loaded_label) in zip(dataset.samples, dataset, strict=True):
        with Image.open(path) as file:
            assert torch.equal(image, transforms.ToTensor()(file.convert("RGB"))), path
        assert loaded_label == label


def test_imagenet_c_images_larger_than_image_size_are_center_cropped_and_smaller_ones_refused(
    tmp_path: Path, imagenet: Path
):
    make_tree(tmp_path / "c" / "fog" / "1", WNIDS, per_class=1, size=(40, 48))  # (H, W)
    imagenet_c = EvalData(imagenet_c=str(tmp_path / "c"), severities=(1,))
    dm = ImageNetDataModule(root=str(imagenet), eval=imagenet_c, **FAST)
    dm.setup("test")
    dataset = dm.test_sets[-1]
    path, _ = dataset.samples[0]
    with Image.open(path) as file:
        expected = transforms.ToTensor()(file.convert("RGB"))[:, 4:36, 8:40]  # the centre 32 x 32
    assert torch.equal(dataset[0][0], expected)
    small = ImageNetDataModule(root=str(imagenet), eval=imagenet_c, **{**FAST, "image_size": 44})
    small.setup("test")
    with pytest.raises(ValueError, match=r"fog/1 holds a 48x40 image, smaller than data.image_size=44.* at most 40"):
        small.test_sets[-1][0]


def test_on_the_fly_corruptions_run_after_the_eval_resize_and_crop(imagenet: Path):
    dm = ImageNetDataModule(
        root=str(imagenet), **FAST, crop_pct=0.875, eval=EvalData(corruptions=("gaussian_noise",), severities=(3,))
    )
    dm.setup("test")
    corrupted = dm.test_sets[1]
    assert dm.eval_sets[1] == EvalSet("corrupted/gaussian_noise/3", "corrupted", "gaussian_noise", 3)
    cropped = []  # the validation images after Resize(36) and CenterCrop(32), as the clean set sees them
    for path, label in dm.test_sets[0].samples:
        with Image.open(path) as file:
            cropped.append((dm.eval_geometry()(file.convert("RGB")), label))
    expected = CorruptedDataset(cropped, "gaussian_noise", 3)
    for index in range(len(cropped)):
        image, label = corrupted[index]
        assert image.shape == (3, 32, 32) and label == cropped[index][1]
        assert torch.equal(image, expected[index][0])
