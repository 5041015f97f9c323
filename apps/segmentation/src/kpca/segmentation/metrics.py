"""Semantic-segmentation metrics with mmseg ``IoUMetric`` semantics: pixel accuracy, mean accuracy, mIoU.

Legend: K classes, P labelled pixels. The four per-class areas are summed exactly (int64) over images and, under
DDP, over ranks (torchmetrics ``dist_reduce_fx="sum"``), so the result does not depend on batching or sharding.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric

from kpca.training.errors import OptionError

IGNORE_INDEX = 255
"""The label of pixels left out of losses and metrics (ADE20K's 0 "other" after ``reduce_zero_label``)."""


def intersect_and_union(
    pred: torch.Tensor, label: torch.Tensor, num_classes: int, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-class areas of one prediction against its label map (mmseg's ``IoUMetric.intersect_and_union``).

    Args:
        pred: (...) int predicted classes in [0, K).
        label: (...) int labels, same shape; ``ignore_index`` pixels are left out.
        num_classes: K.
        ignore_index: label value to ignore.

    Returns:
        ``(intersect, union, pred_area, label_area)``, each (K,) int64 pixel counts.
    """
    if pred.shape != label.shape:
        raise OptionError(f"pred {tuple(pred.shape)} and label {tuple(label.shape)} must have the same shape")
    keep = label != ignore_index
    pred, label = pred[keep].long(), label[keep].long()  # (P,), (P,)
    if label.numel() and (label.min() < 0 or label.max() >= num_classes):
        raise OptionError(f"labels must be in [0, {num_classes}) or {ignore_index}, got {label.unique().tolist()}")
    intersect = torch.bincount(pred[pred == label], minlength=num_classes)  # (K,)
    pred_area = torch.bincount(pred, minlength=num_classes)  # (K,)
    label_area = torch.bincount(label, minlength=num_classes)  # (K,)
    return intersect, pred_area + label_area - intersect, pred_area, label_area


def summarize(
    intersect: torch.Tensor, union: torch.Tensor, label_area: torch.Tensor
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """The ``aAcc``, ``mAcc`` and ``mIoU`` (fractions, not %) of mmseg and the per-class ``IoU`` and ``Acc`` (K,).

    Classes absent from both prediction and label (union 0) have IoU NaN, classes absent from the labels have
    Acc NaN; the means skip NaNs, as mmseg's ``np.nanmean``.
    """
    intersect, union, label_area = intersect.double(), union.double(), label_area.double()
    iou = intersect / union  # (K,)
    acc = intersect / label_area  # (K,)
    overall = {
        "aAcc": float(intersect.sum() / label_area.sum()),
        "mAcc": float(acc.nanmean()),
        "mIoU": float(iou.nanmean()),
    }
    return overall, {"IoU": iou, "Acc": acc}


class SegmentationMetrics(Metric):
    """Accumulate per-class intersection, union, prediction and label areas; compute aAcc, mAcc and mIoU.

    Args:
        num_classes: K.
        ignore_index: label value left out (ADE20K with ``reduce_zero_label``: 255).
    """

    full_state_update = False

    def __init__(self, num_classes: int, ignore_index: int = IGNORE_INDEX) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        for name in ("intersect", "union", "pred_area", "label_area"):
            self.add_state(name, torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, label: torch.Tensor) -> None:
        """Add one prediction (or a batch of equally shaped ones) and its labels, same shape."""
        intersect, union, pred_area, label_area = intersect_and_union(pred, label, self.num_classes, self.ignore_index)
        self.intersect += intersect
        self.union += union
        self.pred_area += pred_area
        self.label_area += label_area

    def compute(self) -> dict[str, float | torch.Tensor]:
        """``aAcc``, ``mAcc``, ``mIoU`` (in [0, 1]); per-class ``IoU``, ``Acc`` ((K,) float64, NaN if undefined)."""
        overall, per_class = summarize(self.intersect, self.union, self.label_area)
        return {**overall, **per_class}
