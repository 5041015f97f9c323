"""The demo plan (``make demo-lm``, configs/experiments/demo_lm.yaml), run end to end on a tiny budget (slow)."""

import csv
from pathlib import Path

import pytest

from tests.training.test_experiment_report import PLANS, run_plan_copy

LABELS = ("symmetric softmax", "RPC (2 PAP iterations, all blocks)")


@pytest.mark.slow
def test_demo_plan_end_to_end_on_a_tiny_budget(tmp_path: Path, lm_cache_dir: Path):
    out = tmp_path / "demo-lm"
    text = run_plan_copy(
        PLANS / "demo_lm.yaml",
        out,
        [
            f"--data.cache_dir={lm_cache_dir}", "--data.tokenizer.vocab_size=500", "--data.context=32",
            "--data.eval_stride=32", "--model.net.init_args.width=32", "--model.net.init_args.depth=1",
            "--model.net.init_args.num_heads=2", "--model.net.init_args.ffn_dim=64",
            "--model.generation.max_new_tokens=4", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2", "--trainer.log_every_n_steps=1",
        ],
    )  # fmt: skip
    assert text.startswith("# Symmetric vs RPC language models on the built-in corpus\n")
    assert "## Results (`kpca-report" in text and "## Status" not in text
    assert "| model | seeds | valid/ppl | valid_wordswap/ppl | test/ppl | test_wordswap/ppl |" in text
    for headline in ("valid perplexity", "valid perplexity, word-swapped", "test perplexity"):
        (line,) = [line for line in text.splitlines() if line.startswith(f"- {headline} (lower is better):")]
        assert all(label in line for label in LABELS) and "higher" in line, line
    samples = text.split("## Samples (predict step, seed 0)\n")[1]
    assert text.count("    A function is") == 2 and all(f"{label}:\n" in samples for label in LABELS)
    for kind in ("symmetric", "rpc"):  # each run's perplexity report, word and token level per set
        assert f"[{kind}/seed0/test/perplexity.md]" in text and (out / kind / "seed0" / "predict.done").is_file()
    with open(out / "comparison.csv") as f:  # kpca-report: one row per model, word-level ppl per set
        rows = {row["kind"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == ["rpc", "symmetric"]
    assert all(float(row["test/ppl"]) > 1 and float(row["test_wordswap/ppl"]) > 1 for row in rows.values())
    assert len(list(out.glob("*/seed0/fit/checkpoints/best-*.ckpt"))) == 2
