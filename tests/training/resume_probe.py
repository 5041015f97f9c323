"""A callback the exact-resume tests add to a fit: it interrupts the fit as a cluster would, at fixed steps.

``Probe(usr1_at=a, kill_at=b)`` sends this process SIGUSR1 (the SLURM requeue signal) at the start of the batch
with ``global_step == a``, and SIGKILL at the start of the batch with ``global_step == b`` (the step checkpoint of
step ``b`` is written by then) when the fit started before step ``b``; a fit resumed at or after a step is not
interrupted there again, so the same command runs to the end eventually.
"""

import os
import signal

import lightning.pytorch as pl


class Probe(pl.Callback):
    """Interrupt the fit: SIGUSR1 at step ``usr1_at``, SIGKILL at step ``kill_at`` (see the module docstring)."""

    def __init__(self, usr1_at: int, kill_at: int) -> None:
        self.usr1_at, self.kill_at, self.start = usr1_at, kill_at, 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start = trainer.global_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self.usr1_at and self.start < step:
            os.kill(os.getpid(), signal.SIGUSR1)
        if step == self.kill_at and self.start < step:
            os.kill(os.getpid(), signal.SIGKILL)
