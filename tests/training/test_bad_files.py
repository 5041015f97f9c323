"""NamedFileErrors on real JPEG folders: errors name the file, skip mode replaces, logs once, counts and stops."""

import logging
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image, ImageFile
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms
from torchvision.datasets import ImageFolder

from kpca.training.data_checks.bad_files import (
    BAD_FILES_METRIC,
    EVALUATION_FIX,
    TRAINING_FIX,
    BadFilesMonitor,
    NamedFileErrors,
    check_bad_files_options,
)
from kpca.training.data_checks.problems import DataError, DataProblem
from kpca.training.images.decoding import strict_image_decoding

NO_WORKERS = pytest.mark.filterwarnings("ignore:The 'train_dataloader' does not have many workers")


def write_jpegs(root: Path, count: int, damaged: tuple[int, ...] = ()) -> list[str]:
    """``count`` 32x32 JPEGs in ``root/a/``, sorted by index; those in ``damaged`` cut to 3/4 of their bytes.

    The cut lands in the compressed pixels: PIL opens the file and fails while decoding it, as with a copy that
    stopped early.
    """
    rng = np.random.default_rng(0)
    (root / "a").mkdir(parents=True)
    paths = []
    for i in range(count):
        path = root / "a" / f"{i:03d}.jpg"
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path, quality=95)
        if i in damaged:
            path.write_bytes(path.read_bytes()[: path.stat().st_size * 3 // 4])
        paths.append(str(path))
    return paths


class SamplePath:
    """``path_of`` of an ImageFolder; a module-level class, so that spawned workers can unpickle it."""

    def __init__(self, dataset: ImageFolder) -> None:
        self.dataset = dataset

    def __call__(self, index: int) -> str:
        return self.dataset.samples[index][0]


def named(root: Path, split: str = "train", **options) -> NamedFileErrors:
    """The ImageFolder of ``root`` (uint8 tensors) with named errors."""
    dataset = ImageFolder(str(root), transform=transforms.PILToTensor())
    return NamedFileErrors(dataset, SamplePath(dataset), split, **options)


class Raises(Dataset):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int):
        raise self.error


def test_error_mode_names_the_file_the_split_the_cause_and_the_fix(tmp_path: Path):
    paths = write_jpegs(tmp_path, 4, damaged=(2,))
    dataset = named(tmp_path)
    assert dataset[1][0].shape == (3, 32, 32)
    with pytest.raises(DataError) as caught:
        dataset[2]
    (problem,) = caught.value.problems
    assert (problem.path, problem.split, problem.fix) == (paths[2], "train", TRAINING_FIX)
    assert problem.problem.startswith("cannot be read: OSError: ") and "truncated" in problem.problem.lower()
    assert str(caught.value).startswith(f"{paths[2]} (train): cannot be read: OSError:")
    assert "data.bad_files=skip" in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)


def test_a_data_error_of_the_dataset_itself_passes_through_unchanged():
    error = DataError(DataProblem("/data/a.png", "val", "is 3x4 but its image /data/a.jpg is 4x3", "Fix it."))
    with pytest.raises(DataError) as caught:
        NamedFileErrors(Raises(error), str, "val")[0]
    assert caught.value is error


def test_evaluation_sets_never_skip_and_say_so(tmp_path: Path):
    write_jpegs(tmp_path, 2, damaged=(0,))
    with pytest.raises(ValueError, match=r"val is an evaluation set, which never skips files; got mode='skip'"):
        named(tmp_path, "val", mode="skip", evaluation=True)
    with pytest.raises(DataError) as caught:
        named(tmp_path, "val", evaluation=True)[0]
    assert caught.value.problems[0].fix == EVALUATION_FIX


def test_iteration_stops_at_the_end_and_negative_indices_count_from_it(tmp_path: Path):
    write_jpegs(tmp_path, 3)
    dataset = named(tmp_path)
    assert len(list(dataset)) == 3
    assert torch.equal(dataset[-1][0], dataset[2][0])
    assert dataset.classes == ["a"] and len(dataset.samples) == 3  # the wrapped dataset's attributes


def test_skip_mode_returns_the_next_readable_item_and_warns_once_per_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    paths = write_jpegs(tmp_path, 6, damaged=(1, 2))
    dataset = named(tmp_path, mode="skip", max_bad_fraction=0.5)
    with caplog.at_level(logging.WARNING, logger="kpca.training.data_checks.bad_files"):
        for _ in range(2):  # two epochs
            items = [dataset[i] for i in range(len(dataset))]
    assert torch.equal(items[1][0], dataset.dataset[3][0]) and torch.equal(items[2][0], items[3][0])
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2
    for path, warning in zip(paths[1:3], warnings, strict=True):
        assert f"skipping a damaged file: {path} (train): cannot be read: OSError:" in warning
    assert dataset.bad_count == 2 and dataset.bad_paths() == paths[1:3]


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_the_main_process_counts_what_the_workers_skipped(tmp_path: Path, context: str):
    paths = write_jpegs(tmp_path, 8, damaged=(1, 5))
    dataset = named(tmp_path, mode="skip", max_bad_fraction=0.25)
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2 if context == "fork" else 1, multiprocessing_context=context
    )
    for _ in range(2):
        assert sum(len(labels) for _, labels in loader) == 8
    assert dataset.bad_count == 2 and dataset.bad_paths() == [paths[1], paths[5]]


def test_past_max_bad_fraction_the_run_stops_naming_every_damaged_file(tmp_path: Path):
    paths = write_jpegs(tmp_path, 10, damaged=(2, 4, 6))
    dataset = named(tmp_path, mode="skip", max_bad_fraction=0.2)
    assert dataset.max_bad_files == 2
    dataset[2], dataset[4]  # two are tolerated
    with pytest.raises(DataError) as caught:
        dataset[6]
    message = str(caught.value)
    assert message.startswith(
        f"{paths[6]} (train): 3 of the 10 files of train are damaged, more than data.max_bad_fraction=0.2 allows (2)"
    )
    assert "raise data.max_bad_fraction" in message and "check-data" in message
    assert [problem.path for problem in caught.value.problems] == [paths[6], paths[2], paths[4]]


@pytest.mark.parametrize(
    ("bad_files", "fraction", "match"),
    [
        ("ignore", 0.1, r"data.bad_files='ignore' is not one of 'error', 'skip'; 'error' stops .*; 'skip' trains"),
        ("skip", 1.5, r"max_bad_fraction=1.5"),
    ],
)
def test_options_are_checked(bad_files: str, fraction: float, match: str):
    with pytest.raises(ValueError, match=match):
        check_bad_files_options(bad_files, fraction)


def test_strict_image_decoding_fails_a_truncated_file_even_when_a_library_allows_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (path,) = write_jpegs(tmp_path, 1, damaged=(0,))
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(OSError, match="(?i)truncated"), strict_image_decoding(), Image.open(path) as image:
        image.load()
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True
    with Image.open(path) as image:
        image.load()  # padded silently: what strict decoding prevents


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3 * 32 * 32, 1)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return nn.functional.mse_loss(self.head(images.flatten(1).float() / 255).squeeze(1), labels.float())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@NO_WORKERS
def test_the_monitor_logs_the_count_to_tensorboard(tmp_path: Path):
    write_jpegs(tmp_path / "data", 8, damaged=(3, 6))
    dataset = named(tmp_path / "data", mode="skip", max_bad_fraction=0.25)
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=2, logger=TensorBoardLogger(tmp_path / "runs"), log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[BadFilesMonitor()],
    )  # fmt: skip
    trainer.fit(Classifier(), DataLoader(dataset, batch_size=4))
    events = EventAccumulator(trainer.log_dir)
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars(BAD_FILES_METRIC)] == [(1, 2.0), (3, 2.0)]
    assert trainer.callback_metrics[BAD_FILES_METRIC] == 2
