"""Damaged ADE20K pairs are named by file in training and evaluation, skipped on request, and listed by check_data."""

import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from kpca.segmentation.data import ADE20KDataModule
from kpca.training.data_checks.problems import DataError

pytestmark = pytest.mark.mmseg

SPLITS = {"train": "training", "val": "validation"}


def write_ade(root: Path, per_split: int = 4, size: tuple[int, int] = (40, 60)) -> Path:
    """An ADE20K tree of random JPEGs and label maps (values 0, 1, 7 and 150 on disk), ``per_split`` pairs per split."""
    rng = np.random.default_rng(0)
    for folder in SPLITS.values():
        (root / "images" / folder).mkdir(parents=True)
        (root / "annotations" / folder).mkdir(parents=True)
        for i in range(per_split):
            Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(image(root, folder, i), quality=95)
            label = np.zeros(size, dtype=np.uint8)  # (H, W): 0, "other", on the right
            label[:, : size[1] // 3], label[:, size[1] // 3 : size[1] // 2], label[:10, :5] = 1, 150, 7
            Image.fromarray(label).save(annotation(root, folder, i))
    return root


def image(root: Path, folder: str, i: int) -> Path:
    return root / "images" / folder / f"ADE_{i:03d}.jpg"


def annotation(root: Path, folder: str, i: int) -> Path:
    return root / "annotations" / folder / f"ADE_{i:03d}.png"


def truncate(path: Path) -> None:
    """Cut the file to 3/4 of its bytes, inside its compressed pixels (a copy that stopped early)."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 3 // 4])


def resave(path: Path, change) -> None:
    """Rewrite the label map at ``path`` as ``change(labels)``."""
    Image.fromarray(change(np.asarray(Image.open(path)).copy())).save(path)


def datamodule(root: Path, **options) -> ADE20KDataModule:
    data = ADE20KDataModule(root=root, batch_size=2, num_workers=0, crop_size=32, scale=(120, 40), **options)
    data.setup("fit")
    return data


def read_all(data: ADE20KDataModule, stage: str) -> int:
    """Iterate the loader of ``stage`` (``train`` or ``val``) to the end; the number of samples read."""
    loader = data.train_dataloader() if stage == "train" else data.val_dataloader()
    return sum(len(batch["labels"]) for batch in loader)


@pytest.mark.parametrize("stage", ["train", "val"])
def test_a_truncated_annotation_is_named_with_the_fix(tmp_path: Path, stage: str):
    root = write_ade(tmp_path / "ade")
    truncate(annotation(root, SPLITS[stage], 1))
    with pytest.raises(DataError) as caught:
        read_all(datamodule(root), stage)
    (problem,) = caught.value.problems
    assert problem.path == str(annotation(root, SPLITS[stage], 1)) and problem.split == stage
    assert problem.problem.startswith("annotation cannot be read: OSError: image file is truncated")
    assert ("data.bad_files=skip" in problem.fix) == (stage == "train") and "check-data" in problem.fix


def test_a_truncated_image_is_named(tmp_path: Path):
    root = write_ade(tmp_path / "ade")
    truncate(image(root, "training", 2))
    with pytest.raises(DataError, match=rf"^{image(root, 'training', 2)} \(train\): image cannot be read: "):
        read_all(datamodule(root), "train")


@pytest.mark.parametrize("stage", ["train", "val"])
def test_an_annotation_of_another_size_than_its_image_names_both(tmp_path: Path, stage: str):
    root = write_ade(tmp_path / "ade")
    resave(annotation(root, SPLITS[stage], 3), lambda labels: labels[:, :50])  # 40 x 50 beside a 40 x 60 image
    with pytest.raises(DataError) as caught:
        read_all(datamodule(root), stage)
    message = str(caught.value)
    assert message.startswith(
        f"{annotation(root, SPLITS[stage], 3)} ({stage}): is 50x40 (WxH) but its image "
        f"{image(root, SPLITS[stage], 3)} is 60x40"
    )


@pytest.mark.parametrize("stage", ["train", "val"])
def test_a_label_value_outside_the_classes_is_named_as_on_disk(tmp_path: Path, stage: str):
    root = write_ade(tmp_path / "ade")

    def paint(labels: np.ndarray) -> np.ndarray:
        labels[-5:, -5:] = 200
        return labels

    resave(annotation(root, SPLITS[stage], 0), paint)
    with pytest.raises(DataError) as caught:
        read_all(datamodule(root), stage)
    assert str(caught.value).startswith(
        f"{annotation(root, SPLITS[stage], 0)} ({stage}): holds label values [200] (as on disk) outside the valid "
        "0 (other, ignored), 1..150 (the classes) and 255 (ignored)"
    )


def test_skip_mode_trains_on_the_other_pairs_and_counts_the_damaged_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    root = write_ade(tmp_path / "ade", per_split=8)
    truncate(annotation(root, "training", 2))
    resave(annotation(root, "training", 5), lambda labels: labels[:30])
    data = datamodule(root, bad_files="skip", max_bad_fraction=0.25)
    with caplog.at_level(logging.WARNING, logger="kpca.training.data_checks.bad_files"):
        assert read_all(data, "train") == 8 and read_all(data, "train") == 8
    assert data.train_set.bad_count == 2
    warned = " ".join(record.getMessage() for record in caplog.records)
    assert [warned.count(str(annotation(root, "training", i))) for i in (2, 5)] == [1, 1]


def test_an_empty_annotation_folder_stops_setup(tmp_path: Path):
    root = write_ade(tmp_path / "ade")
    for path in (root / "annotations" / "validation").iterdir():
        path.unlink()
    with pytest.raises(DataError, match=r"annotations/validation \(val\): holds no \.png file"):
        datamodule(root)


def test_check_data_lists_every_problem_with_its_paths(tmp_path: Path):
    root = write_ade(tmp_path / "ade")
    truncate(image(root, "training", 0))
    truncate(annotation(root, "training", 1))
    resave(annotation(root, "validation", 2), lambda labels: labels[:20])
    resave(annotation(root, "validation", 3), lambda labels: np.where(labels == 7, 151, labels).astype(np.uint8))
    annotation(root, "validation", 0).unlink()
    Image.new("RGB", (60, 40)).save(annotation(root, "validation", 1))  # a colour image, not a label map
    data = ADE20KDataModule(root=root, num_workers=2)
    checked, problems = data.check_data(progress=False)
    assert checked == 16
    found = [(p.path, p.split, p.problem.split(":")[0]) for p in problems]
    val_images = [image(root, "validation", i) for i in range(4)]
    val_annotations = [str(annotation(root, "validation", i)) for i in range(4)]
    assert found == [
        (str(image(root, "training", 0)), "train", "image cannot be read"),
        (str(annotation(root, "training", 1)), "train", "annotation cannot be read"),
        (val_annotations[0], "val", f"is missing (the annotation of {val_images[0]})"),
        (val_annotations[1], "val", "is a mode RGB image; a label map is single-channel 8-bit (mode L or P)"),
        (val_annotations[2], "val", f"is 60x20 (WxH) but its image {val_images[2]} is 60x40"),
        (val_annotations[3], "val", "holds label values [151] (as on disk) outside the valid 0 (other, ignored), "
         "1..150 (the classes) and 255 (ignored)"),
    ]  # fmt: skip
    assert data.check_data(progress=False)[1] == problems


def test_check_data_names_a_missing_or_empty_split(tmp_path: Path):
    root = write_ade(tmp_path / "ade")
    for path in (root / "images" / "validation").iterdir():
        path.unlink()
    checked, problems = ADE20KDataModule(root=root, num_workers=0).check_data(progress=False)
    assert checked == 8
    assert [(p.path, p.split, p.problem) for p in problems] == [
        (str(root / "images" / "validation"), "val", "holds no .jpg file")
    ]
