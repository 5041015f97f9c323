"""The epoch's training loss under DDP is the mean over every process's batches, not rank 0's alone."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_process_epoch_train_loss_is_the_mean_over_both_ranks(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "tests.training.ddp_train_loss_probe", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [event.value for event in events.Scalars("train/loss_step")] == [1.0, 2.0]  # rank 0's own steps
    (epoch,) = events.Scalars("train/loss_epoch")
    assert epoch.value == pytest.approx(2.25)  # (1 + 2 + 2 + 4) / 4; rank 0 alone would give 1.5
