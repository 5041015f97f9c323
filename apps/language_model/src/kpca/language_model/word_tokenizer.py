"""The authors' word vocabulary for WikiText-103's ``wiki.*.tokens``: whitespace words plus one ``<eos>`` per line.

Built as the authors' ``Vocab`` builds it (ELL / KPCA-S ``utils/vocabulary.py``: ``special=['<eos>']``,
``lower_case=False``, counted on the train split only): ``<eos>`` is id 0, then every word of the
train split by decreasing count, ties in order of first occurrence (``Counter.most_common``), down
to ``min_freq``. A word outside the vocabulary becomes ``<unk>``, as in their ``get_idx``;
WikiText-103's tokenised text has ``<unk>`` in its train split, so it sits where its count puts it,
and a text without it gets ``<unk>`` appended last. On WikiText-103 this gives their 267,735 words.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np

from kpca.language_model.corpus import file_digest, iter_lines
from kpca.training.errors import OptionError
from kpca.training.files import write_tree_atomic

EOS, UNK = "<eos>", "<unk>"
_FORMAT = 1  # bump when the vocabulary rule changes, so cached vocabularies are rebuilt


def count_vocabulary(train_file: str | os.PathLike[str], min_freq: int = 0) -> list[str]:
    """The vocabulary of ``train_file`` in id order: ``<eos>``, words by decreasing count (ties: first seen), ``<unk>``.

    Words are ``line.split()`` (the authors' ``line.strip().split(None)``); words seen fewer than
    ``min_freq`` times are left out (0 keeps all); ``<unk>`` is appended when the text never has it.
    """
    counter: Counter[str] = Counter()
    for lines in iter_lines(train_file):
        for line in lines:
            counter.update(line.split())
    words = [EOS]
    for word, count in counter.most_common():
        if count < min_freq:
            break
        if word != EOS:
            words.append(word)
    if UNK not in counter or counter[UNK] < min_freq:
        words.append(UNK)
    return words


class WordTokenizer:
    """A word vocabulary with line-aware encoding (``<eos>`` after each line) and decoding (words joined by spaces)."""

    def __init__(self, vocab_file: str | os.PathLike[str]) -> None:
        self.vocab_file = Path(vocab_file)
        self.words = self.vocab_file.read_text(encoding="utf-8").split("\n")[:-1]  # one word per line, id order
        self.ids = {word: index for index, word in enumerate(self.words)}
        if not self.words or self.words[0] != EOS or UNK not in self.ids or len(self.ids) != len(self.words):
            raise OptionError(f"{vocab_file} is not a word vocabulary (<eos> first, <unk> once, unique words)")
        self.unk_id = self.ids[UNK]

    @property
    def vocab_size(self) -> int:
        """Number of words V, ``<eos>`` and ``<unk>`` included."""
        return len(self.words)

    @property
    def eos_id(self) -> int:
        """Id of the end-of-line token (0)."""
        return 0

    @property
    def cache_name(self) -> str:
        """The name of the cache folder of this vocabulary (token arrays are cached under the same name)."""
        return self.vocab_file.parent.name

    def encode_lines(self, lines: list[str]) -> np.ndarray:
        """Token ids of ``lines`` (without newlines): each line's words then ``<eos>``; unknown words are ``<unk>``."""
        get, unk = self.ids.get, self.unk_id
        ids = [get(word, unk) for line in lines for word in (*line.split(), EOS)]
        return np.asarray(ids, dtype=np.int64)

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a prompt: its lines with ``<eos>`` between them, none after the last."""
        return self.encode_lines(text.split("\n")).tolist()[:-1]

    def decode(self, ids: list[int]) -> str:
        """Text of token ids: words joined by spaces, ``<eos>`` as a newline."""
        lines, current = [], []
        for token in ids:
            if token == self.eos_id:
                lines.append(" ".join(current))
                current = []
            else:
                current.append(self.words[int(token)])
        lines.append(" ".join(current))
        return "\n".join(lines)


def build_word_tokenizer(
    train_file: str | os.PathLike[str], vocab_size: int, min_freq: int, cache_dir: str | os.PathLike[str]
) -> WordTokenizer:
    """Count (or load from the cache) the word vocabulary of ``train_file`` and check its size.

    The vocabulary lives at ``<cache_dir>/tokenizers/word-<key>/vocab.txt`` (key: the file's bytes and
    ``min_freq``), written once into a temporary folder and renamed into place.

    Raises:
        ValueError: when the vocabulary does not have ``vocab_size`` words; the message names its size.
    """
    key_source = {"train": file_digest(train_file), "min_freq": min_freq, "format": _FORMAT}
    key = hashlib.sha256(json.dumps(key_source, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(cache_dir).expanduser() / "tokenizers" / f"word-{key}"

    def write(tmp: Path) -> None:
        words = count_vocabulary(train_file, min_freq)
        (tmp / "vocab.txt").write_text("".join(word + "\n" for word in words), encoding="utf-8")
        (tmp / "inputs.json").write_text(json.dumps(key_source, indent=2, sort_keys=True))

    write_tree_atomic(folder, "vocab.txt", write, what="word vocabulary folder")
    tokenizer = WordTokenizer(folder / "vocab.txt")
    if tokenizer.vocab_size != vocab_size:
        raise OptionError(
            f"the word vocabulary of {train_file} (min_freq {min_freq}) has {tokenizer.vocab_size} words, but "
            f"data.tokenizer.vocab_size is {vocab_size}; set data.tokenizer.vocab_size: {tokenizer.vocab_size} "
            "(the model's output size is linked to it)"
        )
    return tokenizer
