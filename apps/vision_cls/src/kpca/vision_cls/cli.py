"""The ``vision-cls`` command: LightningCLI over ClassificationModule and ImageNetDataModule."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.cli import ArgsType

from kpca.training.checkpointing.weights import load_checkpoint_weights
from kpca.training.cli import ProjectCLI
from kpca.training.data import per_device_batch_size
from kpca.training.errors import OptionError, run_command
from kpca.training.trainer import ProjectTrainer
from kpca.vision_cls.callbacks import AttentionMaps, ClassPredictionWriter
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.export import export_timm
from kpca.vision_cls.module import ClassificationModule, check_mixup_batch

logger = logging.getLogger(__name__)


class VisionTrainer(ProjectTrainer):
    """Lightning's Trainer with the analyze, check-data and export subcommands (export: a timm model folder)."""

    def export(
        self,
        model: pl.LightningModule,
        out_dir: str,
        datamodule: pl.LightningDataModule | None = None,
        ckpt_path: str | None = None,
    ) -> Path:
        """Write the classifier of a checkpoint as a timm model folder (model.safetensors and config.json).

        ``timm.create_model("local-dir:<out_dir>", pretrained=True)`` loads it back (after ``import
        kpca.vision_cls`` for SymViT / RPC / scaled models; a DeiT needs timm only). Its inputs are
        normalised with the config's mean and std, as every timm model's are.

        Args:
            model: the LightningModule whose ``net`` (a ViTClassifier) is exported.
            out_dir: the folder to create (it must not exist).
            datamodule: unused (LightningCLI passes the configured one).
            ckpt_path: the checkpoint whose weights are exported; None exports the initial weights.
        """
        if ckpt_path is not None:
            load_checkpoint_weights(model, ckpt_path)
        folder = export_timm(model.net, out_dir)
        logger.info("export: %s -> %s (timm.create_model('local-dir:%s', pretrained=True))", ckpt_path, folder, folder)
        return folder


class VisionCLI(ProjectCLI):
    """Adds best/last checkpoints on ``val/acc1``, attention maps, and the class-count link (to ProjectCLI's)."""

    description = (
        "vision-cls: ImageNet-1K classification with DeiT, SymViT and RPC-SymViT (timm ViTs); fit, validate, test "
        "(clean, ImageNet-C/A/R/O and adversarial attacks), analyze (kernel PCA) and export (a timm model folder)."
    )

    monitor, mode = "val/acc1", "max"
    trainer_type = VisionTrainer

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """ProjectCLI's subcommands plus ``export`` (a timm model folder of a checkpoint)."""
        return {**ProjectCLI.subcommands(), "export": {"model", "datamodule"}}

    def add_app_arguments(self, parser) -> None:
        parser.add_lightning_class_args(AttentionMaps, "attention_maps")
        parser.add_lightning_class_args(ClassPredictionWriter, "prediction_writer")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")

    def _check_batch(self, config) -> None:
        """The global batch over the processes, checked with Mixup's even per-device batch before anything is built.

        ``data.batch_size`` must split evenly over devices × nodes, and into an even batch per device when Mixup or
        CutMix is on; the size the first refusal suggests satisfies both (alone, the split's would suggest 15 for 16
        over 3 devices, which Mixup then refuses).
        """
        devices, nodes, batch = (
            config.trainer.get("devices"),
            config.trainer.get("num_nodes"),
            config.data.get("batch_size"),
        )
        if isinstance(devices, (list, tuple)):
            devices = len(devices)
        elif isinstance(devices, str) and devices.isdigit():  # Lightning's devices option is typed int | str | list
            devices = int(devices)
        if not all(isinstance(value, int) and not isinstance(value, bool) for value in (devices, nodes, batch)):
            return  # "auto" devices: Lightning counts them; the DataModule and the module check then
        world_size = max(devices, 1) * max(nodes, 1)
        mixup, cutmix = config.model.get("mixup_alpha") or 0.0, config.model.get("cutmix_alpha") or 0.0
        if mixup or cutmix:  # first: its suggestion (a multiple of 2 x world_size) also splits evenly
            check_mixup_batch(batch, world_size, mixup, cutmix)
        per_device_batch_size(batch, world_size)

    def check_options(self, config) -> None:
        """Refuse an image size the ViT cannot take, before timm asserts on the first batch or crops silently.

        The data's ``image_size`` must be the net's ``img_size``, a multiple of its ``patch_size``.
        """
        self._check_batch(config)
        net = (config.model.get("net") or {}).get("init_args") or {}
        img_size, patch_size, image_size = net.get("img_size"), net.get("patch_size"), config.data.get("image_size")
        if not all(isinstance(value, int) for value in (img_size, patch_size, image_size)):
            return
        if patch_size < 1:
            raise OptionError(f"model.net.init_args.patch_size={patch_size} must be 1 or more (DeiT: 16)")
        if image_size != img_size:
            raise OptionError(
                f"data.image_size={image_size} differs from model.net.init_args.img_size={img_size}: the ViT takes "
                f"{img_size}-pixel images; set both to one size, e.g. --data.image_size={img_size}"
            )
        if img_size % patch_size:
            fits = max(patch_size, img_size // patch_size * patch_size)
            raise OptionError(
                f"model.net.init_args.img_size={img_size} is not a multiple of patch_size={patch_size}: the patches "
                f"would leave the last {img_size % patch_size} pixel rows and columns out; use a multiple, e.g. "
                f"--data.image_size={fits} --model.net.init_args.img_size={fits}"
            )


def main(args: ArgsType = None) -> VisionCLI:
    """Run ``vision-cls <subcommand> -c configs/trainer/<hw>.yaml -c configs/vision_cls/<exp>.yaml``.

    Subcommands: fit, validate, test, predict, analyze (kernel-PCA report), export (a timm model folder).

    Returns the CLI object (its ``trainer``, ``model`` and ``datamodule``) for use from Python.
    """
    return VisionCLI(ClassificationModule, ImageNetDataModule, args=args)


def console_main() -> None:
    """Entry point of the ``vision-cls`` console script; a user error ends it with one ``error:`` line."""
    run_command(main)


if __name__ == "__main__":
    console_main()
