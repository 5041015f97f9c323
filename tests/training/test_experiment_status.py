"""``kpca-experiment status``: each step's state from its markers, and a fit's progress from its newest checkpoint,
its saved config and the wall times of its TensorBoard scalars. Unknown parts are left out."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.tensorboard import SummaryWriter

from kpca.training.experiment.cli import main
from kpca.training.experiment.plan import load_plan
from kpca.training.experiment.status import (
    STALE_AFTER_S,
    FitProgress,
    fit_progress,
    format_duration,
    newest_checkpoint_position,
    status_markdown,
    step_states,
)
from kpca.training.experiment.steps import log_path, marker

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "configs" / "trainer" / "cpu.yaml"
SMOKE = REPO / "configs" / "vision_cls" / "smoke.yaml"


def two_seed_plan(folder: Path):
    plan = {
        "name": "states", "app": "vision_cls", "out": str(folder / "runs"), "seeds": [0, 1],
        "common": {"configs": [str(CPU), str(SMOKE)]},
        "runs": [{"name": "rpc"}, {"name": "symmetric"}],
        "steps": [{"name": "fit"}, {"name": "test"}],
    }  # fmt: skip
    path = folder / "plan.yaml"
    path.write_text(yaml.safe_dump(plan), encoding="utf-8")
    return load_plan(path)


def write_checkpoint(path: Path, epoch: int, global_step: int, last_batch: bool, steps_this_epoch: int) -> None:
    """A file with the fields Lightning writes that progress reads (its loop counters as Lightning nests them)."""
    optim = {
        "optimizer": {
            "step": {
                "total": {"ready": global_step, "completed": global_step},
                "current": {"ready": steps_this_epoch, "completed": steps_this_epoch},
            }
        }
    }
    loops = {"fit_loop": {
        "epoch_loop.batch_progress": {"is_last_batch": last_batch},
        "epoch_loop.automatic_optimization.optim_progress": optim,
        "epoch_loop.manual_optimization.optim_step_progress": {"total": {"ready": 0, "completed": 0}},
    }}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": epoch, "global_step": global_step, "loops": loops, "state_dict": {}}, path)


def write_events(folder: Path, steps: range, seconds_per_step: float, start: float = 1.7e9) -> None:
    writer = SummaryWriter(str(folder))
    for step in steps:
        writer.add_scalar("train/loss_step", 1.0, step, walltime=start + step * seconds_per_step)
    writer.close()


def test_states_come_from_the_markers(tmp_path):
    plan = two_seed_plan(tmp_path)
    rpc0, rpc1, sym0, sym1 = plan.runs
    for run in plan.runs:
        run.folder.mkdir(parents=True)
    marker(rpc0, "fit", "done").write_text(json.dumps({"finished": "2030-01-01T00:00:00+00:00"}))
    marker(rpc0, "test", "failed").write_text(json.dumps({"rc": 1, "log": str(log_path(rpc0, "test"))}))
    marker(rpc1, "fit", "running").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    stale = marker(sym0, "fit", "running")
    stale.write_text(json.dumps({"host": "elsewhere", "pid": 1, "SLURM_JOB_ID": "77"}))
    old = time.time() - STALE_AFTER_S - 60
    os.utime(stale, (old, old))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    marker(sym1, "fit", "running").write_text(json.dumps({"host": socket.gethostname(), "pid": gone.pid}))
    log_path(sym0, "test").write_text("=== started\n")  # stopped by a signal: a log, no marker
    states = {(s.run_id, s.step): s for s in step_states(plan)}
    assert {key: s.state for key, s in states.items()} == {
        ("rpc/seed0", "fit"): "done", ("rpc/seed0", "test"): "failed",
        ("rpc/seed1", "fit"): "running", ("rpc/seed1", "test"): "not started",
        ("symmetric/seed0", "fit"): "interrupted", ("symmetric/seed0", "test"): "interrupted",
        ("symmetric/seed1", "fit"): "interrupted", ("symmetric/seed1", "test"): "not started",
    }  # fmt: skip
    assert states["rpc/seed0", "fit"].detail == "finished 2030-01-01T00:00:00+00:00"
    assert states["rpc/seed0", "test"].detail == f"exit status 1, log {log_path(rpc0, 'test')}"
    assert states["rpc/seed1", "fit"].detail == f"pid {os.getpid()} on {socket.gethostname()}"
    assert states["symmetric/seed0", "fit"].detail.startswith(
        "no heartbeat for 6m from pid 1 on elsewhere (SLURM job 77)"
    )
    assert (
        f"pid {gone.pid} on {socket.gethostname()} has ended without a word" in states["symmetric/seed1", "fit"].detail
    )
    assert str(log_path(sym0, "test")) in states["symmetric/seed0", "test"].detail
    assert states["rpc/seed1", "fit"].progress == ""  # no checkpoint yet: nothing known, nothing guessed
    table = status_markdown(plan)
    assert table.splitlines()[0] == "| run | step | state | detail | progress |" and len(table.splitlines()) == 10


def test_progress_of_a_fit_saved_at_an_epoch_end(tmp_path):
    folder = tmp_path / "fit"
    write_checkpoint(
        folder / "checkpoints" / "last.ckpt", epoch=2, global_step=30, last_batch=True, steps_this_epoch=10
    )
    (folder / "config.yaml").write_text(yaml.safe_dump({"trainer": {"max_epochs": 100, "max_steps": -1}}))
    write_events(folder, range(30), seconds_per_step=10.0)
    progress = fit_progress(folder)
    assert progress == FitProgress(epochs_done=3, global_step=30, steps_per_epoch=10.0, max_epochs=100,
                                   max_steps=None, steps_per_second=pytest.approx(0.1))  # fmt: skip
    assert progress.steps_left() == 970
    assert progress.describe(estimate=True) == "epoch 3/100, step 30, ~2h41m left"  # 970 steps at 10 s
    assert progress.describe(estimate=False) == "epoch 3/100, step 30"


def test_progress_within_an_epoch_and_the_nearer_limit(tmp_path):
    folder = tmp_path / "fit"
    older = folder / "checkpoints" / "best-000.ckpt"
    write_checkpoint(older, epoch=0, global_step=10, last_batch=True, steps_this_epoch=10)
    os.utime(older, (1, 1))
    write_checkpoint(
        folder / "checkpoints" / "last.ckpt", epoch=2, global_step=24, last_batch=False, steps_this_epoch=4
    )
    (folder / "config.yaml").write_text(yaml.safe_dump({"trainer": {"max_epochs": 300, "max_steps": 40}}))
    progress = fit_progress(folder)  # the newest checkpoint: two epochs of 10 steps, 4 steps into the third
    assert (progress.epochs_done, progress.global_step, progress.steps_per_epoch) == (2, 24, 10.0)
    assert progress.steps_left() == 16  # max_steps comes before 300 epochs
    assert progress.describe(estimate=True) == "epoch 2/300, step 24/40"  # no events: no estimate


def test_resume_pauses_do_not_count_in_the_speed(tmp_path):
    folder = tmp_path / "fit"
    write_events(folder, range(20), seconds_per_step=2.0)
    write_events(folder, range(20, 40), seconds_per_step=2.0, start=1.7e9 + 86400)  # resumed a day later
    assert fit_progress(folder).steps_per_second == pytest.approx(0.5)


def test_unknown_parts_are_left_out(tmp_path):
    folder = tmp_path / "fit"
    assert fit_progress(folder) == FitProgress()
    assert FitProgress().describe(estimate=True) == ""
    damaged = folder / "checkpoints" / "last.ckpt"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"not a checkpoint")
    assert newest_checkpoint_position(folder / "checkpoints") == (None, None, None)  # damaged files are passed over
    write_checkpoint(
        folder / "checkpoints" / "epoch.ckpt", epoch=0, global_step=7, last_batch=False, steps_this_epoch=7
    )
    assert fit_progress(folder).describe(estimate=True) == "epoch 0, step 7"  # no config: no limits; no steps/epoch


def test_durations_are_coarse():
    assert [format_duration(s) for s in (30, 60, 300, 7800, 90000, 4 * 86400 + 3 * 3600)] == [
        "<1m", "1m", "5m", "2h10m", "1d1h", "4d3h",
    ]  # fmt: skip


def test_status_command_prints_the_table(tmp_path, capsys):
    plan = two_seed_plan(tmp_path)
    plan.runs[0].folder.mkdir(parents=True)
    marker(plan.runs[0], "fit", "done").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        main(["status", str(plan.path)])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == status_markdown(plan)
