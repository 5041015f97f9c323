"""ProjectCLI: the LightningCLI that every app's command builds on.

It adds a ``checkpoint`` ModelCheckpoint (best by the app's metric, plus ``last.ckpt``), the RPC
diagnostics callback, atomic checkpoint writes, and saves the resolved config of each run.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningCLI

from kpca.vision_cls.callbacks import RPCDiagnostics


class ProjectCLI(LightningCLI):
    """An app's command: set ``monitor``, ``mode`` and ``best_filename``, and add its own arguments.

    Subclasses override :meth:`add_app_arguments` for their callbacks and links.
    """

    monitor: str = "val/loss"
    mode: str = "min"
    best_filename: str = "best-{epoch:03d}"

    def __init__(self, model_class, datamodule_class, args: ArgsType = None) -> None:
        super().__init__(
            model_class,
            datamodule_class,
            args=args,
            trainer_defaults={"plugins": [{"class_path": "kpca.vision_cls.checkpoint_io.AtomicCheckpointIO"}]},
            save_config_kwargs={"overwrite": True},
        )

    def add_arguments_to_parser(self, parser) -> None:
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
        self.add_app_arguments(parser)

    def add_app_arguments(self, parser) -> None:
        """Add the app's callbacks and argument links (nothing by default)."""
