"""NetModule: the base LightningModule of every app, around an injected network and optimizer factory."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.cli import OptimizerCallable
from torch import nn

from kpca.training.checkpointing.resume import record_run_folder
from kpca.training.rng_state import RNGStateCheckpointing


class NetModule(RNGStateCheckpointing, pl.LightningModule):
    """A LightningModule whose network and optimizer factory arrive as constructor arguments (so YAML swaps them).

    Hyper-parameters are saved by one rule for every app. Built from Python, the network is not saved (it is
    an object). Built by LightningCLI, the parsed config is saved, network included as its ``class_path`` /
    ``init_args``, so ``load_from_checkpoint`` rebuilds the model. Names in :attr:`unsaved_hparams` are never
    saved: a checkpoint's hparams override the config of ``test --ckpt_path``, so evaluation settings stay out.
    Checkpoints carry every rank's RNG states (:class:`RNGStateCheckpointing`) and the run folder that wrote them
    (for ``--ckpt_path auto``, :mod:`kpca.training.checkpointing.resume`).

    Subclasses call ``super().__init__(net, optimizer)`` first in their ``__init__``.

    Args:
        net: the network.
        optimizer: optimizer factory taking parameters or parameter groups.
    """

    unsaved_hparams: tuple[str, ...] = ()
    flops_per_batch: int | None = None
    """FLOPs per training batch for ``ThroughputMonitor``'s MFU; None: not measured (samples/s still logged)."""

    def __init__(self, net: nn.Module, optimizer: OptimizerCallable) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net", *self.unsaved_hparams])
        if "_instantiator" in self.hparams:
            self.save_hyperparameters(ignore=list(self.unsaved_hparams))
        self.net = net
        self.optimizer_factory = optimizer

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Add the run folder to the RNG states (called on every rank: ``log_dir`` is agreed between ranks)."""
        super().on_save_checkpoint(checkpoint)
        record_run_folder(checkpoint, self.trainer.log_dir)

    def report_dir(self) -> str:
        """The folder for this run's reports: the logger's folder, or the trainer's root without a logger.

        A collective under DDP (the TensorBoard logger's folder is agreed between ranks): call it on every rank.
        """
        return self.trainer.log_dir or self.trainer.default_root_dir
