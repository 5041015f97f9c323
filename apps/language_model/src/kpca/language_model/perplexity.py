"""Perplexity arithmetic: summed NLL over scored tokens, token-level and word-level perplexity, the report.

token-level perplexity = exp(total NLL / scored tokens); word-level perplexity = exp(total NLL /
words), with words counted on the original text (:func:`kpca.language_model.corpus.count_words`),
so it does not depend on the tokenizer. With the word tokenizer on ``wiki.*.tokens`` the two are
equal, and they are the authors' perplexity when the evaluation follows their protocol. The report
(``perplexity.csv``) is declared for ``kpca-report`` by :data:`PERPLEXITY_REPORT`, registered as the
``language_model`` report task, with the protocol rules of its two column groups (:func:`perplexity_protocols`,
docs/protocols.md); ``test`` records the run's protocol next to the report (``protocol.json``, a "Protocol" section).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torchmetrics import Metric

from kpca.training.errors import OptionError
from kpca.training.results.protocol import WHOLE_TEST_SET, ProtocolRule, Setting, config_entry, record_protocol
from kpca.training.results.schema import ReportSchema
from kpca.training.results.tables import markdown_table, write_report


def read_perplexity_report(path: Path) -> dict[str, float]:
    """``perplexity.csv``: word-level perplexity of each evaluated set, as ``<set>/ppl``."""
    with path.open(newline="") as stream:
        return {f"{row['set']}/ppl": float(row["ppl_word"]) for row in csv.DictReader(stream)}


SLIDING_WINDOW_PROTOCOL = (
    Setting("data.text_files", "tokens"),
    Setting("data.tokenizer.kind", "word", name="tokenizer"),
    Setting("data.tokenizer.min_freq", 0, name="min_freq"),
    Setting("data.context", 256, name="window"),
    Setting("data.eval_stride", 1, default="context / 2"),
    Setting("data.score_first_token", False),
    *WHOLE_TEST_SET,
)
"""The authors' perplexity (inferred, docs/protocols.md): ``wiki.*.tokens`` with their word vocabulary, windows of 256
tokens sliding by 1, the split's first token as context only, every token of the split."""

CJK_WORD_SPLIT = (
    "lines with CJK characters are split into words on whitespace (published: TextAttack segments them with jieba)"
)
"""The word-swap difference no setting removes (docs/protocols.md, "LM word swap")."""

SEES_LATER_TOKENS = (
    "this Elliptical model (convention: reference, the authors' code) sees later tokens of its segment when it "
    "trains and evaluates, as the authors' WikiText-103 model does (its estimate is the segment's mean): its "
    "perplexity is comparable with the paper's, not with a causal model's"
)
"""The note of every perplexity group of an Elliptical LM with the authors' convention (docs/protocols.md)."""


def model_notes(config: Mapping) -> tuple[str, ...]:
    """The notes the evaluated model brings to every group (a saved config): the authors' Elliptical sees ahead."""
    attention = config_entry(config, "model.net.attention")
    reference = isinstance(attention, Mapping) and attention.get("convention") == "reference"
    return (SEES_LATER_TOKENS,) if reference and attention.get("kind") == "elliptical" else ()


def perplexity_protocols(config: Mapping) -> tuple[ProtocolRule, ...]:
    """The protocol rules of ``perplexity.csv``'s column groups, clean and word-swapped perplexity, for a run's config.

    Both carry the model's notes (:func:`model_notes`).
    """
    notes = model_notes(config)
    return (
        ProtocolRule("clean", r"(train|valid|test)/ppl", SLIDING_WINDOW_PROTOCOL, notes=notes),
        ProtocolRule(
            "word_swap",
            r"(train|valid|test)_wordswap/ppl",
            (
                *SLIDING_WINDOW_PROTOCOL,
                Setting("data.word_swap.protocol", "textattack", name="word_swap"),
                Setting("data.word_swap.rate", 0.015, name="swap_rate"),
                Setting("data.word_swap.replacement", "AAA", name="replacement"),
            ),
            fixed=(CJK_WORD_SPLIT,),
            notes=notes,
        ),
    )


PERPLEXITY_REPORT = ReportSchema(
    stem="perplexity",
    read=read_perplexity_report,
    columns=(r"valid/ppl", r"valid_wordswap/ppl", r"test/ppl", r"test_wordswap/ppl"),
    protocols=perplexity_protocols,
    attention_task="language",
)
"""The ``language_model`` report task of ``kpca-report``: what :func:`write_perplexity_report` writes."""


class NLLTotals(Metric):
    """Sums of token NLL (float64) and of scored tokens, over batches and (on ``compute``) over processes."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("nll", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, nll: torch.Tensor, scored: torch.Tensor) -> None:
        """Add the NLL of the scored positions; ``nll`` and ``scored`` have the same shape."""
        if nll.shape != scored.shape:
            raise OptionError(f"nll {tuple(nll.shape)} and scored {tuple(scored.shape)} must have the same shape")
        self.nll += nll.double()[scored].sum()
        self.tokens += scored.sum()

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(total NLL, number of scored tokens)."""
        return self.nll, self.tokens


def perplexities(total_nll: float, tokens: int, words: float) -> dict[str, float]:
    """Mean NLL per token, token-level and word-level perplexity of ``tokens`` tokens making ``words`` words."""
    if tokens <= 0 or words <= 0:
        raise OptionError(f"need tokens > 0 and words > 0 to compute a perplexity, got {tokens} and {words}")
    return {
        "nll_token": total_nll / tokens,
        "ppl_token": math.exp(total_nll / tokens),
        "ppl_word": math.exp(total_nll / words),
    }


def perplexity_rows(sets: Mapping[str, tuple[NLLTotals, int, int, int]]) -> list[dict]:
    """One row per evaluation set from synced totals: set, tokens, words, nll_token, ppl_token, ppl_word, complete.

    ``sets`` maps a name to (totals, words of the whole set, tokens of the whole set, tokens the
    evaluation scores: all of them, or all but the first under the authors' protocol). The word count
    is scaled by the scored share of the set's tokens, so ``ppl_word`` is per scored word (with the
    word tokenizer exactly the authors' T - 1 when the first token is context only), and estimates
    the full set's when only part was scored (``limit_*_batches``, ``fast_dev_run``; then ``complete``
    is False) instead of collapsing towards 1.
    """
    rows = []
    for name, (totals, words, set_tokens, expected) in sets.items():
        nll, tokens = (float(x) for x in totals.compute())
        tokens = int(tokens)
        scored_words = words if tokens == set_tokens else max(words * tokens / set_tokens, 1e-9)
        row = {"set": name, "tokens": tokens, "words": words, **perplexities(nll, tokens, scored_words)}
        rows.append({**row, "complete": tokens == expected})
    return rows


def write_perplexity_report(rows: list[dict], out_dir: str | os.PathLike[str]) -> None:
    """Write ``perplexity.md`` / ``perplexity.csv`` (atomically) with each attacked set beside its clean one.

    The file stem is :data:`PERPLEXITY_REPORT`'s, the name ``kpca-report`` reads. The run's protocol, from the
    ``config.yaml`` in ``out_dir``, goes into ``protocol.json`` and a "Protocol" section of the Markdown.
    """
    clean = {row["set"]: row for row in rows if not row["set"].endswith("_wordswap")}
    for row in rows:
        base = clean.get(row["set"].removesuffix("_wordswap"))
        row["ppl_word_vs_clean"] = row["ppl_word"] / base["ppl_word"] if base else None
    section = record_protocol(PERPLEXITY_REPORT.protocols, out_dir, [f"{row['set']}/ppl" for row in rows])
    write_report(rows, out_dir, PERPLEXITY_REPORT.stem, show=True, markdown=markdown_table(rows) + section)
