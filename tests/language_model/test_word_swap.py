"""The word-swap attack: rate, determinism, stopwords and layout kept; the authors' per-line TextAttack protocol."""

import random
import re
from collections import Counter
from pathlib import Path

import pytest

from kpca.language_model.corpus import count_words, split_file
from kpca.language_model.word_swap import STOPWORDS, WordSwap, is_candidate, textattack_word_spans, word_swap

TEXTATTACK = WordSwap(protocol="textattack")


def test_swaps_the_rate_of_candidate_words_and_keeps_every_space(corpus_folder: Path):
    text = split_file(corpus_folder, "valid").read_text()
    candidates = [w for w in text.split() if is_candidate(w)]
    attacked, swapped = word_swap(text, WordSwap())
    assert swapped == round(0.015 * len(candidates)) > 10
    before, after = text.split(), attacked.split()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == swapped and all(b == "AAA" and is_candidate(a) for a, b in changed)
    assert re.sub(r"\S+", "w", attacked) == re.sub(r"\S+", "w", text)  # same whitespace, newlines included
    assert count_words(attacked) == count_words(text)


def test_is_seeded_and_deterministic():
    text = " ".join(f"word{i}" for i in range(1000))
    assert word_swap(text, WordSwap(seed=3)) == word_swap(text, WordSwap(seed=3))
    assert word_swap(text, WordSwap(seed=3))[0] != word_swap(text, WordSwap(seed=4))[0]
    assert word_swap(text, WordSwap(rate=0.0)) == (text, 0)
    assert word_swap(text, WordSwap(rate=1.0, replacement="ZZZ"))[0] == " ".join(["ZZZ"] * 1000)


def test_stopwords_and_punctuation_are_never_candidates():
    assert len(STOPWORDS) == 179
    assert not any(is_candidate(w) for w in ["the", "The", "isn't", ",", "@-@", "=", "..."])
    assert all(is_candidate(w) for w in ["Python", "statement", "1984", "x"])
    attacked, _ = word_swap("the of , and = @-@ to", WordSwap(rate=1.0))
    assert attacked == "the of , and = @-@ to"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 1.5}, "rate"),
        ({"replacement": "A B"}, "replacement"),
        ({"protocol": "nltk"}, "data.word_swap.protocol='nltk' is not one of 'textattack', 'uniform'; choose one"),
    ],
)
def test_bad_settings_name_the_value(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        WordSwap(**kwargs)


def words_of(line: str) -> list[str]:
    return [line[start:end] for start, end in textattack_word_spans(line)]


def test_textattack_words_are_the_runs_of_word_characters_inside_each_token():
    line = " <unk> @-@ U.S. 1 @,@ 000 don 't x-ray 'quoted' = café ×3 `` @foo a.-'y "
    assert words_of(line) == [
        "unk",
        "U",
        "S",
        "1",
        "000",
        "don",
        "t",
        "x-ray",
        "quoted'",
        "café",
        "×3",
        "``",
        "foo",
        "a",
        "y",
    ]  # fmt: skip  (TextAttack 0.3.10's words_from_text gives the same list)


def swaps_per_line(text: str, attacked: str) -> list[int]:
    return [
        sum(a != b for a, b in zip(words_of(before), words_of(after), strict=True))
        for before, after in zip(text.split("\n"), attacked.split("\n"), strict=True)
    ]


def test_textattack_protocol_swaps_int_of_the_rate_of_each_lines_words_on_that_line():
    long_line = " " + " ".join(f"w{i}" for i in range(140)) + " "  # int(0.015 * 140) = 2 swaps
    lines = [
        " = Robert Boulter = ",  # 2 words, both candidates: 1 swap (or, as TextAttack draws, none)
        " ",  # no words: untouched
        " the of and to ",  # stopwords only: untouched
        " The the <unk> . ",  # case-sensitive stopwords: The and unk are candidates
        long_line,
        " AAA AAA ",  # already the replacement: untouched
        " The U.S. Army 's <unk> @-@ based unit , 1 @,@ 000 men . ",
        " " + "the " * 139 + "Zebra ",  # m = int(0.015 * 140) = 2 > 1 candidate: Zebra, always
        " " + "the " * 198 + "Zebra Yak ",  # m = 3 > 2 candidates: both, always
    ]
    text = "\n".join(lines) + "\n"
    attacked, swapped = word_swap(text, TEXTATTACK)
    counts = swaps_per_line(text, attacked)
    allowed = [{0, 1}, {0}, {0}, {0, 1}, {1, 2}, {0}, {0, 1}, {1}, {2}, {0}]
    assert all(count in ok for count, ok in zip(counts, allowed, strict=True)), counts
    assert swapped == sum(counts) and re.sub(r"\S+", "w", attacked) == re.sub(r"\S+", "w", text)
    changed = [(a, b) for a, b in zip(text.split(), attacked.split(), strict=True) if a != b]
    assert all(b.count("AAA") == 1 for _, b in changed)  # U.S. becomes AAA.S. or U.AAA., <unk> becomes <AAA>
    assert word_swap(text, TEXTATTACK) == (attacked, swapped)  # seeded


def test_textattack_protocol_draws_as_the_augmenter_does_over_many_lines():
    heading, long_line = " = Robert Boulter = ", " " + " ".join(["the"] * 137 + ["p", "q", "r"]) + " "
    text = "\n".join([heading] * 3000 + [long_line] * 3000) + "\n"
    counts = swaps_per_line(text, word_swap(text, TEXTATTACK)[0])
    heading_counts, long_counts = Counter(counts[:3000]), Counter(counts[3000:6000])
    # m = 1 of k = 2 candidates: the last draw is among 2 one-swap texts and the unswapped one
    assert set(heading_counts) == {0, 1} and abs(heading_counts[0] / 3000 - 1 / 3) < 0.04
    # m = int(0.015 * 140) = 2 of k = 3 candidates: among 2 two-swap texts and one with a single swap
    assert set(long_counts) == {1, 2} and abs(long_counts[1] / 3000 - reference_share_below(140, 3)) < 0.04
    attacked = word_swap(text, TEXTATTACK)[0].split("\n")
    swapped_words = Counter(w for line in attacked[:3000] for w in ("Robert", "Boulter") if w not in line)
    assert abs(swapped_words["Robert"] - swapped_words["Boulter"]) < 150  # either word, uniformly
    cased = word_swap(" The the \n" * 600, TEXTATTACK)[0].split("\n")[:-1]  # stopwords match case-sensitively
    assert set(cased) == {" The the ", " AAA the "} and abs(cased.count(" AAA the ") / 600 - 1 / 2) < 0.07


def reference_share_below(words: int, candidates: int, trials: int = 6000) -> float:
    """Share of TextAttack 0.3.x ``Augmenter.augment`` results (fast_augment, one example) with fewer than m swaps.

    A transcription of its loop on index sets: swap one random remaining candidate at a time; when a
    step makes texts with m swaps, pool them all with the current text and draw one.
    """
    rng, target, below = random.Random(1), max(int(0.015 * words), 1), 0
    for _ in range(trials):
        current: frozenset[int] = frozenset()
        ready: set[frozenset[int]] = set()
        while len(current) < target:
            options = [current | {i} for i in range(candidates) if i not in current]
            if not options:
                break
            if len(options[0]) >= target:
                ready.update(options)
                break
            current = rng.choice(options)
        below += len(rng.choice(sorted(ready | {current}, key=sorted))) < target
    return below / trials


def test_the_reference_transcription_gives_the_closed_form_share():
    assert abs(reference_share_below(140, 3) - 1 / 3) < 0.03  # 1 / (k - m + 2)
    assert abs(reference_share_below(140, 10) - 1 / 10) < 0.02
