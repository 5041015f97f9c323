"""Segmentation metrics: a hand example, and agreement with mmseg's IoUMetric and torchmetrics."""

import warnings

import numpy as np
import pytest
import torch
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

import kpca.segmentation  # noqa: F401 (shim before mmseg)
from kpca.segmentation.metrics import SegmentationMetrics, intersect_and_union

pytestmark = pytest.mark.mmseg

# 3 classes; 255 ignored. Pixel by pixel: label 0 0 0 1 1 2 255 255, pred 0 0 1 1 2 2 0 1.
LABEL = torch.tensor([[0, 0, 0, 1], [1, 2, 255, 255]])
PRED = torch.tensor([[0, 0, 1, 1], [2, 2, 0, 1]])


def test_iou_arithmetic_on_a_hand_example():
    intersect, union, pred_area, label_area = intersect_and_union(PRED, LABEL, num_classes=3)
    assert intersect.tolist() == [2, 1, 1]
    assert pred_area.tolist() == [2, 2, 2]  # the two ignored pixels do not count
    assert label_area.tolist() == [3, 2, 1]
    assert union.tolist() == [3, 3, 2]
    metric = SegmentationMetrics(num_classes=3)
    metric.update(PRED, LABEL)
    results = metric.compute()
    assert results["aAcc"] == pytest.approx(4 / 6)
    assert results["mIoU"] == pytest.approx((2 / 3 + 1 / 3 + 1 / 2) / 3)
    assert results["mAcc"] == pytest.approx((2 / 3 + 1 / 2 + 1) / 3)


def test_absent_classes_are_nan_and_left_out_of_the_means():
    metric = SegmentationMetrics(num_classes=5)
    metric.update(PRED, LABEL)
    results = metric.compute()
    assert torch.isnan(results["IoU"][3:]).all() and torch.isnan(results["Acc"][3:]).all()
    assert results["mIoU"] == pytest.approx((2 / 3 + 1 / 3 + 1 / 2) / 3)


def test_labels_outside_the_classes_are_rejected():
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\) or 255"):
        intersect_and_union(PRED, torch.full_like(LABEL, 7), num_classes=3)


def test_matches_mmseg_iou_metric_on_random_maps():
    with warnings.catch_warnings():  # mmcv-lite warns that MultiScaleDeformableAttention is unavailable
        warnings.simplefilter("ignore", UserWarning)
        from mmseg.evaluation import IoUMetric
    generator = torch.Generator().manual_seed(0)
    preds = [torch.randint(0, 6, (9, 11), generator=generator) for _ in range(3)]
    labels = [torch.randint(0, 7, (9, 11), generator=generator) for _ in range(3)]
    labels = [torch.where(label == 6, 255, label) for label in labels]
    reference = IoUMetric(iou_metrics=["mIoU"])
    reference.dataset_meta = {"classes": [str(i) for i in range(6)]}
    metric = SegmentationMetrics(num_classes=6)
    for pred, label in zip(preds, labels, strict=True):
        sample = {"pred_sem_seg": {"data": pred[None]}, "gt_sem_seg": {"data": label[None]}}
        reference.process([], [sample])
        metric.update(pred, label)
    with warnings.catch_warnings():  # IoUMetric prints its table through mmengine's logger
        warnings.simplefilter("ignore")
        expected = reference.compute_metrics(reference.results)  # percentages, rounded to 2 decimals
    results = metric.compute()
    for name in ("aAcc", "mIoU", "mAcc"):
        assert 100 * results[name] == pytest.approx(expected[name], abs=0.006)


def test_matches_torchmetrics_per_class():
    generator = torch.Generator().manual_seed(1)
    pred = torch.randint(0, 4, (5, 13, 17), generator=generator)  # (B, H, W)
    label = torch.randint(0, 5, (5, 13, 17), generator=generator)
    label[label == 4] = 255
    metric = SegmentationMetrics(num_classes=4)
    metric.update(pred, label)
    results = metric.compute()
    jaccard = MulticlassJaccardIndex(num_classes=4, ignore_index=255, average=None)(pred, label)
    accuracy = MulticlassAccuracy(num_classes=4, ignore_index=255, average=None)(pred, label)
    micro = MulticlassAccuracy(num_classes=4, ignore_index=255, average="micro")(pred, label)
    np.testing.assert_allclose(results["IoU"].numpy(), jaccard.double().numpy(), rtol=1e-6)
    np.testing.assert_allclose(results["Acc"].numpy(), accuracy.double().numpy(), rtol=1e-6)
    assert results["aAcc"] == pytest.approx(float(micro))
