"""``<app> check-data``: every file of the configured data read, a table of the damaged ones, exit status 1 if any.

Driven through the vision app on a tiny ImageNet-layout folder of real JPEGs made here; the console script itself for
the exit status. The command builds neither model nor trainer, so it runs with the 8-GPU trainer file on a CPU.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel
from PIL import Image

from kpca.training.cli import ProjectCLI
from kpca.training.data import ProjectDataModule
from kpca.training.data_checks import check_data
from kpca.training.data_checks.check_data import DataCheckResult, run_data_check
from kpca.training.data_checks.problems import DataProblem
from kpca.training.trainer import CHECK_DATA
from kpca.vision_cls.cli import main as vision_main
from tests.cli_support import CONFIGS, run_cli

GPU_TRAINER = CONFIGS / "trainer" / "ddp_8xgpu_bf16.yaml"
VISION_SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
CLASSES = ("n01440764", "n01443537")
IMAGES_PER_CLASS = 3


def write_imagenet_folder(root: Path) -> list[Path]:
    """``root/{train,val}/<wnid>/*.JPEG``: 2 classes x 3 random 40x40 JPEGs per split; the files, sorted."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for wnid in CLASSES:
            folder = root / split / wnid
            folder.mkdir(parents=True)
            for i in range(IMAGES_PER_CLASS):
                pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{wnid}_{i}.JPEG", quality=90)
    return sorted(root.rglob("*.JPEG"))


def truncate(path: Path) -> None:
    """Keep the first half of the file, as a copy cut short leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def check_data_options(root: Path, *extra: object) -> list[object]:
    return [
        CHECK_DATA, "-c", GPU_TRAINER, "-c", VISION_SMOKE, "--data.builtin", "null", f"--data.root={root}",
        "--progress", "false", *extra,
    ]  # fmt: skip


@pytest.fixture
def imagenet(tmp_path: Path) -> tuple[Path, list[Path]]:
    root = tmp_path / "imagenet"
    return root, write_imagenet_folder(root)


@pytest.mark.slow  # a fresh interpreter importing the vision app: about 30 s on 2 busy cores
def test_the_console_script_lists_a_truncated_jpeg_and_exits_with_status_1(imagenet):
    root, files = imagenet
    damaged = files[1]
    truncate(damaged)
    script = Path(sys.executable).with_name("vision-cls")
    done = subprocess.run(
        [script, *map(str, check_data_options(root, "--workers", "2"))],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(f"| {damaged} |")]
    assert len(rows) == 1 and "| train |" in rows[0], done.stdout
    assert f"check-data: {len(files)} files checked, 1 problem, " in done.stdout
    assert "Traceback" not in done.stderr


def test_damaged_data_is_listed_and_the_command_exits_with_status_1(imagenet, capsys):
    root, files = imagenet
    truncate(files[-1])
    with pytest.raises(SystemExit) as exit_info:
        run_cli(vision_main, "vision-cls", *check_data_options(root))
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert f"| {files[-1]} | val |" in out and f"check-data: {len(files)} files checked, 1 problem, " in out


def test_sound_data_passes_without_building_a_model_or_a_trainer(imagenet, capsys):
    root, files = imagenet
    cli = run_cli(vision_main, "vision-cls", *check_data_options(root))
    assert cli.model is None and cli.trainer is None
    out = capsys.readouterr().out
    assert "No problems found." in out
    assert f"check-data: {len(files)} files checked, 0 problems, " in out and " files/s)" in out


def test_workers_default_to_the_datamodules_and_can_be_set(imagenet, capsys):
    root, _ = imagenet
    assert run_cli(vision_main, "vision-cls", *check_data_options(root)).datamodule.num_workers == 0  # smoke.yaml
    cli = run_cli(vision_main, "vision-cls", *check_data_options(root, "--workers", "2"))
    assert cli.datamodule.num_workers == 2


@pytest.mark.parametrize("app", ["vision_cls", "language_model", "segmentation"])
def test_every_app_has_the_subcommand(app: str, capsys, monkeypatch):
    console_main = __import__(f"kpca.{app}.cli", fromlist=["console_main"]).console_main
    monkeypatch.setattr("sys.argv", [app.replace("_", "-"), CHECK_DATA, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        console_main()
    out = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 0
    assert "--workers" in out and "--progress" in out and "--data" in out


class DataWithoutACheck(ProjectDataModule):
    """A datamodule that does not implement ``check_data``."""

    def __init__(self, batch_size: int = 2, num_workers: int = 0) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers)


def test_a_datamodule_without_check_data_gets_an_error_naming_it(tmp_path: Path):
    with pytest.raises(NotImplementedError, match="DataWithoutACheck does not implement check_data"):
        run_cli(
            lambda args: ProjectCLI(BoringModel, DataWithoutACheck, args=args), "app", CHECK_DATA, "--seed_everything=0"
        )
    with pytest.raises(TypeError, match="object has no check_data"):
        run_data_check(object())


class FilesData(ProjectDataModule):
    """A datamodule whose check reports one problem per empty file of a folder (real files, real workers)."""

    def __init__(self, folder: str, num_workers: int = 0) -> None:
        super().__init__(batch_size=1, num_workers=num_workers)
        self.folder = Path(folder)

    def check_data(self, progress: bool = True) -> tuple[int, list[DataProblem]]:
        files = sorted(self.folder.iterdir())
        empty = [DataProblem(str(p), "train", "it is empty", "replace it") for p in files if p.stat().st_size == 0]
        return len(files), empty


class Clock:
    """A ``time.perf_counter`` stand-in that moves only when told to."""

    def __init__(self, now: float) -> None:
        self.now = now

    def perf_counter(self) -> float:
        return self.now


class TimedFilesData(FilesData):
    """FilesData whose check takes ``seconds`` on ``clock`` (it advances the clock while it runs)."""

    def __init__(self, folder: str, clock: Clock, seconds: float) -> None:
        super().__init__(folder, num_workers=3)
        self.clock, self.seconds = clock, seconds

    def check_data(self, progress: bool = True) -> tuple[int, list[DataProblem]]:
        self.clock.now += self.seconds
        return super().check_data(progress)


def test_run_data_check_sets_the_workers_and_times_the_check(tmp_path: Path, monkeypatch):
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "b.txt").touch()
    clock = Clock(100.0)
    monkeypatch.setattr(check_data, "time", clock)  # the module's clock only, not the time module
    data = TimedFilesData(str(tmp_path), clock, seconds=2.5)
    result = run_data_check(data, workers=1, progress=False)
    assert data.num_workers == 1
    assert (result.files, [Path(p.path).name for p in result.problems]) == (2, ["b.txt"])
    assert result.seconds == 2.5  # the clock read before and after the check, nothing else
    with pytest.raises(ValueError, match="--workers=-1"):
        run_data_check(data, workers=-1)


def test_the_summary_line():
    problem = DataProblem("/d/x.JPEG", "val", "truncated", "replace it")
    assert (
        DataCheckResult(200, [problem], 2.0).summary()
        == "check-data: 200 files checked, 1 problem, 2.0 s (100 files/s)"
    )
    assert DataCheckResult(3, [], 0.0).summary().startswith("check-data: 3 files checked, 0 problems, 0.0 s")
