"""Corrupted-ADE20K results: flat keys, means over severities and corruptions, and the Markdown/CSV reports."""

import csv
from pathlib import Path

import pytest
import torch

from kpca.segmentation.corruption_sets import resolve_corruption_set
from kpca.segmentation.evaluation import SEGMENTATION_REPORT, corruption_results, summary_rows, write_reports

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
    assert [(r["set"], r["severity"], r["sets"]) for r in rows] == [
        ("clean", "", "1"), ("fog", "1", "1"), ("fog", "2", "1"), ("contrast", "1", "1"), ("fog", "mean", "2"),
        ("contrast", "mean", "1"), ("all corruptions", "mean", "3"),
    ]  # fmt: skip
    assert float(rows[-1]["mIoU"]) == pytest.approx(100 / 3)
    per_class = (tmp_path / "per_class_clean.md").read_text().splitlines()
    assert per_class[2] == "| 0 | wall | 60.0000 | 100.0000 |" and per_class[3] == "| 1 | building |  | 100.0000 |"


def test_the_report_schema_reads_the_clean_and_corrupted_means_the_writer_writes(tmp_path: Path):
    write_reports(PER_SET, EVAL_SETS, ["wall", "building"], tmp_path)
    metrics = SEGMENTATION_REPORT.read(tmp_path / f"{SEGMENTATION_REPORT.stem}.csv")
    assert metrics == pytest.approx(
        {"clean/aAcc": 90.0, "clean/mAcc": 80.0, "clean/mIoU": 60.0,
         "corrupted/aAcc": 90.0, "corrupted/mAcc": 80.0, "corrupted/mIoU": 100 / 3}
    )  # fmt: skip


def test_the_corrupted_mean_is_over_exactly_the_chosen_sets():
    every = resolve_corruption_set("elliptical", severities=[1, 2, 3, 4, 5]).pairs()  # metrics for 19 x 5 sets
    per_set = {f"{c}/s{s}": metrics(0.01 * (i % 7) + 0.1 * s) for i, (c, s) in enumerate(every)} | {"clean": metrics(1)}
    chosen = resolve_corruption_set("elliptical").pairs()  # the group's 19 x severities 1-3
    eval_sets = [("clean", None, None)] + [(f"{c}/s{s}", c, s) for c, s in chosen]
    expected = sum(float(per_set[f"{c}/s{s}"]["mIoU"]) for c, s in chosen) / 57
    assert corruption_results(per_set, eval_sets)["corrupted/mean_mIoU"] == pytest.approx(expected, rel=1e-12)
    assert expected != pytest.approx(sum(float(per_set[f"{c}/s{s}"]["mIoU"]) for c, s in every) / 95)
    last = summary_rows(per_set, eval_sets)[-1]
    assert last["set"] == "all corruptions" and last["sets"] == 57 and last["mIoU"] == pytest.approx(100 * expected)
    with pytest.raises(ValueError, match=r"no metrics for the evaluation set\(s\) \['rain/s1'\]"):
        corruption_results(per_set, [*eval_sets, ("rain/s1", "rain", 1)])
