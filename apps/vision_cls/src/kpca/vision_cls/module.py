"""ClassificationModule: the DeiT training recipe around any image classifier, and its evaluation.

Legend: B batch, C channels, H x W image, K classes.
"""

from __future__ import annotations

import math
import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from timm.data import Mixup
from timm.utils import ModelEmaV3
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from kpca.vision_cls.evaluation import RobustnessEvaluator
from kpca.vision_cls.rng_state import RNGStateCheckpointing


class ClassificationModule(RNGStateCheckpointing, pl.LightningModule):
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
    """

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
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net", "evaluator"])
        if "_instantiator" in self.hparams:
            # Built by LightningCLI: the hparams are the parsed config, where net is a class_path/init_args
            # dict that load_from_checkpoint rebuilds it from (a net passed from Python is not saved). The
            # evaluator stays out: a checkpoint's hparams override the config of `test --ckpt_path`.
            self.save_hyperparameters(ignore=["evaluator"])
        self.net = net
        self.optimizer_factory = optimizer
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
        self._batch_start = 0.0

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
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        elapsed = time.perf_counter() - self._batch_start
        images_per_sec = batch[0].shape[0] * self.trainer.world_size / max(elapsed, 1e-9)
        self.log("train/images_per_sec", images_per_sec, on_step=True, on_epoch=False)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False)
        if self.ema is not None:
            self.ema.update(self.net, step=self.global_step)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        logits = self.net(images)
        self.val_acc1(logits, labels)
        self.val_acc5(logits, labels)
        self.log("val/loss", F.cross_entropy(logits, labels), sync_dist=True)
        self.log("val/acc1", self.val_acc1, prog_bar=True)
        self.log("val/acc5", self.val_acc5)
        if self.ema is not None:
            self.val_ema_acc1(self.ema.module(images), labels)
            self.log("val/ema_acc1", self.val_ema_acc1)

    def on_test_start(self) -> None:
        datamodule = self.trainer.datamodule
        indices = {s.name: datamodule.class_indices(s) for s in datamodule.eval_sets}
        self.evaluator.start(datamodule.eval_sets, self.net.num_classes, self.device, indices)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self.evaluator.step(self.net, batch, dataloader_idx, batch_idx)

    def on_test_epoch_end(self) -> None:
        results = self.evaluator.compute()
        self.log_dict({f"test/{name}": value for name, value in results.items()}, add_dataloader_idx=False)
        log_dir = self.trainer.log_dir or self.trainer.default_root_dir  # a collective: every rank asks
        if self.trainer.is_global_zero:
            self.evaluator.write_report(results, log_dir)

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.net(images).softmax(-1)

    def configure_optimizers(self):
        """AdamW over decay / no-decay groups, lr scaled by global batch, per-step warm-up + cosine."""
        optimizer = self.optimizer_factory(self._parameter_groups())
        reference = self.hparams.lr_batch_reference
        if reference:
            global_batch = self.trainer.datamodule.batch_size * self.trainer.accumulate_grad_batches
            for group in optimizer.param_groups:
                group["lr"] *= global_batch / reference
        total = max(int(self.trainer.estimated_stepping_batches), 1)  # honours max_steps and max_epochs
        steps_per_epoch = self.trainer.num_training_batches / self.trainer.accumulate_grad_batches
        warmup = min(int(self.hparams.warmup_epochs * steps_per_epoch), total)
        schedule = _warmup_cosine(total, warmup, optimizer.param_groups[0]["lr"], self.hparams)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _parameter_groups(self) -> list[dict]:
        """Biases, norms, position embeddings and tokens get no weight decay (timm / nanoGPT rule)."""
        skip = self.net.no_weight_decay() if hasattr(self.net, "no_weight_decay") else set()
        decay, no_decay = [], []
        for name, param in self.net.named_parameters():
            if not param.requires_grad:
                continue
            (no_decay if param.ndim <= 1 or name in skip else decay).append(param)
        return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]


def _warmup_cosine(total: int, warmup: int, peak_lr: float, hparams) -> callable:
    """LambdaLR factor: linear from warmup_lr to the peak over ``warmup`` steps, then cosine to min_lr."""
    start = hparams.warmup_lr / peak_lr if peak_lr > 0 else 0.0
    floor = hparams.min_lr / peak_lr if peak_lr > 0 else 0.0

    def factor(step: int) -> float:
        if step < warmup:
            return start + (1.0 - start) * step / warmup
        progress = (step - warmup) / max(total - warmup, 1)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor
