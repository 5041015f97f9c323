"""A callback that gives a fit a minimum wall time, so that a Slurm time limit lands inside it on any machine.

``Pace(seconds_per_step=s)`` sleeps ``s`` seconds after every training batch. Sleeping draws no random numbers
and changes no tensor, so a paced fit trains on the same batches to the same weights as an unpaced one.
"""

import time

import lightning.pytorch as pl


class Pace(pl.Callback):
    """Sleep ``seconds_per_step`` after every training batch (see the module docstring)."""

    def __init__(self, seconds_per_step: float) -> None:
        self.seconds_per_step = seconds_per_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds_per_step)
