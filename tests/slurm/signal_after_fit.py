"""A callback that sends SIGUSR1 to its own process once the fit has ended, as a Slurm time-limit check may: after
Lightning's teardown has put the signal's default action (ending the process) back."""

import os
import signal
import sys

import lightning.pytorch as pl


class SignalAfterFit(pl.Callback):
    """``os.kill(own pid, SIGUSR1)`` at ``on_fit_end``, which Lightning calls after its teardown; says so on stderr."""

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)
        print("SignalAfterFit: SIGUSR1 sent", file=sys.stderr, flush=True)
