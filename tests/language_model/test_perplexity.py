"""Perplexity arithmetic on hand examples: token-level, word-level, partial sets, the report."""

import csv
import math
from pathlib import Path

import pytest
import torch

from kpca.language_model.perplexity import (
    PERPLEXITY_REPORT,
    NLLTotals,
    perplexities,
    perplexity_rows,
    write_perplexity_report,
)


def test_totals_sum_the_scored_positions_only_in_float64():
    totals = NLLTotals()
    totals.update(torch.tensor([1.0, 2.0, 100.0]), torch.tensor([True, True, False]))
    totals.update(torch.tensor([[0.5, 0.25]]), torch.tensor([[True, True]]))
    nll, tokens = totals.compute()
    assert nll.dtype == torch.float64 and nll.item() == 3.75 and tokens.item() == 4
    with pytest.raises(ValueError, match="same shape"):
        totals.update(torch.zeros(3), torch.ones(2, dtype=torch.bool))


def test_word_level_perplexity_divides_the_total_nll_by_the_words_of_the_text():
    # 6 tokens of 0.5 nats each make "The cat sat .\n": 4 words + 1 end of line = 5 words.
    result = perplexities(total_nll=3.0, tokens=6, words=5)
    assert result["nll_token"] == 0.5
    assert result["ppl_token"] == pytest.approx(math.exp(0.5))
    assert result["ppl_word"] == pytest.approx(math.exp(3.0 / 5))
    with pytest.raises(ValueError, match="tokens > 0"):
        perplexities(1.0, 0, 5)


def test_rows_scale_the_words_of_a_partly_scored_set():
    full, half = NLLTotals(), NLLTotals()
    full.update(torch.full((10,), 2.0), torch.ones(10, dtype=torch.bool))
    half.update(torch.full((5,), 2.0), torch.ones(5, dtype=torch.bool))
    rows = perplexity_rows({"valid": (full, 4, 10, 10), "test": (half, 4, 10, 10)})
    assert rows[0]["complete"] and rows[0]["ppl_word"] == pytest.approx(math.exp(20.0 / 4))
    assert not rows[1]["complete"] and rows[1]["ppl_word"] == pytest.approx(math.exp(10.0 / 2))


def test_report_puts_attacked_sets_beside_their_clean_set(tmp_path: Path):
    rows = [
        {"set": "test", "tokens": 10, "words": 5, "ppl_word": 20.0},
        {"set": "test_wordswap", "tokens": 10, "words": 5, "ppl_word": 25.0},
    ]
    write_perplexity_report(rows, tmp_path)
    with (tmp_path / "perplexity.csv").open() as stream:
        table = list(csv.DictReader(stream))
    assert [r["set"] for r in table] == ["test", "test_wordswap"]
    assert float(table[1]["ppl_word_vs_clean"]) == pytest.approx(1.25)
    assert "| test_wordswap |" in (tmp_path / "perplexity.md").read_text()


def test_the_report_schema_reads_what_the_writer_writes(tmp_path: Path):
    rows = [
        {"set": "valid", "tokens": 10, "words": 5, "ppl_word": 20.0},
        {"set": "test", "tokens": 8, "words": 4, "ppl_word": 22.5},
    ]
    write_perplexity_report(rows, tmp_path)
    assert PERPLEXITY_REPORT.read(tmp_path / f"{PERPLEXITY_REPORT.stem}.csv") == {"valid/ppl": 20.0, "test/ppl": 22.5}


def test_without_the_first_token_a_word_level_set_is_complete_and_divides_by_the_scored_words():
    totals = NLLTotals()  # the authors' protocol: 10 words (= tokens), the first one context only
    totals.update(torch.full((9,), 2.0), torch.ones(9, dtype=torch.bool))
    (row,) = perplexity_rows({"test": (totals, 10, 10, 9)})
    assert row["complete"] and row["tokens"] == 9
    assert row["ppl_word"] == row["ppl_token"] == pytest.approx(math.exp(2.0))
