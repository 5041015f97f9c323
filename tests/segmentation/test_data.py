"""The mmseg ADE20K pipeline on generated folders, the synthetic set, corruptions and the datamodule's errors."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from kpca.segmentation.builtin_data import SyntheticADE20K, render, write_synthetic_ade20k
from kpca.segmentation.data import (
    ADE20KDataModule,
    CorruptImage,
    MMSegDataset,
    SegmentationData,
    build_transforms,
    eval_pipeline,
    train_pipeline,
)
from kpca.segmentation.eval_data import EvalData
from kpca.training.data import require_datamodule

pytestmark = pytest.mark.mmseg


def write_ade_folder(root: Path, size: tuple[int, int] = (40, 60), grey: int | None = None) -> Path:
    """An ADE20K tree of 2 images per split whose labels hold 0 (other) and a few classes up to 150.

    The images are random, or of the uniform ``grey`` level when given. The labels are blocks: classes 1 and 150 in
    the left and middle thirds, 7 in the upper half of the right third, 0 below it.
    """
    rng = np.random.default_rng(0)
    for split in ("training", "validation"):
        (root / "images" / split).mkdir(parents=True)
        (root / "annotations" / split).mkdir(parents=True)
        for i in range(2):
            pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8) if grey is None else np.full((*size, 3), grey)
            Image.fromarray(pixels.astype(np.uint8)).save(root / "images" / split / f"{i}.jpg")
            label = np.zeros(size, dtype=np.uint8)
            label[:, : size[1] // 3] = 1
            label[:, size[1] // 3 : 2 * size[1] // 3] = 150
            label[: size[0] // 2, 2 * size[1] // 3 :] = 7  # the lower right stays 0
            Image.fromarray(label).save(root / "annotations" / split / f"{i}.png")
    return root


def test_eval_pipeline_shifts_labels_ignores_other_and_keeps_the_original_size(tmp_path: Path):
    root = write_ade_folder(tmp_path / "ade")
    dataset = MMSegDataset(root, "val", build_transforms(eval_pipeline(scale=(160, 80))))
    image, label, name = dataset[0]
    assert len(dataset) == 2 and name == "0"
    assert image.shape == (3, 80, 120) and image.dtype == torch.uint8  # resized, ratio kept (short side 80)
    assert label.shape == (40, 60)  # annotation at the original size
    assert label[0, 0] == 0 and label[0, 25] == 149 and label[0, 50] == 6  # k -> k - 1
    assert label[-1, -1] == 255  # 0 (other) -> ignored
    raw = np.asarray(Image.open(root / "images" / "validation" / "0.jpg"))  # RGB
    resized = np.asarray(Image.fromarray(raw).resize((120, 80), Image.Resampling.BILINEAR)).astype(float)
    assert np.abs(image.permute(1, 2, 0).numpy() - resized).mean() < 10  # RGB order (mmcv loads BGR)


def test_train_pipeline_crops_and_batches_are_padded_with_ignored_labels(tmp_path: Path):
    root = write_ade_folder(tmp_path / "ade")
    datamodule = ADE20KDataModule(root=root, batch_size=2, num_workers=0, crop_size=48, scale=(120, 40))
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["images"].shape == (2, 3, 48, 48) and batch["images"].dtype == torch.float32
    assert batch["labels"].shape == (2, 48, 48) and batch["labels"].dtype == torch.int64
    assert batch["images"].min() >= 0 and batch["images"].max() <= 1
    assert set(batch["labels"].unique().tolist()) <= {0, 6, 149, 255}


def test_crops_smaller_than_the_crop_size_are_padded_bottom_right_with_0_and_ignored_labels(tmp_path: Path):
    root = write_ade_folder(tmp_path / "ade", grey=200)
    datamodule = ADE20KDataModule(
        root=root, batch_size=2, num_workers=0, crop_size=48, scale=(30, 20), ratio_range=(1.0, 1.0)
    )  # 40 x 60 images become 20 x 30 (keep ratio, factor 0.5), smaller than the 48 px crop in both sides
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    images, labels = batch["images"], batch["labels"]  # (2, 3, 48, 48), (2, 48, 48)
    expected = torch.full((20, 30), 255)  # the label blocks at half size, after reduce_zero_label
    expected[:, :10], expected[:, 10:20], expected[:10, 20:] = 0, 149, 6
    for image, label in zip(images, labels, strict=True):
        assert (label[20:] == 255).all() and (label[:, 30:] == 255).all()  # padded rows and columns: ignored
        assert (image[:, 20:] == 0).all() and (image[:, :, 30:] == 0).all()  # padded pixels: 0 (mmseg's pad_val)
        assert torch.equal(label[:20, :30], expected) or torch.equal(label[:20, :30], expected.flip(-1))  # flip
        crop = image[:, :20, :30]  # a uniform grey, photometrically distorted: one non-zero value per channel
        assert (crop == crop[:, :1, :1]).all() and (crop > 0).all()


def test_train_pipeline_is_mmsegs_ade20k_recipe():
    steps = [step["type"] for step in train_pipeline()]
    assert steps == [
        "LoadImageFromFile", "LoadAnnotations", "RandomResize", "RandomCrop", "RandomFlip", "PhotoMetricDistortion",
        "PackSegInputs",
    ]  # fmt: skip
    assert train_pipeline()[2]["scale"] == (2048, 512) and train_pipeline()[3]["cat_max_ratio"] == 0.75


def test_corruption_is_reproducible_and_changes_the_image(tmp_path: Path):
    root = write_ade_folder(tmp_path / "ade")
    steps = build_transforms(eval_pipeline(scale=(60, 40)))
    clean = MMSegDataset(root, "val", steps)[1][0]
    corrupted = [MMSegDataset(root, "val", [steps[0], CorruptImage("gaussian_noise", 3), *steps[1:]])[1][0]]
    corrupted.append(MMSegDataset(root, "val", [steps[0], CorruptImage("gaussian_noise", 3), *steps[1:]])[1][0])
    assert torch.equal(corrupted[0], corrupted[1]) and not torch.equal(corrupted[0], clean)
    with pytest.raises(ValueError, match="Unknown corruption"):
        CorruptImage("rain", 1)


def test_synthetic_set_is_deterministic_in_the_ade_layout_and_written_once(tmp_path: Path):
    params = SyntheticADE20K(num_train=3, num_val=2, image_size=32)
    root = write_synthetic_ade20k(tmp_path, params)
    assert root.name == params.folder_name
    assert len(list((root / "images" / "training").glob("*.jpg"))) == 3
    assert len(list((root / "annotations" / "validation").glob("*.png"))) == 2
    image, label = render(params, 1, "training")
    assert image.shape == (32, 32, 3) and label.dtype == np.uint8 and label.max() <= 8
    np.testing.assert_array_equal(label, np.asarray(Image.open(root / "annotations/training/ADE_train_00000001.png")))
    np.testing.assert_array_equal(render(params, 1, "training")[1], label)
    stamp = (root / "images" / "training" / "ADE_train_00000000.jpg").stat().st_mtime_ns
    assert write_synthetic_ade20k(tmp_path, params) == root
    assert (root / "images" / "training" / "ADE_train_00000000.jpg").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="image_size must be >= 32"):
        SyntheticADE20K(image_size=16)


def test_missing_or_ambiguous_roots_name_the_expected_layout(tmp_path: Path):
    with pytest.raises(ValueError, match="exactly one of data.root"):
        ADE20KDataModule()
    with pytest.raises(FileNotFoundError, match=r"images/\{training,validation\}/\*\.jpg"):
        ADE20KDataModule(root=tmp_path).prepare_data()


def test_eval_sets_are_clean_then_each_corruption_and_severity(tmp_path: Path):
    datamodule = ADE20KDataModule(root=tmp_path, eval=EvalData(corruptions=("fog", "contrast"), severities=(1, 5)))
    names = [name for name, _, _ in datamodule.eval_sets]
    assert names == ["clean", "fog/s1", "fog/s5", "contrast/s1", "contrast/s5"]
    assert datamodule.num_classes == 150 and len(datamodule.palette) == 150
    assert require_datamodule(SimpleNamespace(datamodule=datamodule), SegmentationData) is datamodule
    with pytest.raises(ValueError, match="severities"):
        EvalData(severities=(6,))
