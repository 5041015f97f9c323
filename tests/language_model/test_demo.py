"""The language-model demo: its report from test and predict outputs, and (slow) a whole tiny run through the CLI."""

import csv
import json
import sys
from pathlib import Path
from unittest import mock

import pytest

from kpca.language_model import demo
from kpca.language_model.perplexity import write_perplexity_report


def rows(valid_ppl: float, swapped_ppl: float) -> list[dict]:
    """perplexity_rows-like rows for valid and its word-swapped copy (token ppl = word ppl / 10)."""
    return [
        {"set": name, "tokens": 20, "words": 10, "nll_token": 0.0, "ppl_token": ppl / 10, "ppl_word": ppl,
         "complete": True}
        for name, ppl in (("valid", valid_ppl), ("valid_wordswap", swapped_ppl))
    ]  # fmt: skip


def test_report_tabulates_both_models_and_says_what_the_word_swap_does(tmp_path: Path):
    write_perplexity_report(rows(100.0, 120.0), tmp_path / "sym")
    write_perplexity_report(rows(90.0, 99.0), tmp_path / "rpc")
    results = {kind: demo.read_perplexities(tmp_path / short) for kind, short in (("symmetric", "sym"), ("rpc", "rpc"))}
    assert results["rpc"] == {
        "valid": {"ppl_word": 90.0, "ppl_token": 9.0},
        "valid_wordswap": {"ppl_word": 99.0, "ppl_token": 9.9},
    }
    (tmp_path / "predictions.jsonl").write_text(json.dumps({"prompt": "The", "text": "The end\nof it"}) + "\n")
    samples = {kind: demo.read_samples(tmp_path) for kind in demo.KINDS}
    text = demo.markdown(results, samples, seconds=150)
    assert "| valid | 100.00 | 90.00 | 10.00 | 9.00 |" in text
    assert "| valid_wordswap | 120.00 | 99.00 | 12.00 | 9.90 |" in text
    assert "- valid, symmetric: word swap multiplies perplexity by 1.200" in text
    assert "- valid, RPC: word swap multiplies perplexity by 1.100" in text
    assert "- valid: RPC has the lower clean perplexity" in text
    assert "    The end\n    of it" in text and "2.5 min" in text


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The dirpath has changed from")  # test and predict log into new version folders
def test_demo_end_to_end_on_a_tiny_budget(tmp_path: Path, lm_cache_dir: Path):
    configs = Path(__file__).resolve().parents[2] / "configs"
    with mock.patch.object(sys, "argv", ["demo"]):  # as `python -m kpca.language_model.demo` leaves it
        report = demo.run(
            [
                f"--out={tmp_path}", f"--configs={configs}", f"--data.cache_dir={lm_cache_dir}",
                "--data.tokenizer.vocab_size=500", "--data.context=32", "--data.eval_stride=32",
                "--model.net.init_args.width=32", "--model.net.init_args.depth=1", "--model.net.init_args.num_heads=2",
                "--model.net.init_args.ffn_dim=64", "--model.generation.max_new_tokens=4", "--trainer.max_epochs=1",
                "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",
                "--trainer.log_every_n_steps=1",
            ]
        )  # fmt: skip
    text = report.read_text()
    for name in ("valid", "valid_wordswap", "test", "test_wordswap"):
        assert f"| {name} |" in text
    assert text.count("    A function is") == 2  # one sample per model for each prompt
    assert "## Results (`kpca-report" in text
    with open(tmp_path / "comparison.csv") as f:  # kpca-report: one row per model, word-level ppl per set
        rows = {row["kind"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == ["rpc", "symmetric"]
    assert all(float(row["test/ppl"]) > 1 and float(row["test_wordswap/ppl"]) > 1 for row in rows.values())
    assert len(list(tmp_path.glob("*/version_*/checkpoints/best-*.ckpt"))) == 2
