"""SegmentationModule: Segmenter's ADE20K recipe (SGD, polynomial lr) with sliding-window evaluation.

Legend: B batch, C channels, H x W image (crop), H0 x W0 original image, K classes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import nn
from torchmetrics import MeanMetric

from kpca.segmentation.data import SegmentationData
from kpca.segmentation.evaluation import corruption_results, write_reports
from kpca.segmentation.inference import predict_label_map
from kpca.segmentation.metrics import IGNORE_INDEX, SegmentationMetrics
from kpca.training.data import require_datamodule
from kpca.training.errors import OptionError
from kpca.training.module import CompileOptions, NetModule
from kpca.training.optim import polynomial


def segmenter_sgd(params: Iterable) -> torch.optim.Optimizer:
    """SGD with lr 1e-3, momentum 0.9 and no weight decay: Segmenter's (and the paper's) ADE20K optimizer."""
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, weight_decay=0.0)


def segmentation_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (B, K, H, W) logits against (B, H, W) labels, averaged over the non-ignored (255) pixels.

    Unlike ``F.cross_entropy``'s mean, a batch without any labelled pixel gives 0, not NaN.
    """
    if logits.shape[-2:] != labels.shape[-2:]:
        logits = F.interpolate(logits, size=labels.shape[-2:], mode="bilinear", align_corners=False)
    total = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (labels != IGNORE_INDEX).sum().clamp_min(1)


class SegmentationModule(NetModule):
    """Train a segmentation net with SGD and a per-step polynomial lr; evaluate by sliding windows.

    Validation logs ``val/loss``, ``val/mIoU``, ``val/mAcc`` and ``val/aAcc`` (fractions) over the clean
    validation set; ``test`` evaluates every set of the datamodule's ``eval_sets`` (clean and corrupted) and writes
    the Markdown and CSV reports into the log dir (see :mod:`kpca.segmentation.evaluation`).

    Args:
        net: the segmentation network, (B, 3, H, W) pixel images in [0, 1] -> (B, K, H, W) logits (``Segmenter``).
        optimizer: optimizer factory taking the parameters (default: SGD, lr 1e-3, momentum 0.9, as the paper).
        poly_power: power of the polynomial decay (the paper: 0.9).
        min_lr: lr at the last step (Segmenter: 1e-5).
        window: sliding-window side at evaluation (the paper: 512).
        stride: sliding-window stride at evaluation (the paper: 512).
        compile: compile the network (``true``, or :class:`~kpca.training.module.CompileOptions`):
            training and the sliding-window windows of validation, test and predict run it compiled.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerCallable = segmenter_sgd,
        poly_power: float = 0.9,
        min_lr: float = 1e-5,
        window: int = 512,
        stride: int = 512,
        compile: bool | CompileOptions = False,
    ) -> None:
        if not 0 < stride <= window:
            raise OptionError(f"need 0 < stride <= window, got stride={stride}, window={window}")
        super().__init__(net, optimizer, compile)
        self.val_metrics = SegmentationMetrics(net.num_classes, IGNORE_INDEX)
        self.val_loss = MeanMetric()  # a mean over images: DDP ranks with unequal shards average correctly
        self.test_metrics = nn.ModuleList()

    @property
    def num_classes(self) -> int:
        """Number of classes K of the net."""
        return self.net.num_classes

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) pixel images in [0, 1] -> (B, K, H, W) logits."""
        return self.net(images)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = segmentation_loss(self.net(batch["images"]), batch["labels"])
        self.log_train_loss(loss, batch["images"].shape[0])
        return loss

    def predict_image(self, image: torch.Tensor, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sliding-window logits and labels of one (3, H, W) image at the original ``size``: (K, H0, W0), (H0, W0)."""
        hp = self.hparams
        return predict_label_map(self.net, image, tuple(size), self.num_classes, hp.window, hp.stride)

    def validation_step(self, batch: dict[str, list], batch_idx: int) -> None:
        for image, label in zip(batch["images"], batch["labels"], strict=True):
            logits, pred = self.predict_image(image, label.shape)
            self.val_metrics.update(pred, label)
            self.val_loss.update(segmentation_loss(logits[None], label[None]))
        self.log("val/loss", self.val_loss, batch_size=len(batch["images"]))

    def on_validation_epoch_end(self) -> None:
        results = self.val_metrics.compute()
        self.val_metrics.reset()
        for name in ("mIoU", "mAcc", "aAcc"):
            self.log(f"val/{name}", results[name], prog_bar=name == "mIoU", sync_dist=True)

    @property
    def data(self) -> SegmentationData:
        """The trainer's datamodule as the :class:`SegmentationData` this module reads; TypeError names gaps."""
        return require_datamodule(self.trainer, SegmentationData)

    def on_test_start(self) -> None:
        eval_sets = self.data.eval_sets
        self.test_metrics = nn.ModuleList(SegmentationMetrics(self.num_classes, IGNORE_INDEX) for _ in eval_sets)
        self.test_metrics.to(self.device)

    def test_step(self, batch: dict[str, list], batch_idx: int, dataloader_idx: int = 0) -> None:
        for image, label in zip(batch["images"], batch["labels"], strict=True):
            self.test_metrics[dataloader_idx].update(self.predict_image(image, label.shape)[1], label)

    def on_test_epoch_end(self) -> None:
        data = self.data
        eval_sets = data.eval_sets
        metrics = zip(eval_sets, self.test_metrics, strict=True)
        per_set = {name: metric.compute() for (name, _, _), metric in metrics}
        results = corruption_results(per_set, eval_sets)
        self.log_dict({f"test/{k}": v for k, v in results.items()}, add_dataloader_idx=False, sync_dist=True)
        report_dir = self.report_dir()  # a collective: every rank asks
        if self.trainer.is_global_zero:
            write_reports(per_set, eval_sets, data.classes, report_dir)

    def predict_step(self, batch: dict[str, list], batch_idx: int, dataloader_idx: int = 0) -> dict[str, list]:
        """Predicted label maps at the original size: ``{"names": [...], "preds": [(H0, W0) uint8, ...]}``."""
        pairs = zip(batch["images"], batch["labels"], strict=True)
        preds = [self.predict_image(image, label.shape)[1].to(torch.uint8) for image, label in pairs]
        return {"names": batch["names"], "preds": preds}

    def configure_optimizers(self):
        """The optimizer over all parameters and a per-step polynomial decay to ``min_lr``."""
        optimizer = self.optimizer_factory(self.net.parameters())
        total = max(int(self.trainer.estimated_stepping_batches), 1)  # honours max_steps and max_epochs
        base_lr = optimizer.param_groups[0]["lr"]
        floor = self.hparams.min_lr / base_lr if base_lr > 0 else 0.0
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, polynomial(total, self.hparams.poly_power, floor))
        schedule = {"scheduler": scheduler, "interval": "step", "name": "train/lr"}  # the LearningRateMonitor tag
        return {"optimizer": optimizer, "lr_scheduler": schedule}
