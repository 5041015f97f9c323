r"""The paper's word-swap attack: replace a fraction of the non-stopword words of a text with "AAA".

Two protocols, both seeded (the same text and settings always give the same attack) and both keeping
every whitespace character (newlines included), so the word count does not change:

``textattack`` (the authors': ELL ``WordAttack/src_attack/utils/vocabulary.py`` runs TextAttack's
``Augmenter(AAAWordSwap(), [StopwordModification()], pct_words_to_swap=0.015,
transformations_per_example=1, fast_augment=True).augment(line)`` on every line of valid and test,
TextAttack 0.3.x): each line on its own. Words are TextAttack's ``words_from_text``: in every
whitespace token, the runs of word characters (``\w``, ``'``, ``-``, ``_``, ``*``, ``@`` and three
homoglyphs) with leading ``'-_*@`` stripped, so ``<unk>`` holds the word ``unk``, ``U.S.`` the words
``U`` and ``S``, and ``@-@`` or ``,`` none. A word is a candidate unless it is an NLTK stopword,
compared case-sensitively (``The`` is a candidate, ``the`` is not), or already the replacement. With
W words and k candidates on a line, m = max(int(rate * W), 1) words are to be swapped; the
augmenter swaps them one at a time at random, and at the last step it draws its result uniformly
from the k - m + 1 texts with m swaps *and* the text with m - 1 swaps. So a line gets m swaps
(a uniformly random set of candidates) with probability (k - m + 1) / (k - m + 2), else m - 1;
all k when k < m; none when k = 0 (blank lines). A heading such as `` = Robert Boulter = `` (2
words, 2 candidates) keeps its words with probability 1/3. The replacement goes where the word was
inside its token (``<unk>`` becomes ``<AAA>``, which a word vocabulary reads as ``<unk>``).

``uniform`` (ours, the default): words are whitespace tokens; a word is a candidate when it
contains a letter or a digit and its lower-cased form is not a stopword. Exactly
``round(rate * candidates)`` candidates of the whole text are replaced, spread uniformly.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal

from kpca.training.choices import check_choice
from kpca.training.errors import OptionError

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
# TextAttack's words_from_text: \w, its homoglyphs that \w lacks (U+02D7, `, ×) and the exceptions '-_*@.
_TEXTATTACK_WORD = re.compile("[\\w\u02d7`\u00d7'\\-_*@]+")
_TEXTATTACK_STRIP = "'-_*@"
SwapProtocol = Literal["textattack", "uniform"]


@dataclass(frozen=True)
class WordSwap:
    """Settings of the word-swap attack (the paper: 1.5% of words become "AAA"; see the module docstring).

    Args:
        rate: fraction of words to replace, in [0, 1] (``textattack``: of each line's words; ``uniform``:
            of the candidate words of the whole text).
        replacement: the word put in their place.
        seed: seed of the choice of words.
        protocol: ``textattack`` (the authors', per line) or ``uniform`` (ours, over the whole text).
    """

    rate: float = 0.015
    replacement: str = "AAA"
    seed: int = 0
    protocol: SwapProtocol = "uniform"

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise OptionError(f"word swap rate must be in [0, 1], got {self.rate}")
        if not self.replacement or any(c.isspace() for c in self.replacement):
            raise OptionError(f"replacement must be one word without whitespace, got {self.replacement!r}")
        check_choice("data.word_swap.protocol", self.protocol, SwapProtocol)

    @property
    def tag(self) -> str:
        """A file-name-safe description, e.g. ``wordswap-0.015-AAA-seed0`` (``wordswap-textattack-...``)."""
        safe = re.sub(r"[^A-Za-z0-9]", "_", self.replacement)
        protocol = "" if self.protocol == "uniform" else f"{self.protocol}-"
        return f"wordswap-{protocol}{self.rate:g}-{safe}-seed{self.seed}"


def is_candidate(word: str) -> bool:
    """``uniform``: whether the whitespace token ``word`` may be swapped (a letter or digit, not a stopword)."""
    return bool(_ALNUM.search(word)) and word.lower() not in STOPWORDS


def textattack_word_spans(line: str) -> list[tuple[int, int]]:
    """(start, end) in ``line`` of each of TextAttack's words, located as TextAttack locates them.

    The words are ``words_from_text``'s; each is found with ``str.index`` from the end of the word
    before it, as ``AttackedText.generate_new_attacked_text`` finds the words it replaces.
    """
    spans, cursor = [], 0
    for token in line.split():
        for run in _TEXTATTACK_WORD.findall(token.lstrip(_TEXTATTACK_STRIP)):
            word = run.lstrip(_TEXTATTACK_STRIP)
            if word:
                start = line.index(word, cursor)
                cursor = start + len(word)
                spans.append((start, cursor))
    return spans


def _textattack_line(line: str, attack: WordSwap, rng: random.Random) -> tuple[str, int]:
    """One line under the ``textattack`` protocol: (attacked line, swaps)."""
    spans = textattack_word_spans(line)
    candidates = [
        (start, end)
        for start, end in spans
        if line[start:end] not in STOPWORDS and line[start:end] != attack.replacement
    ]
    target = max(int(attack.rate * len(spans)), 1)
    if len(candidates) < target:
        chosen = candidates
    else:  # the augmenter's last draw: the k - m + 1 texts with m swaps, or the one with m - 1
        n_swap = target - 1 if rng.randrange(len(candidates) - target + 2) == 0 else target
        chosen = sorted(rng.sample(candidates, n_swap))
    return _replace(line, chosen, attack.replacement), len(chosen)


def _replace(text: str, spans: list[tuple[int, int]], replacement: str) -> str:
    """``text`` with each of the sorted, disjoint ``spans`` replaced by ``replacement``."""
    pieces, cursor = [], 0
    for start, end in spans:
        pieces += [text[cursor:start], replacement]
        cursor = end
    pieces.append(text[cursor:])
    return "".join(pieces)


def word_swap(text: str, attack: WordSwap) -> tuple[str, int]:
    """Apply the attack to ``text`` (lines end with a newline).

    Returns:
        ``(attacked_text, n_swapped)``.
    """
    rng = random.Random(attack.seed)
    if attack.protocol == "textattack":
        lines = [_textattack_line(line, attack, rng) for line in text.split("\n")]
        return "\n".join(line for line, _ in lines), sum(n for _, n in lines)
    spans = [m.span() for m in _WORD.finditer(text) if is_candidate(m.group())]
    n_swap = round(attack.rate * len(spans))
    chosen = sorted(rng.sample(range(len(spans)), n_swap))
    return _replace(text, [spans[index] for index in chosen], attack.replacement), n_swap
