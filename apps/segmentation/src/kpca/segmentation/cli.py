"""The ``segmentation`` command: LightningCLI over SegmentationModule and ADE20KDataModule."""

from __future__ import annotations

from lightning.pytorch.cli import ArgsType

from kpca.segmentation.callbacks import LabelMapWriter, SegmentationOverlays
from kpca.segmentation.data import ADE20KDataModule
from kpca.segmentation.module import SegmentationModule
from kpca.training.cli import ProjectCLI
from kpca.training.errors import run_command


class SegmentationCLI(ProjectCLI):
    """Adds best/last checkpoints on ``val/mIoU``, RPC diagnostics, prediction overlays, and the class-count link."""

    description = (
        "segmentation: ADE20K semantic segmentation with Segmenter (symmetric or RPC attention in a timm ViT "
        "encoder and a mask-transformer decoder); fit, validate, test (clean and corrupted mIoU) and analyze "
        "(kernel PCA)."
    )

    monitor, mode = "val/mIoU", "max"

    def add_app_arguments(self, parser) -> None:
        parser.add_lightning_class_args(SegmentationOverlays, "overlays")
        parser.add_lightning_class_args(LabelMapWriter, "prediction_writer")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")


def main(args: ArgsType = None) -> SegmentationCLI:
    """Run ``segmentation fit|validate|test|predict -c configs/trainer/<hw>.yaml -c configs/segmentation/<exp>.yaml``.

    Returns the CLI object (its ``trainer``, ``model`` and ``datamodule``) for use from Python.
    """
    return SegmentationCLI(SegmentationModule, ADE20KDataModule, args=args)


def console_main() -> None:
    """Entry point of the ``segmentation`` console script; a user error ends it with one ``error:`` line."""
    run_command(main)


if __name__ == "__main__":
    console_main()
