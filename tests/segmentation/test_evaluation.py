"""Corrupted-ADE20K results: flat keys, means over severities and corruptions, and the Markdown/CSV reports."""

import csv
from pathlib import Path

import pytest
import torch

from kpca.segmentation.evaluation import corruption_results, write_reports

pytestmark = pytest.mark.mmseg

EVAL_SETS = [("clean", None, None), ("fog/s1", "fog", 1), ("fog/s2", "fog", 2), ("contrast/s1", "contrast", 1)]


def metrics(miou: float) -> dict[str, object]:
    return {"aAcc": 0.9, "mAcc": 0.8, "mIoU": miou, "IoU": torch.tensor([miou, float("nan")]), "Acc": torch.ones(2)}


PER_SET = {"clean": metrics(0.6), "fog/s1": metrics(0.5), "fog/s2": metrics(0.3), "contrast/s1": metrics(0.2)}


def test_results_average_over_severities_then_over_all_corrupted_sets():
    results = corruption_results(PER_SET, EVAL_SETS)
    assert results["clean/mIoU"] == 0.6 and results["corrupted/fog/s2/mIoU"] == 0.3
    assert results["corrupted/fog/mIoU"] == pytest.approx(0.4)
    assert results["corrupted/contrast/mIoU"] == pytest.approx(0.2)
    assert results["corrupted/mean_mIoU"] == pytest.approx((0.5 + 0.3 + 0.2) / 3)


def test_reports_are_written_as_markdown_and_csv(tmp_path: Path):
    paths = write_reports(PER_SET, EVAL_SETS, ["wall", "building "], tmp_path)
    assert sorted(p.name for p in paths) == [
        "per_class_clean.csv", "per_class_clean.md", "segmentation.csv", "segmentation.md",
    ]  # fmt: skip
    with open(tmp_path / "segmentation.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["set"], r["severity"]) for r in rows] == [
        ("clean", ""), ("fog", "1"), ("fog", "2"), ("contrast", "1"), ("fog", "mean"), ("contrast", "mean"),
        ("all corruptions", "mean"),
    ]  # fmt: skip
    assert float(rows[-1]["mIoU"]) == pytest.approx(100 / 3)
    per_class = (tmp_path / "per_class_clean.md").read_text().splitlines()
    assert per_class[2] == "| 0 | wall | 60.0000 | 100.0000 |" and per_class[3] == "| 1 | building |  | 100.0000 |"
