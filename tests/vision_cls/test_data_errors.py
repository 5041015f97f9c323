"""Damaged ImageNet-style data is named by file: truncated JPEGs in fits, empty class folders, skip mode, check_data."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kpca.training.data_checks.bad_files import BAD_FILES_METRIC
from kpca.training.data_checks.problems import DataError, DataProblem
from kpca.vision_cls.cli import main
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.eval_data import EvalData
from kpca.vision_cls.input import TrainData
from tests.cli_support import CONFIGS, run_cli, smoke_options
from tests.console_support import console

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
CLASSES = [f"n0{i}" for i in range(10)]
FAST = {"num_workers": 0, "pin_memory": False, "image_size": 32, "batch_size": 8}
EMA_IN_EVAL_MODE = pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")


def write_tree(root: Path, split: str, per_class: int, classes: list[str] = CLASSES) -> list[Path]:
    """Random 40x48 JPEGs in ``root/<split>/<class>/<i>.JPEG``, in ImageFolder's order."""
    rng = np.random.default_rng(len(split))
    paths = []
    for name in classes:
        (root / split / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            path = root / split / name / f"{i}.JPEG"
            Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path, quality=95)
            paths.append(path)
    return paths


def truncate(path: Path) -> None:
    """Cut the file to 3/4 of its bytes, inside its compressed pixels (a copy that stopped early)."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 3 // 4])


@pytest.fixture
def imagenet(tmp_path: Path) -> Path:
    """10 classes, 4 training and 2 validation JPEGs each."""
    root = tmp_path / "imagenet"
    write_tree(root, "train", 4)
    write_tree(root, "val", 2)
    return root


def fit_options(tmp_path: Path, data_root: Path, *extra: object) -> list[object]:
    """A smoke fit on ``data_root``: one epoch reading every training image once (5 batches of 8)."""
    return smoke_options(
        SMOKE, tmp_path / "out", tmp_path / "cache", "--data.builtin=null", f"--data.root={data_root}",
        "--data.train.repeated_aug=1", "--data.batch_size=8", "--trainer.limit_val_batches=1",
        "--trainer.log_every_n_steps=1", *extra,
    )  # fmt: skip


@EMA_IN_EVAL_MODE
def test_a_truncated_jpeg_stops_the_fit_naming_it_and_the_fix(tmp_path: Path, imagenet: Path):
    damaged = imagenet / "train" / CLASSES[3] / "1.JPEG"
    truncate(damaged)
    with pytest.raises(DataError) as caught:
        run_cli(main, "vision-cls", "fit", *fit_options(tmp_path, imagenet))
    (problem,) = caught.value.problems
    assert (problem.path, problem.split) == (str(damaged), "train")
    assert problem.problem.startswith("cannot be read: OSError: image file is truncated")
    assert "data.train.bad_files=skip" in problem.fix and "check-data" in problem.fix


@pytest.mark.slow
def test_skip_mode_fit_through_the_console_script_finishes_counting_and_naming_each_file_once(
    tmp_path: Path, imagenet: Path, capfd: pytest.CaptureFixture
):
    damaged = [imagenet / "train" / CLASSES[2] / "0.JPEG", imagenet / "train" / CLASSES[7] / "3.JPEG"]
    for path in damaged:
        truncate(path)
    options = fit_options(
        tmp_path, imagenet, "--data.train.bad_files=skip", "--data.train.max_bad_fraction=0.05", "--data.num_workers=2"
    )
    # in this process (tests/console_support.py); capfd: the 2 DataLoader workers, forked from it, log the warnings
    done = console(capfd, "vision-cls", tmp_path, "fit", *options)
    assert done.returncode == 0, done.stderr[-4000:]
    warnings = [line for line in done.stderr.splitlines() if "skipping a damaged file" in line]
    assert len(warnings) == 2
    for path in damaged:
        assert sum(str(path) in line for line in warnings) == 1
    (events_file,) = (tmp_path / "out" / "runs").rglob("events.out.tfevents.*")
    events = EventAccumulator(str(events_file.parent))
    events.Reload()
    assert [event.value for event in events.Scalars(BAD_FILES_METRIC)] == [2.0]
    assert [event.value for event in events.Scalars(f"hparams/{BAD_FILES_METRIC}")] == [2.0]  # the HParams summary


def test_past_max_bad_fraction_training_stops_with_every_damaged_file(imagenet: Path):
    damaged = [imagenet / "train" / CLASSES[i] / "2.JPEG" for i in (1, 4, 8)]
    for path in damaged:
        truncate(path)
    skip = TrainData(repeated_aug=1, bad_files="skip", max_bad_fraction=0.05)
    data = ImageNetDataModule(root=str(imagenet), **FAST, train=skip)
    data.setup("fit")
    with pytest.raises(DataError) as caught:
        list(data.train_dataloader())
    assert "3 of the 40 files of train are damaged, more than data.train.max_bad_fraction=0.05 allows (2)" in str(
        caught.value
    )
    assert sorted(problem.path for problem in caught.value.problems) == sorted(map(str, damaged))


def test_evaluation_never_skips(imagenet: Path):
    damaged = imagenet / "val" / CLASSES[5] / "0.JPEG"
    truncate(damaged)
    skip = TrainData(repeated_aug=1, bad_files="skip", max_bad_fraction=0.5)
    data = ImageNetDataModule(root=str(imagenet), **FAST, train=skip)
    data.setup("fit")
    with pytest.raises(DataError, match=rf"^{damaged} \(val\): cannot be read: .*evaluation never skips files"):
        list(data.val_dataloader())


@pytest.mark.parametrize("split", ["train", "val"])
def test_an_empty_class_folder_names_the_split_the_root_and_the_folder(imagenet: Path, split: str):
    for path in (imagenet / split / CLASSES[6]).iterdir():
        path.unlink()
    data = ImageNetDataModule(root=str(imagenet), **FAST)
    with pytest.raises(DataError) as caught:
        data.setup("fit")
    assert caught.value.problems == [
        DataProblem(
            str(imagenet / split / CLASSES[6]),
            split,
            f"class folder of {imagenet / split} holds no image file (extensions .jpg, .jpeg, .png, .ppm, .bmp, .pgm, "
            ".tif, .tiff, .webp)",
            "Put the class's images in it or remove the folder (labels come from the folder names, so train and val "
            "need the same classes).",
        )
    ]


@pytest.mark.parametrize("workers", [0, 2])
def test_check_data_lists_every_problem_with_its_path(
    tmp_path: Path, imagenet: Path, workers: int, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # as some libraries set it: still caught
    truncate(imagenet / "train" / CLASSES[0] / "2.JPEG")
    truncate(imagenet / "val" / CLASSES[9] / "1.JPEG")
    for path in (imagenet / "train" / CLASSES[4]).iterdir():
        path.unlink()
    corruptions = tmp_path / "imagenet-c"
    write_tree(corruptions / "fog", "1", 1)
    truncate(corruptions / "fog" / "1" / CLASSES[8] / "0.JPEG")
    data = ImageNetDataModule(
        root=str(imagenet),
        **{**FAST, "num_workers": workers},
        eval=EvalData(imagenet_c=str(corruptions), severities=(1, 2)),
    )
    checked, problems = data.check_data(progress=False)
    assert checked == 36 + 20 + 10
    truncated = "cannot be read: OSError: image file is truncated"
    assert [(p.path, p.split) for p in problems] == [
        (str(imagenet / "train" / CLASSES[4]), "train"),
        (str(corruptions / "fog" / "2"), "imagenet_c"),
        (str(imagenet / "train" / CLASSES[0] / "2.JPEG"), "train"),
        (str(imagenet / "val" / CLASSES[9] / "1.JPEG"), "val"),
        (str(corruptions / "fog" / "1" / CLASSES[8] / "0.JPEG"), "imagenet_c/fog/1"),
    ]
    assert problems[0].problem.startswith(f"class folder of {imagenet / 'train'} holds no image file")
    assert problems[1].problem == "severity folder 2 is missing (data.eval.severities lists it)"
    assert problems[1].fix == "Add it from the ImageNet-C release, or drop 2 from data.eval.severities."
    assert all(p.problem.startswith(truncated) for p in problems[2:])
    assert "data.train.bad_files=skip" in problems[2].fix and "evaluation never skips" in problems[3].fix
