"""The ``segmentation`` command: LightningCLI over SegmentationModule and ADE20KDataModule."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningCLI

from kpca.segmentation.callbacks import SegmentationOverlays
from kpca.segmentation.data import ADE20KDataModule
from kpca.segmentation.module import SegmentationModule
from kpca.vision_cls.callbacks import RPCDiagnostics


class SegmentationCLI(LightningCLI):
    """Adds best/last checkpoints on ``val/mIoU``, RPC diagnostics, prediction overlays, and the class-count link."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/mIoU",
                "checkpoint.mode": "max",
                "checkpoint.save_last": True,
                "checkpoint.filename": "best-{epoch:03d}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        parser.add_lightning_class_args(RPCDiagnostics, "rpc_diagnostics")
        parser.add_lightning_class_args(SegmentationOverlays, "overlays")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")


def main(args: ArgsType = None) -> SegmentationCLI:
    """Run ``segmentation fit|validate|test|predict -c configs/trainer/<hw>.yaml -c configs/segmentation/<exp>.yaml``.

    Returns the CLI object (its ``trainer``, ``model`` and ``datamodule``) for use from Python.
    """
    return SegmentationCLI(
        SegmentationModule,
        ADE20KDataModule,
        args=args,
        trainer_defaults={"plugins": [{"class_path": "kpca.vision_cls.checkpoint_io.AtomicCheckpointIO"}]},
        save_config_kwargs={"overwrite": True},
    )


def console_main() -> None:
    """Entry point of the ``segmentation`` console script (console scripts exit with the return value)."""
    main()


if __name__ == "__main__":
    console_main()
