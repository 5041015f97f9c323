"""One writer per run: ``fit`` locks its run folder (and ``--ckpt_path auto`` its experiment), refuses a second
identical command naming the first, takes over a dead process's lock, and removes what killed saves left."""

import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest

from kpca.training.files import TEMPORARY_SUFFIX, temporary_prefix
from kpca.training.run_lock import LockOwner, RunFolderLockedError, RunLock
from kpca.vision_cls.cli import main
from tests.cli_support import CONFIGS, fit_command, run_cli, smoke_options

REPO = Path(__file__).resolve().parents[2]
LOG_EVERY_STEP = "--trainer.log_every_n_steps=1"  # short fits: Lightning warns when an epoch is shorter than the period
# The vision module keeps its EMA copy of the network in eval mode on purpose; Lightning warns about it at fit start.
pytestmark = pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")


class PauseAtEpoch(pl.Callback):
    """Hold a fit at the start of ``epoch`` until the file ``go`` exists (a test's way to keep a run running).

    Args:
        go: the file whose creation lets the fit continue.
        epoch: the epoch at whose start the fit waits.
        timeout_s: fail the fit after waiting this long.
    """

    def __init__(self, go: str, epoch: int = 1, timeout_s: float = 600.0) -> None:
        self.go, self.epoch, self.timeout_s = Path(go), epoch, timeout_s

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        deadline = time.monotonic() + self.timeout_s
        while trainer.current_epoch == self.epoch and not self.go.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.go} was not created within {self.timeout_s} s")
            time.sleep(0.05)


def vision_options(root: Path, cache: Path, *extra: object) -> list[object]:
    return smoke_options(CONFIGS / "vision_cls" / "smoke.yaml", root, cache, *extra)


def run_vision(*args: object):
    return run_cli(main, "vision-cls", *args)


@pytest.fixture(scope="module")
def digits_cache(digits_cache_dir: Path) -> Path:
    """The session's digits tree (tests/conftest.py): read only."""
    return digits_cache_dir


def test_a_fit_into_a_locked_run_folder_refuses_before_writing_anything(tmp_path: Path, digits_cache: Path):
    run_folder = tmp_path / "runs" / "lightning_logs" / "version_0"
    with RunLock(run_folder / "fit.lock", "the run folder"):
        options = vision_options(tmp_path, digits_cache, "--trainer.logger.init_args.version=0")
        with pytest.raises(RunFolderLockedError) as error:
            run_vision("fit", *options, "--trainer.max_steps=1")
        assert sorted(p.name for p in run_folder.iterdir()) == ["fit.lock"]  # no config, events or checkpoints
    message = str(error.value)
    assert f"the run folder {run_folder}" in message
    assert f"process {os.getpid()} on {socket.gethostname()}" in message  # the holder: this test
    assert "leave trainer.logger.init_args.version unset" in message and "--ckpt_path null" in message


def test_a_fit_takes_over_a_dead_process_lock_and_removes_partial_saves(tmp_path: Path, digits_cache: Path, caplog):
    run_folder = tmp_path / "runs" / "lightning_logs" / "version_0"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = LockOwner(int(dead.stdout), socket.gethostname(), time.time() - 60, "vision-cls fit", None, "0" * 16)
    (run_folder / "checkpoints").mkdir(parents=True)
    (run_folder / "fit.lock").write_text(stale.to_json(), encoding="utf-8")
    handle, partial = tempfile.mkstemp(  # named as AtomicCheckpointIO's write names it
        dir=run_folder / "checkpoints", prefix=temporary_prefix(run_folder / "checkpoints" / "last.ckpt"),
        suffix=TEMPORARY_SUFFIX,
    )  # fmt: skip
    written = os.write(handle, b"PK\x03\x04 the first bytes of a killed save")
    os.close(handle)
    options = vision_options(tmp_path, digits_cache, "--trainer.logger.init_args.version=0")
    with caplog.at_level(logging.WARNING, logger="kpca"):
        run_vision("fit", *options, "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2", LOG_EVERY_STEP)
    assert f"taking over the stale lock {run_folder / 'fit.lock'}" in caplog.text
    assert f"process {stale.pid} is not running" in caplog.text
    assert f"removed {partial} ({written} bytes)" in caplog.text
    assert sorted(p.name for p in (run_folder / "checkpoints").iterdir()) == ["best-000.ckpt", "last.ckpt"]
    assert not (run_folder / "fit.lock").exists()  # released at the end


@pytest.mark.slow  # two fresh interpreters training the vision smoke model: about a minute on 2 busy cores
def test_a_second_identical_auto_resume_refuses_naming_the_first_which_finishes_intact(
    tmp_path: Path, digits_cache: Path
):
    go = tmp_path / "go"
    pause = f'{{"class_path": "{__name__}.PauseAtEpoch", "init_args": {{"go": "{go}"}}}}'
    options = vision_options(
        tmp_path, digits_cache, "--trainer.max_epochs=2", "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=2", LOG_EVERY_STEP, f"--trainer.callbacks+={pause}",
    )  # fmt: skip
    command = fit_command("vision_cls", options)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    experiment = tmp_path / "runs" / "lightning_logs"
    run_folder = experiment / "version_0"
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600
        while not (run_folder / "checkpoints" / "last.ckpt").is_file() and first.poll() is None:
            assert time.monotonic() < deadline, "the first fit wrote no checkpoint"
            time.sleep(0.1)
        assert first.poll() is None, first.stderr.read().decode()[-3000:]  # paused at epoch 1, holding its locks
        second = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert first.poll() is None  # the second ended while the first still ran
    finally:
        go.touch()
        _, first_stderr = first.communicate(timeout=600)
    assert second.returncode != 0
    assert "error: Another process is writing into this experiment" in second.stderr
    assert f"process {first.pid} on {socket.gethostname()}" in second.stderr and "fit -c" in second.stderr
    assert "replace --ckpt_path auto by --ckpt_path null" in second.stderr
    assert "auto resume" not in second.stderr  # a refused fit restores nothing, so it says nothing of restoring
    assert first.returncode == 0, first_stderr.decode()[-3000:]
    assert sorted(p.name for p in experiment.iterdir()) == ["version_0"]  # no second version, no lock left
    checkpoints = sorted(p.name for p in (run_folder / "checkpoints").iterdir())
    assert len(checkpoints) == 2 and checkpoints[1] == "last.ckpt" and checkpoints[0].startswith("best-")  # no -v1
    assert len(list(run_folder.glob("events.out.tfevents.*"))) == 1  # one writer of the curves
    assert not (run_folder / "fit.lock").exists()
