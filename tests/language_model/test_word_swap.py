"""The word-swap attack: rate, determinism, stopwords and layout kept."""

import re
from pathlib import Path

import pytest

from kpca.language_model.corpus import count_words, split_file
from kpca.language_model.word_swap import STOPWORDS, WordSwap, is_candidate, word_swap


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


@pytest.mark.parametrize(("kwargs", "message"), [({"rate": 1.5}, "rate"), ({"replacement": "A B"}, "replacement")])
def test_bad_settings_name_the_value(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        WordSwap(**kwargs)
