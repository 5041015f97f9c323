"""The ``vision-cls`` command: LightningCLI over ClassificationModule and ImageNetDataModule."""

from __future__ import annotations

from lightning.pytorch.cli import ArgsType

from kpca.training.cli import ProjectCLI
from kpca.vision_cls.callbacks import AttentionMaps
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.module import ClassificationModule


class VisionCLI(ProjectCLI):
    """Adds best/last checkpoints on ``val/acc1``, attention maps, and the class-count link (to ProjectCLI's)."""

    monitor, mode = "val/acc1", "max"

    def add_app_arguments(self, parser) -> None:
        parser.add_lightning_class_args(AttentionMaps, "attention_maps")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")


def main(args: ArgsType = None) -> VisionCLI:
    """Run ``vision-cls fit|validate|test|predict -c configs/trainer/<hw>.yaml -c configs/vision_cls/<exp>.yaml``.

    Returns the CLI object (its ``trainer``, ``model`` and ``datamodule``) for use from Python.
    """
    return VisionCLI(ClassificationModule, ImageNetDataModule, args=args)


def console_main() -> None:
    """Entry point of the ``vision-cls`` console script (console scripts exit with the return value)."""
    main()


if __name__ == "__main__":
    console_main()
