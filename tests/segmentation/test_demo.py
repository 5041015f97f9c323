"""The demo plan (``make demo-seg``, configs/experiments/demo_seg.yaml), run end to end on a tiny budget (slow)."""

import csv
import json
from pathlib import Path

import pytest
import torch

from kpca.segmentation.evaluation import read_segmentation_report
from tests.training.test_experiment_report import PLANS, run_plan_copy

pytestmark = pytest.mark.mmseg

LABELS = ("Segmenter (symmetric)", "RPC-Segmenter (6 PAP iterations, enc. + dec. block 0)")


@pytest.mark.slow
def test_demo_plan_end_to_end_on_a_tiny_budget(tmp_path: Path, seg_cache_dir: Path):
    out = tmp_path / "demo-seg"
    text = run_plan_copy(
        PLANS / "demo_seg.yaml",
        out,
        [
            f"--data.cache_dir={seg_cache_dir}", "--data.synthetic.num_train=16", "--data.synthetic.num_val=4",
            "--data.synthetic.image_size=48", "--data.scale=[192,48]", "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2", "--trainer.log_every_n_steps=1", "--data.eval.corruptions=[contrast]",
            "--data.eval.severities=[1]",
        ],
    )  # fmt: skip
    assert text.startswith("# Segmenter vs RPC-Segmenter on the built-in synthetic ADE20K")
    assert "## Results (`kpca-report" in text and "## Status" not in text
    for headline in ("clean mIoU", "mean corrupted mIoU"):
        (line,) = [line for line in text.splitlines() if line.startswith(f"- {headline}:")]
        assert all(label in line for label in LABELS), line
    with open(out / "comparison.csv") as f:  # kpca-report: one row per model
        rows = {row["kind"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == ["rpc", "symmetric"] and all(row["status"] == "complete" for row in rows.values())
    test_dir = out / "rpc" / "seed0" / "test"
    record = json.loads((out / "rpc" / "seed0" / "test.done").read_text())
    assert Path(record["checkpoint"]).name == "last.ckpt", record  # the test set is the validation set
    per_set = read_segmentation_report(test_dir / "segmentation.csv")
    assert float(rows["rpc"]["clean/mIoU"]) == pytest.approx(per_set["clean/mIoU"])
    assert float(rows["rpc"]["corrupted/mIoU"]) == pytest.approx(per_set["corrupted/mIoU"])
    with open(test_dir / "segmentation.csv") as f:  # the linked per-set report: every evaluation set
        sets = [(row["set"], row["severity"]) for row in csv.DictReader(f)]
    assert sets == [("clean", ""), ("contrast", "1"), ("contrast", "mean"), ("all corruptions", "mean")]
    assert "[rpc/seed0/test/segmentation.md](rpc/seed0/test/segmentation.md)" in text
    for kind in ("symmetric", "rpc"):  # symmetric projections (K, V rows only) in every encoder and decoder block
        (best,) = (out / kind / "seed0" / "fit" / "checkpoints").glob("best-*.ckpt")
        state = torch.load(best, weights_only=True)["state_dict"]
        rows = {k: w.shape[0] for k, w in state.items() if k.endswith("attn.qkv.weight")}
        assert len(rows) == 4 + 2 and set(rows.values()) == {2 * 96}, (kind, rows)
