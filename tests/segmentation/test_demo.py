"""The segmentation demo: its report from two test runs, and (slow) a whole tiny run through the CLI."""

import csv
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from kpca.segmentation import demo
from kpca.segmentation.evaluation import write_reports
from tests.segmentation.test_evaluation import EVAL_SETS, PER_SET, metrics

pytestmark = pytest.mark.mmseg


def test_report_compares_both_models_per_set_and_names_the_winner(tmp_path: Path):
    write_reports(PER_SET, EVAL_SETS, ["a", "b"], tmp_path / "sym")
    write_reports({**PER_SET, "clean": metrics(0.7)}, EVAL_SETS, ["a", "b"], tmp_path / "rpc")
    results = {kind: demo.read_results(tmp_path / kind) for kind in ("sym", "rpc")}
    assert list(results["sym"]) == [
        "clean", "fog/1", "fog/2", "contrast/1", "fog/mean", "contrast/mean", "all corruptions",
    ]  # fmt: skip
    rows = demo.comparison_rows({"symmetric": results["sym"], "rpc": results["rpc"]})
    assert rows[0]["rpc - symmetric"] == pytest.approx(10.0) and rows[-1]["rpc - symmetric"] == 0
    text = demo.markdown(rows, seconds=90)
    assert "- clean mIoU: Segmenter 60.00, RPC-Segmenter 70.00 (RPC-Segmenter higher by 10.00)" in text
    assert "neither higher" in text and "1.5 min" in text


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The dirpath has changed from")  # the test run logs into a new version folder
def test_demo_end_to_end_on_a_tiny_budget(tmp_path: Path, seg_cache_dir: Path):
    configs = Path(__file__).resolve().parents[2] / "configs"
    with mock.patch.object(sys, "argv", ["demo"]):  # as `python -m kpca.segmentation.demo` leaves it
        report = demo.run(
            [
                f"--out={tmp_path}", f"--configs={configs}", f"--data.cache_dir={seg_cache_dir}",
                "--data.synthetic.num_train=16", "--data.synthetic.num_val=4", "--data.synthetic.image_size=48",
                "--data.scale=[192,48]", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
                "--trainer.log_every_n_steps=1", "--data.corruptions=[contrast]", "--data.severities=[1]",
            ]
        )  # fmt: skip
    assert "| clean |" in report.read_text() and (tmp_path / "predictions.png").stat().st_size > 0
    with open(tmp_path / "per_set.csv") as f:
        assert [row["set"] for row in csv.DictReader(f)] == ["clean", "contrast/1", "contrast/mean", "all corruptions"]
    with open(tmp_path / "comparison.csv") as f:  # kpca-report: one row per model
        rows = {row["kind"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == ["rpc", "symmetric"] and all(row["status"] == "complete" for row in rows.values())
    per_set = demo.read_results(next((tmp_path / "rpc").glob("version_*/segmentation.csv")).parent)
    assert float(rows["rpc"]["clean/mIoU"]) == pytest.approx(per_set["clean"])
    assert float(rows["rpc"]["corrupted/mIoU"]) == pytest.approx(per_set["all corruptions"])
    assert "## Results (`kpca-report" in report.read_text()
    for kind in ("symmetric", "rpc"):  # symmetric projections (K, V rows only) in every encoder and decoder block
        (best,) = tmp_path.glob(f"{kind}/version_*/checkpoints/best-*.ckpt")
        state = torch.load(best, weights_only=True)["state_dict"]
        rows = {k: w.shape[0] for k, w in state.items() if k.endswith("attn.qkv.weight")}
        assert len(rows) == 4 + 2 and set(rows.values()) == {2 * 96}, (kind, rows)
