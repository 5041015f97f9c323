"""Exact resume (docs/cluster.md#exact-resume): a fit interrupted mid-epoch, as a cluster interrupts it, ends with
the weights of the same fit run straight through, bit for bit, in every app, on CPU with two loader workers.

One chain per app, as a preempted job lives it: the fit gets SIGUSR1 under SLURM (the time limit is near) in the
middle of an epoch, saves the hpc checkpoint and calls ``scontrol requeue``; the requeued job runs the same
command (``--ckpt_path auto``) and is killed with SIGKILL right after a mid-epoch ``every_n_train_steps``
checkpoint; the same command once more runs to the end. Vision trains with RandAugment, random erasing, Mixup /
CutMix, drop path and repeated augmentation; the language model with dropout; segmentation with random resize,
crop and flip. A resumed epoch that loaded its batches from the epoch's start again (a loader without state)
trains on other batches and fails the weight comparison; so does a resumed worker that draws other augmentations.
The three jobs log into one run folder, on one TensorBoard step axis. (A kill from outside at a moment the fit does
not choose is tests/vision_cls/test_cli.py's.)
"""

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.cli_support import CONFIGS, assert_same_weights, fit_command, run_to_the_end, smoke_options

REPO = Path(__file__).resolve().parents[2]
SLURM = {
    "SLURM_JOB_NAME": "kpca-test", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
}  # fmt: skip
RESTORED = re.compile(r"auto resume: restoring (\S+) \(step (\d+)\)")
NOT_RESUMABLE = "your dataloader is not resumable"

# app: (training batches per epoch, epochs, every_n_train_steps, SIGUSR1 at step, SIGKILL at step). The step
# checkpoints divide the last step (so that last.ckpt holds the end of the fit); the first one after a validation is
# the kill's (last.ckpt is written once the monitored metric exists).
CHAINS = {
    "vision_cls": (6, 2, 4, 1, 8),
    "language_model": (5, 2, 2, 2, 6),
    "segmentation": (4, 2, 2, 2, 6),
}


def options(app: str, root: Path, cache: Path, probe: tuple[int, int] | None) -> list[object]:
    """The app's smoke fit with two workers, writing under ``root``; ``probe``: (SIGUSR1 step, SIGKILL step)."""
    batches, epochs, every, _, _ = CHAINS[app]
    extra = [
        "--data.num_workers=2", f"--trainer.max_epochs={epochs}", f"--trainer.limit_train_batches={batches}",
        "--trainer.limit_val_batches=1", f"--checkpoint.every_n_train_steps={every}", "--trainer.log_every_n_steps=1",
    ]  # fmt: skip
    if probe is not None:
        extra += [
            "--trainer.callbacks+=tests.training.resume_probe.Probe",
            f"--trainer.callbacks.usr1_at={probe[0]}", f"--trainer.callbacks.kill_at={probe[1]}",
        ]  # fmt: skip
    return smoke_options(CONFIGS / app / "smoke.yaml", root, cache, *extra)


def slurm_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a SLURM task with auto-requeue; ``scontrol`` is a stand-in that ends the job it requeues."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/scontrol.log"\nkill -TERM "$PPID"\n')
    (bin_dir / "scontrol").chmod(0o755)
    path = os.pathsep.join([str(bin_dir), os.environ["PATH"]])
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **SLURM, "PATH": path, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1"}


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def restored_step(done: subprocess.CompletedProcess) -> tuple[Path, int]:
    found = RESTORED.findall(done.stderr)
    assert len(found) == 1, done.stderr[-3000:]
    return Path(found[0][0]), int(found[0][1])


@pytest.mark.slow
@pytest.mark.parametrize("app", list(CHAINS))
def test_a_preempted_and_killed_fit_ends_with_the_uninterrupted_weights(app: str, tmp_path: Path):
    batches, epochs, _, usr1_at, kill_at = CHAINS[app]
    cache = tmp_path / "cache"
    straight = tmp_path / "straight"
    run_to_the_end(fit_command(app, options(app, straight, cache, None)), tmp_path)

    root, env = tmp_path / "job", slurm_env(tmp_path)
    command = fit_command(app, options(app, root, cache, (usr1_at, kill_at)))
    run(command, tmp_path, env)  # SIGUSR1 mid-epoch: hpc checkpoint, scontrol requeue, SIGTERM
    assert (tmp_path / "bin" / "scontrol.log").read_text().split() == ["requeue", SLURM["SLURM_JOB_ID"]]
    hpc = root / "hpc_ckpt_1.ckpt"
    assert torch.load(hpc, map_location="cpu", weights_only=True)["global_step"] == usr1_at + 1
    assert (usr1_at + 1) % batches != 0  # mid-epoch

    requeued = run(command, tmp_path, env)  # the requeued job, killed after its step checkpoint
    assert requeued.returncode == -9, requeued.stderr[-3000:]
    assert restored_step(requeued) == (hpc.resolve(), usr1_at + 1)
    assert NOT_RESUMABLE not in requeued.stderr

    last_run = run(command, tmp_path, env)
    assert last_run.returncode == 0, last_run.stderr[-3000:]
    path, step = restored_step(last_run)
    assert (path.name, step) == ("last.ckpt", kill_at) and kill_at % batches != 0  # a mid-epoch step checkpoint
    assert NOT_RESUMABLE not in last_run.stderr

    last = "runs/lightning_logs/version_0/checkpoints/last.ckpt"
    assert_same_weights(root / last, straight / last)
    assert torch.load(root / last, map_location="cpu", weights_only=True)["global_step"] == batches * epochs
    assert_one_step_axis(root / "runs" / "lightning_logs", batches * epochs)


def assert_one_step_axis(logs: Path, steps: int) -> None:
    """The three jobs logged into one run folder, whose TensorBoard training loss has each of the ``steps`` once."""
    assert sorted(path.name for path in logs.iterdir()) == ["version_0"]
    events = EventAccumulator(str(logs / "version_0"))
    events.Reload()
    logged = [event.step for event in events.Scalars("train/loss_step")]
    assert logged == sorted(set(logged)) and logged[-1] == steps - 1, logged
