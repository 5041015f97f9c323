"""The paper's word-swap attack: replace a fraction of the non-stopword words of a text with "AAA".

Words are whitespace-separated tokens; a word is a candidate when it contains a letter or a digit
and its lower-cased form is not an English stopword (NLTK's list). Exactly
``round(rate * candidates)`` candidates are replaced, chosen by a seeded generator, so the attack is
deterministic; all whitespace (newlines included) is kept, so the word count does not change.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

# NLTK's English stopword list (nltk.corpus.stopwords.words("english"), 179 words), kept here to avoid a download.
STOPWORDS = frozenset(
    """i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself yourselves he him his
    himself she she's her hers herself it it's its itself they them their theirs themselves what which who whom this
    that that'll these those am is are was were be been being have has had having do does did doing a an the and but
    if or because as until while of at by for with about against between into through during before after above below
    to from up down in out on off over under again further then once here there when where why how all any both each
    few more most other some such no nor not only own same so than too very s t can will just don don't should
    should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn doesn't hadn hadn't hasn hasn't
    haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan shan't shouldn shouldn't wasn wasn't
    weren weren't won won't wouldn wouldn't""".split()  # noqa: SIM905 (179 words read better as prose)
)
_WORD = re.compile(r"\S+")
_ALNUM = re.compile(r"[^\W_]")


@dataclass(frozen=True)
class WordSwap:
    """Settings of the word-swap attack (the paper: 1.5% of non-stopword words become "AAA").

    Args:
        rate: fraction of candidate words to replace, in [0, 1].
        replacement: the word put in their place.
        seed: seed of the choice of words.
    """

    rate: float = 0.015
    replacement: str = "AAA"
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"word swap rate must be in [0, 1], got {self.rate}")
        if not self.replacement or any(c.isspace() for c in self.replacement):
            raise ValueError(f"replacement must be one word without whitespace, got {self.replacement!r}")

    @property
    def tag(self) -> str:
        """A file-name-safe description, e.g. ``wordswap-0.015-AAA-seed0``."""
        safe = re.sub(r"[^A-Za-z0-9]", "_", self.replacement)
        return f"wordswap-{self.rate:g}-{safe}-seed{self.seed}"


def is_candidate(word: str) -> bool:
    """Whether ``word`` may be swapped: it has a letter or digit and is not a stopword."""
    return bool(_ALNUM.search(word)) and word.lower() not in STOPWORDS


def word_swap(text: str, attack: WordSwap) -> tuple[str, int]:
    """Apply the attack to ``text``.

    Returns:
        ``(attacked_text, n_swapped)``.
    """
    spans = [m.span() for m in _WORD.finditer(text) if is_candidate(m.group())]
    n_swap = round(attack.rate * len(spans))
    chosen = sorted(random.Random(attack.seed).sample(range(len(spans)), n_swap))
    pieces, cursor = [], 0
    for index in chosen:
        start, end = spans[index]
        pieces += [text[cursor:start], attack.replacement]
        cursor = end
    pieces.append(text[cursor:])
    return "".join(pieces), n_swap
