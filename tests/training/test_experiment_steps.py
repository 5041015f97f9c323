"""One step of a plan (``kpca-experiment exec``): its markers, its log, its checkpoint, SIGTERM; and the fit's
``fit_summary.json`` (``ProjectCLI.after_fit``) that later steps read their checkpoint from."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kpca.training.cli import FIT_SUMMARY as CLI_FIT_SUMMARY
from kpca.training.experiment.plan import load_plan
from kpca.training.experiment.steps import (
    FIT_SUMMARY,
    Heartbeat,
    StepError,
    execute_step,
    fit_checkpoint,
    log_path,
    marker,
)
from kpca.training.files import temporary_files
from kpca.vision_cls.cli import main
from tests.cli_support import CPU, NEW_CHECKPOINT_DIR, run_cli, smoke_options

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "configs" / "vision_cls" / "smoke.yaml"
EXPERIMENT = [sys.executable, "-m", "kpca.training.experiment"]


@pytest.fixture(scope="module")
def digits_cache(digits_cache_dir: Path) -> Path:
    """The session's digits tree (tests/conftest.py): read only."""
    return digits_cache_dir


def tiny_plan(folder: Path, cache: Path, *fit_overrides: str) -> Path:
    """One model, one seed, fit then test, on the smoke config: a few CPU steps."""
    plan = {
        "name": "one",
        "app": "vision_cls",
        "out": str(folder / "runs"),
        "seeds": [0],
        "common": {
            "configs": [str(CPU), str(SMOKE)],
            "overrides": [
                f"--data.cache_dir={cache}",
                "--trainer.enable_progress_bar=false",
                "--trainer.limit_train_batches=2",
                "--trainer.limit_val_batches=1",
            ],
        },  # fmt: skip
        "runs": [{"name": "rpc"}],
        "steps": [{"name": "fit", "overrides": list(fit_overrides)}, {"name": "test", "ckpt": "last"}],
    }
    path = folder / "plan.yaml"
    path.write_text(yaml.safe_dump(plan), encoding="utf-8")
    return path


@NEW_CHECKPOINT_DIR
@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")  # the EMA copy of the network
def test_fit_writes_its_best_and_last_checkpoints_to_fit_summary(tmp_path, digits_cache):
    options = smoke_options(
        SMOKE, tmp_path, digits_cache, "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
        "--trainer.max_epochs=2", "--trainer.log_every_n_steps=1",
    )  # fmt: skip
    cli = run_cli(main, "vision-cls", "fit", *options)
    folder = Path(cli.trainer.log_dir)
    summary = json.loads((folder / CLI_FIT_SUMMARY).read_text())
    callback = cli.trainer.checkpoint_callback
    assert summary == {
        "best_model_path": callback.best_model_path,
        "best_model_score": pytest.approx(float(callback.best_model_score)),
        "last_model_path": callback.last_model_path,
        "epoch": 2,
        "global_step": 4,
    }
    assert Path(summary["best_model_path"]).parent == folder / "checkpoints"
    assert Path(summary["last_model_path"]) == folder / "checkpoints" / "last.ckpt"
    assert temporary_files(folder) == []  # written atomically
    assert FIT_SUMMARY == CLI_FIT_SUMMARY  # the name the plan's steps read


def test_a_done_step_is_skipped_without_running_anything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = load_plan(tiny_plan(tmp_path, tmp_path))
    run = plan.runs[0]
    run.folder.mkdir(parents=True)
    marker(run, "fit", "done").write_text("{}")
    assert execute_step(plan, run, "fit") == 0
    assert not log_path(run, "fit").exists() and not marker(run, "fit", "running").exists()


def test_a_later_step_reads_its_checkpoint_from_fit_done(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = load_plan(tiny_plan(tmp_path, tmp_path))
    run = plan.runs[0]
    with pytest.raises(
        StepError,
        match=r"rpc/seed0: the fit is not done \(.*fit.done does not exist\), so it has no "
        r"last checkpoint to evaluate; run the fit first: kpca-experiment run ",
    ):
        execute_step(plan, run, "test")
    assert not log_path(run, "test").exists()
    run.folder.mkdir(parents=True)
    marker(run, "fit", "done").write_text(json.dumps({"best_model_path": None, "last_model_path": "/x/last.ckpt"}))
    assert fit_checkpoint(plan, run, "last") == Path("/x/last.ckpt")
    with pytest.raises(StepError, match=r"names no best checkpoint .* use ckpt: last in the plan's step"):
        fit_checkpoint(plan, run, "best")


def test_heartbeat_touches_the_running_marker(tmp_path):
    running = tmp_path / "fit.running"
    running.write_text("{}")
    os.utime(running, (0, 0))
    heartbeat = Heartbeat(running, interval=0.05).start()
    deadline = time.monotonic() + 10
    while running.stat().st_mtime == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    heartbeat.stop()
    assert running.stat().st_mtime > time.time() - 60


@pytest.mark.slow
def test_a_failing_step_writes_failed_with_its_log_and_exit_status(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tiny_plan(tmp_path, tmp_path, "--trainer.no_such_option=1")
    run = load_plan(path).runs[0]
    done = subprocess.run([*EXPERIMENT, "exec", str(path), "--run", "rpc/seed0", "--step", "fit"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr
    failed = json.loads(marker(run, "fit", "failed").read_text())
    assert failed["rc"] == 2 and failed["log"] == str(log_path(run, "fit")) and failed["time"]
    assert not marker(run, "fit", "done").exists() and not marker(run, "fit", "running").exists()
    log = log_path(run, "fit").read_text()
    assert "unrecognized arguments: --trainer.no_such_option=1" in log and "=== " in log and "exit status 2" in log


@pytest.mark.slow
def test_sigterm_reaches_the_app_and_leaves_the_step_unfinished(tmp_path, monkeypatch, digits_cache):
    monkeypatch.chdir(tmp_path)
    path = tiny_plan(tmp_path, digits_cache, "--trainer.max_epochs=100")
    run = load_plan(path).runs[0]
    process = subprocess.Popen([*EXPERIMENT, "exec", str(path), "--run", "rpc/seed0", "--step", "fit"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    last = run.folder / "fit" / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 300
    while not last.is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    running = json.loads(marker(run, "fit", "running").read_text())
    assert running["pid"] == process.pid and running["host"] == socket.gethostname() and running["started"]
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted by signal 15; rerun the plan to continue it" in stderr
    for kind in ("done", "failed", "running"):
        assert not marker(run, "fit", kind).exists(), kind
    assert "exit status" in log_path(run, "fit").read_text()  # the app ended, and its end is in the log
