"""DeferredSlurmRequeue: under SLURM auto-requeue the requeue signal only sets a flag; the hpc checkpoint and
``scontrol requeue`` happen at the next batch boundary, in a real Lightning fit signalled by the real signal. A
signal held through start-up (kpca.training.slurm_start) requeues after the first batch; one after the fit stays
held."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kpca.training.callbacks import DeferredSlurmRequeue
from kpca.training.slurm_start import hold_signal
from tests.cli_support import free_port

REPO = Path(__file__).resolve().parents[2]
SLURM = {
    "SLURM_JOB_NAME": "kpca-test", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
}  # fmt: skip


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def test_step(self, batch, batch_idx):
        self.log("loss", nn.functional.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SignalAtStep(pl.Callback):
    """Sends the requeue signal to this process at the start of one training batch and records what it did."""

    def __init__(self, root: Path, step: int) -> None:
        self.root, self.step, self.saved_inside_the_handler = root, step, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGUSR1)  # Python runs the handler right after this call
            self.saved_inside_the_handler = (self.root / "hpc_ckpt_1.ckpt").exists()


@pytest.fixture
def scontrol_record(tmp_path: Path, monkeypatch) -> Path:
    """This process under SLURM (auto-requeue) with an ``scontrol`` on PATH that records its arguments there."""
    record = tmp_path / "scontrol.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$*" >> {record}\nexit 0\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    return record


def fit(root: Path, *callbacks: pl.Callback) -> None:
    """Five training steps of the linear model under DeferredSlurmRequeue."""
    trainer = pl.Trainer(
        max_steps=5, default_root_dir=root, logger=False, enable_checkpointing=False, accelerator="cpu",
        enable_progress_bar=False, enable_model_summary=False, callbacks=[DeferredSlurmRequeue(), *callbacks],
    )  # fmt: skip
    trainer.fit(Module(), DataLoader(TensorDataset(torch.randn(20, 4), torch.randint(0, 2, (20,))), batch_size=4))


def held() -> set[int]:
    """The signals this thread holds (blocks)."""
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_the_requeue_runs_after_the_batch_not_inside_the_signal_handler(tmp_path: Path, scontrol_record: Path):
    before = signal.getsignal(signal.SIGUSR1)
    probe = SignalAtStep(tmp_path, step=2)
    fit(tmp_path, probe)
    assert probe.saved_inside_the_handler is False  # Lightning alone saves inside the handler: True
    saved = torch.load(tmp_path / "hpc_ckpt_1.ckpt", weights_only=False)
    assert saved["global_step"] == 3  # after the signalled batch (step 2) ended
    assert scontrol_record.read_text().splitlines() == ["requeue 4242"]
    assert signal.getsignal(signal.SIGUSR1) == before  # Lightning's teardown restores the process's handler


def signal_this_thread() -> None:
    """SIGUSR1 to this (the main) thread only: this worker's other threads were started without it held, unlike
    an app's under kpca.training.slurm_start (tests/test_cluster.py signals such a process as a whole)."""
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)


def test_a_signal_held_through_start_up_requeues_after_the_first_batch_and_one_after_the_fit_stays_held(
    tmp_path: Path, scontrol_record: Path
):
    """As under docker/launch_slurm.sh: the signal is held from the start and comes before Lightning's handler is
    in place (SIGUSR1's default action would end the process); after the fit it comes again."""
    hold_signal(signal.SIGUSR1)
    signal_this_thread()  # the process is still starting
    assert signal.SIGUSR1 in signal.sigpending()
    fit(tmp_path)
    saved = torch.load(tmp_path / "hpc_ckpt_1.ckpt", weights_only=False)
    assert saved["global_step"] == 1  # taken after the first batch
    assert scontrol_record.read_text().splitlines() == ["requeue 4242"]
    assert signal.SIGUSR1 in held() and signal.SIGUSR1 not in signal.sigpending()
    signal_this_thread()  # after the fit: it stays pending, and the process ends as it would
    assert signal.SIGUSR1 in signal.sigpending()
    assert signal.sigtimedwait({signal.SIGUSR1}, 0) is not None  # take it, so that it reaches no later test
    assert scontrol_record.read_text().splitlines() == ["requeue 4242"]


class SignalAtTestBatch(pl.Callback):
    """Sends the requeue signal to this thread at the start of one test batch and records what it did."""

    def __init__(self, root: Path, batch: int) -> None:
        self.root, self.batch, self.saved_inside_the_handler = root, batch, None

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == self.batch:
            signal_this_thread()
            self.saved_inside_the_handler = (self.root / "hpc_ckpt_1.ckpt").exists()


def test_a_test_stage_requeues_after_its_batch_too(tmp_path: Path, scontrol_record: Path):
    probe = SignalAtTestBatch(tmp_path, batch=1)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, logger=False, enable_checkpointing=False, accelerator="cpu",
        enable_progress_bar=False, enable_model_summary=False, callbacks=[DeferredSlurmRequeue(), probe],
    )  # fmt: skip
    trainer.test(Module(), DataLoader(TensorDataset(torch.randn(12, 4), torch.randint(0, 2, (12,))), batch_size=4))
    assert probe.saved_inside_the_handler is False  # Lightning alone saves inside the handler: True
    assert (tmp_path / "hpc_ckpt_1.ckpt").is_file()
    assert scontrol_record.read_text().splitlines() == ["requeue 4242"]


@pytest.mark.slow
def test_two_ranks_signalled_in_a_validation_of_uneven_batches_requeue_together_at_its_end(tmp_path: Path):
    """Two SLURM tasks (tests/training/slurm_ddp_probe.py) validate on 3 and 2 batches and are signalled in the
    first validation: a collective after each validation batch would pair with another collective and hang; the
    requeue runs at the validation's end, on both ranks, from one checkpoint at the step before it."""
    record, bin_dir = tmp_path / "scontrol.log", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$*" >> {record}\nexit 0\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {
        **os.environ, **SLURM, "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }  # fmt: skip
    tasks = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.training.slurm_ddp_probe", str(tmp_path)], cwd=tmp_path,
            env={**env, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for rank in (0, 1)
    ]  # fmt: skip
    try:
        errors = [task.communicate(timeout=240)[1] for task in tasks]
    finally:
        for task in tasks:
            task.kill()
            task.communicate()
    assert [task.returncode for task in tasks] == [0, 0], "\n".join(error[-3000:] for error in errors)
    assert record.read_text().splitlines() == ["requeue 4242"]  # rank 0 requeues, once
    assert torch.load(tmp_path / "hpc_ckpt_1.ckpt", weights_only=False)["global_step"] == 2
    assert not (tmp_path / "hpc_ckpt_2.ckpt").exists()
