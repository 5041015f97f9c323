"""ClassificationModule: the DeiT training recipe around any image classifier, and its evaluation.

Legend: B batch, C channels, H x W image, K classes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from timm.data import Mixup
from timm.utils import ModelEmaV3
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from kpca.training.data import require_datamodule
from kpca.training.errors import OptionError
from kpca.training.module import CompileOptions, NetModule
from kpca.training.optim import parameter_groups, warmup_cosine
from kpca.vision_cls.data import VisionData
from kpca.vision_cls.evaluation import RobustnessEvaluator


def check_mixup_batch(global_batch: int, world_size: int, mixup_alpha: float, cutmix_alpha: float) -> None:
    """Raise :class:`OptionError` if Mixup / CutMix would get an odd per-device batch, naming the numbers and the fix.

    timm's ``Mixup`` mixes each image with its mirror in the batch and asserts an even batch. Every training batch
    has the per-device size ``global_batch / world_size``: the training loaders drop the last partial batch.

    Args:
        global_batch: ``data.batch_size``, summed over the ``world_size`` processes (devices × nodes).
        world_size: number of processes.
        mixup_alpha: ``model.mixup_alpha``, named in the error.
        cutmix_alpha: ``model.cutmix_alpha``, named in the error.
    """
    per_device = global_batch // world_size
    if per_device % 2 == 0:
        return
    step = 2 * world_size
    lower = global_batch // step * step
    nearest = " or ".join(str(size) for size in (lower, lower + step) if size)
    raise OptionError(
        f"Mixup / CutMix (model.mixup_alpha={mixup_alpha}, model.cutmix_alpha={cutmix_alpha}) pairs the images of "
        f"each device's batch, so that batch must be even, but data.batch_size={global_batch} over {world_size} "
        f"device(s) (devices × nodes) gives {per_device} per device. Set data.batch_size to a multiple of {step} "
        f"(an even batch on each device), e.g. {nearest}, or train without mixing: model.mixup_alpha=0 and "
        "model.cutmix_alpha=0."
    )


_RANGES = {
    "lr_batch_reference": (lambda value: value >= 0, "an integer >= 1, or 0 for no scaling (DeiT: 512)"),
    "warmup_epochs": (lambda value: value >= 0, ">= 0 (DeiT: 5)"),
    "warmup_lr": (lambda value: value >= 0, ">= 0 (DeiT: 1e-6)"),
    "min_lr": (lambda value: value >= 0, ">= 0 (DeiT: 1e-5)"),
    "label_smoothing": (lambda value: 0 <= value < 1, "in [0, 1) (DeiT: 0.1)"),
    "mixup_alpha": (lambda value: value >= 0, ">= 0, 0 disables (DeiT: 0.8)"),
    "cutmix_alpha": (lambda value: value >= 0, ">= 0, 0 disables (DeiT: 1.0)"),
    "mixup_prob": (lambda value: 0 <= value <= 1, "a probability in [0, 1] (DeiT: 1.0)"),
    "mixup_switch_prob": (lambda value: 0 <= value <= 1, "a probability in [0, 1] (DeiT: 0.5)"),
    "ema_decay": (lambda value: value is None or 0 <= value < 1, "in [0, 1), or null for no EMA (DeiT: 0.99996)"),
}
"""The model options' ranges, each with the words its refusal uses."""


def _check_schedule_and_regularisers(**options: float | None) -> None:
    """Refuse a schedule or regulariser option out of its range (:data:`_RANGES`), naming ``model.<name>``."""
    for name, value in options.items():
        accepts, accepted = _RANGES[name]
        if not accepts(value):
            raise OptionError(f"model.{name}={value} is out of range: it must be {accepted}")


class ClassificationModule(NetModule):
    """DeiT recipe: AdamW with no-decay groups, lr scaled by global batch, per-step warm-up + cosine.

    Args:
        net: the classifier, (B, 3, H, W) pixel images in [0, 1] -> (B, K) logits (``ViTClassifier``).
        optimizer: optimizer factory taking parameter groups (default AdamW; DeiT: lr 5e-4, wd 0.05).
        lr_batch_reference: the lr is multiplied by global batch / this (DeiT: 512); 0 disables scaling.
        warmup_epochs: linear warm-up length in epochs (fractions allowed), stepped per optimizer step.
        warmup_lr: lr at the start of the warm-up.
        min_lr: final lr of the cosine schedule.
        label_smoothing: label smoothing (also inside Mixup/CutMix targets).
        mixup_alpha: Mixup alpha (DeiT 0.8); 0 with cutmix_alpha 0 disables mixing.
        cutmix_alpha: CutMix alpha (DeiT 1.0).
        mixup_prob: probability of mixing a batch.
        mixup_switch_prob: probability of CutMix instead of Mixup when both are on.
        ema_decay: keep an exponential moving average of the weights with this decay (None: off);
            validation then also reports ``val/ema_acc1``.
        evaluator: robustness evaluations run by ``test`` (corruptions, ImageNet-A/R/O, attacks).
        compile: compile the network (``true``, or :class:`~kpca.training.module.CompileOptions`):
            training, validation and the test evaluations (attacks included) run it compiled; the EMA copy runs eager.
    """

    unsaved_hparams = ("evaluator",)  # evaluation settings come from the config of `test`, not the checkpoint

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_batch_reference: int = 512,
        warmup_epochs: float = 5.0,
        warmup_lr: float = 1e-6,
        min_lr: float = 1e-5,
        label_smoothing: float = 0.1,
        mixup_alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        mixup_prob: float = 1.0,
        mixup_switch_prob: float = 0.5,
        ema_decay: float | None = None,
        evaluator: RobustnessEvaluator | None = None,
        compile: bool | CompileOptions = False,
    ) -> None:
        super().__init__(net, optimizer, compile)
        _check_schedule_and_regularisers(
            lr_batch_reference=lr_batch_reference,
            warmup_epochs=warmup_epochs,
            warmup_lr=warmup_lr,
            min_lr=min_lr,
            label_smoothing=label_smoothing,
            mixup_alpha=mixup_alpha,
            cutmix_alpha=cutmix_alpha,
            mixup_prob=mixup_prob,
            mixup_switch_prob=mixup_switch_prob,
            ema_decay=ema_decay,
        )
        num_classes = net.num_classes
        self.mixup = (
            Mixup(
                mixup_alpha=mixup_alpha,
                cutmix_alpha=cutmix_alpha,
                prob=mixup_prob,
                switch_prob=mixup_switch_prob,
                label_smoothing=label_smoothing,
                num_classes=num_classes,
            )
            if mixup_alpha > 0 or cutmix_alpha > 0
            else None
        )
        self.ema = ModelEmaV3(net, decay=ema_decay).requires_grad_(False) if ema_decay is not None else None
        self.evaluator = evaluator or RobustnessEvaluator()
        # micro: the fraction of correct images, as DeiT reports (torchmetrics defaults to a macro class mean).
        self.val_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=min(5, num_classes), average="micro")
        self.val_ema_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_loss = MeanMetric()  # weighted by images: DDP ranks with unequal shards average correctly

    def setup(self, stage: str) -> None:
        """Before a fit's loaders start, refuse a per-device batch that Mixup / CutMix cannot pair."""
        super().setup(stage)
        if stage == "fit" and self.mixup is not None:
            hparams = self.hparams
            check_mixup_batch(self.data.batch_size, self.trainer.world_size, hparams.mixup_alpha, hparams.cutmix_alpha)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) pixel images in [0, 1] -> (B, K) logits."""
        return self.net(images)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        if self.mixup is not None:
            images, targets = self.mixup(images, labels)  # targets: (B, K) soft labels
            loss = torch.sum(-targets * F.log_softmax(self.net(images), dim=-1), dim=-1).mean()
        else:
            loss = F.cross_entropy(self.net(images), labels, label_smoothing=self.hparams.label_smoothing)
        self.log_train_loss(loss, images.shape[0])
        return loss

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """Step, then update the EMA weights.

        Inside the step, so that a checkpoint saved after the batch (by the callbacks' ``on_train_batch_end``, which
        Lightning runs before the module's) holds the EMA of this step and a resumed fit does not miss its update.
        """
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        if self.ema is not None:
            self.ema.update(self.net, step=self.global_step)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        logits = self.net(images)
        self.val_acc1(logits, labels)
        self.val_acc5(logits, labels)
        self.val_loss.update(F.cross_entropy(logits, labels), weight=len(labels))
        self.log("val/loss", self.val_loss)
        self.log("val/acc1", self.val_acc1, prog_bar=True)
        self.log("val/acc5", self.val_acc5)
        if self.ema is not None:
            self.val_ema_acc1(self.ema.module(images), labels)
            self.log("val/ema_acc1", self.val_ema_acc1)

    @property
    def data(self) -> VisionData:
        """The trainer's datamodule as the :class:`VisionData` this module reads; TypeError names what it lacks."""
        return require_datamodule(self.trainer, VisionData)

    def on_test_start(self) -> None:
        data = self.data
        eval_sets = data.eval_sets
        indices = {s.name: data.class_indices(s) for s in eval_sets}
        self.evaluator.start(eval_sets, self.net.num_classes, self.device, indices)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self.evaluator.step(self.net, batch, dataloader_idx, batch_idx)

    def on_test_epoch_end(self) -> None:
        results = self.evaluator.compute()
        self.log_dict({f"test/{name}": value for name, value in results.items()}, add_dataloader_idx=False)
        report_dir = self.report_dir()  # a collective: every rank asks
        if self.trainer.is_global_zero:
            self.evaluator.write_report(results, report_dir)

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.net(images).softmax(-1)

    def configure_optimizers(self):
        """AdamW over decay / no-decay groups, lr scaled by global batch, per-step warm-up + cosine."""
        optimizer = self.optimizer_factory(parameter_groups(self.net))
        reference = self.hparams.lr_batch_reference
        if reference:
            global_batch = self.data.batch_size * self.trainer.accumulate_grad_batches
            for group in optimizer.param_groups:
                group["lr"] *= global_batch / reference
        total = max(int(self.trainer.estimated_stepping_batches), 1)  # honours max_steps and max_epochs
        steps_per_epoch = self.trainer.num_training_batches / self.trainer.accumulate_grad_batches
        warmup = 0  # without training batches (trainer.limit_train_batches=0) there is no epoch length and no step
        if math.isfinite(steps_per_epoch):
            warmup = min(int(self.hparams.warmup_epochs * steps_per_epoch), total)
        peak_lr = optimizer.param_groups[0]["lr"]
        start, floor = (self.hparams.warmup_lr / peak_lr, self.hparams.min_lr / peak_lr) if peak_lr > 0 else (0.0, 0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total, warmup, start, floor))
        schedule = {"scheduler": scheduler, "interval": "step", "name": "train/lr"}  # the LearningRateMonitor tag
        return {"optimizer": optimizer, "lr_scheduler": schedule}
