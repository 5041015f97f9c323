"""ProjectCLI: the LightningCLI that every app's command builds on.

It adds a ``checkpoint`` ModelCheckpoint (best by the app's metric, plus ``last.ckpt``), the RPC
diagnostics callback, Lightning's learning-rate and throughput monitors, atomic checkpoint writes,
console logging for the ``kpca`` loggers, and saves the resolved config of each run. ``test`` prints
the app's report table once instead of Lightning's table per dataloader.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI

from kpca.training.callbacks import RPCDiagnostics, Throughput

CHECKPOINT_IO = "kpca.training.checkpoint_io.AtomicCheckpointIO"


def batch_size(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor (``(images, labels)``, ``(tokens, targets)``, ...)."""
    first = batch[0] if isinstance(batch, (tuple, list)) else next(iter(batch.values()))
    return len(first)


def batch_tokens(batch: Any) -> int:
    """Tokens in a batch of ``(B, N)`` token ids: ``B * N`` (ThroughputMonitor's items, for tokens/s)."""
    return batch[0].numel()


def console_logging(name: str = "kpca") -> None:
    """Show INFO messages of the ``name`` loggers on the console, as Lightning does for its own (once per process).

    Nothing is added when the root logger or ``name`` already has handlers (the user configured logging).
    """
    logger = logging.getLogger(name)
    if logger.handlers or logging.getLogger().handlers:
        return
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.StreamHandler())
    logger.propagate = False


class ProjectCLI(LightningCLI):
    """An app's command: set ``monitor``, ``mode``, ``best_filename`` and ``throughput``, add its own arguments.

    Subclasses override :meth:`add_app_arguments` for their callbacks and links. ``throughput`` gives
    ThroughputMonitor's ``batch_size_fn`` and ``length_fn`` (tokens/s for sequence models).
    """

    monitor: str = "val/loss"
    mode: str = "min"
    best_filename: str = "best-{epoch:03d}"
    throughput: tuple[Callable[[Any], int], Callable[[Any], int] | None] = (batch_size, None)

    def __init__(self, model_class, datamodule_class, args: ArgsType = None) -> None:
        console_logging()
        super().__init__(
            model_class,
            datamodule_class,
            args=args,
            trainer_defaults={"plugins": [{"class_path": CHECKPOINT_IO}]},
            save_config_kwargs={"overwrite": True},
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": self.monitor,
                "checkpoint.mode": self.mode,
                "checkpoint.save_last": True,
                "checkpoint.filename": self.best_filename,
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        parser.add_lightning_class_args(RPCDiagnostics, "rpc_diagnostics")
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.set_defaults({"lr_monitor.logging_interval": "step"})
        parser.add_lightning_class_args(Throughput, "throughput")
        size_fn, length_fn = self.throughput
        parser.set_defaults({"throughput.batch_size_fn": size_fn, "throughput.length_fn": length_fn})
        self.add_app_arguments(parser)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "test":  # the module prints its report table once; Lightning's is one per dataloader
            parser.set_defaults({"verbose": False})
        return parser

    def add_app_arguments(self, parser: LightningArgumentParser) -> None:
        """Add the app's callbacks and argument links (nothing by default)."""
