"""The ``vision-cls`` command: LightningCLI over ClassificationModule and ImageNetDataModule."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningCLI

from kpca.vision_cls.callbacks import AttentionMaps, RPCDiagnostics
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.module import ClassificationModule


class VisionCLI(LightningCLI):
    """Adds the project's callbacks (best/last checkpoints, RPC diagnostics, attention maps) and links."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/acc1",
                "checkpoint.mode": "max",
                "checkpoint.save_last": True,
                "checkpoint.filename": "best-{epoch:03d}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        parser.add_lightning_class_args(RPCDiagnostics, "rpc_diagnostics")
        parser.add_lightning_class_args(AttentionMaps, "attention_maps")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")


def main(args: ArgsType = None) -> VisionCLI:
    """Run ``vision-cls fit|validate|test|predict -c configs/trainer/<hw>.yaml -c configs/vision_cls/<exp>.yaml``.

    Returns the CLI object (its ``trainer``, ``model`` and ``datamodule``) for use from Python.
    """
    return VisionCLI(
        ClassificationModule,
        ImageNetDataModule,
        args=args,
        trainer_defaults={"plugins": [{"class_path": "kpca.vision_cls.checkpoint_io.AtomicCheckpointIO"}]},
        save_config_kwargs={"overwrite": True},
    )


def console_main() -> None:
    """Entry point of the ``vision-cls`` console script (console scripts exit with the return value)."""
    main()


if __name__ == "__main__":
    console_main()
