"""The tokenizers: a sentencepiece model trained on the training split, or the authors' word vocabulary.

``TokenizerConfig.kind`` chooses. Both encode text line by line, each line followed by the
end-of-line token (WikiText's ``<eos>``), so decoding turns it back into a newline, and both are
cached under a key of their inputs. Sentencepiece (our default) uses byte fallback, so every
character is representable and no ``<unk>`` ever inflates or deflates a perplexity. The word
vocabulary (:mod:`kpca.language_model.word_tokenizer`) is the authors' on ``wiki.*.tokens``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import sentencepiece as spm

from kpca.language_model.corpus import file_digest
from kpca.language_model.word_tokenizer import WordTokenizer, build_word_tokenizer
from kpca.training.choices import check_choice
from kpca.training.data_checks.problems import DataError, DataProblem
from kpca.training.errors import OptionError
from kpca.training.files import write_tree_atomic

UNK_ID, EOS_ID = 0, 1  # sentencepiece's; the word vocabulary puts <eos> first (id 0), as the authors'
TokenizerKind = Literal["sentencepiece", "word"]
SentencepieceModel = Literal["unigram", "bpe"]
MIN_VOCAB_SIZE = 300  # sentencepiece: 256 byte pieces + <unk> + <eos> + some text pieces
_VOCAB_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


@dataclass(frozen=True)
class TokenizerConfig:
    """Which tokenizer, and how it is built from the train split (every field it uses is part of its cache key).

    Args:
        kind: ``sentencepiece`` (our default, on raw text) or ``word`` (the authors': whitespace words plus
            one ``<eos>`` per line, the vocabulary of the train split; use it on ``wiki.*.tokens``).
        vocab_size: sentencepiece: number of pieces, specials and 256 byte pieces included. word: the size
            the vocabulary must have (it is fixed by the train split and ``min_freq``; the model's output
            size is linked to this value, so a mismatch is an error naming the real size; 267735 for
            WikiText-103).
        model_type: sentencepiece ``unigram`` or ``bpe``.
        max_sentences: sentencepiece trains on at most this many lines, sampled by sentencepiece
            (WikiText-103's train split has 1.8M lines; 2M keeps them all).
        character_coverage: sentencepiece's share of characters that get their own piece; the rest fall
            back to bytes.
        min_freq: word: words seen fewer times in the train split become ``<unk>`` (0: keep every word,
            the authors' setting).
    """

    kind: TokenizerKind = "sentencepiece"
    vocab_size: int = 32000
    model_type: SentencepieceModel = "unigram"
    max_sentences: int = 2_000_000
    character_coverage: float = 0.9995
    min_freq: int = 0

    def __post_init__(self) -> None:
        check_choice("data.tokenizer.kind", self.kind, TokenizerKind)
        if self.kind == "sentencepiece" and self.vocab_size < MIN_VOCAB_SIZE:
            raise OptionError(
                f"vocab_size must be >= {MIN_VOCAB_SIZE} (256 byte pieces + specials + text), got {self.vocab_size}"
            )
        if self.kind == "word" and self.vocab_size < 2:
            raise OptionError(f"vocab_size must be >= 2 (<eos> and one word), got {self.vocab_size}")
        check_choice("data.tokenizer.model_type", self.model_type, SentencepieceModel)
        if self.min_freq < 0:
            raise OptionError(f"min_freq must be >= 0, got {self.min_freq}")


class Tokenizer:
    """A trained sentencepiece model with line-aware encoding and decoding."""

    def __init__(self, model_file: str | os.PathLike[str]) -> None:
        self.model_file = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.model_file))
        if self.sp.eos_id() != EOS_ID:
            raise OptionError(
                f"{model_file} has eos id {self.sp.eos_id()}, expected {EOS_ID}; train it with train_tokenizer"
            )

    @property
    def vocab_size(self) -> int:
        """Number of pieces V."""
        return self.sp.get_piece_size()

    @property
    def eos_id(self) -> int:
        """Id of the end-of-line token."""
        return EOS_ID

    @property
    def cache_name(self) -> str:
        """The name of the cache folder of this model (token arrays are cached under the same name)."""
        return self.model_file.parent.name

    def encode_lines(self, lines: list[str]) -> np.ndarray:
        """Token ids of ``lines`` (without newlines), each line followed by the end-of-line id; (T,) int64."""
        pieces = self.sp.encode([line.rstrip("\n") for line in lines], num_threads=os.cpu_count() or 1)
        ids = [token for line_ids in pieces for token in (*line_ids, EOS_ID)]
        return np.asarray(ids, dtype=np.int64)

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a prompt: its lines with end-of-line ids between them, none after the last."""
        ids = self.encode_lines(text.split("\n")).tolist()
        return ids[:-1]

    def decode(self, ids: list[int]) -> str:
        """Text of token ids; end-of-line ids become newlines."""
        lines, current = [], []
        for token in ids:
            if token == EOS_ID:
                lines.append(current)
                current = []
            else:
                current.append(int(token))
        lines.append(current)
        return "\n".join(self.sp.decode(line) for line in lines)


def train_tokenizer(
    train_file: str | os.PathLike[str], config: TokenizerConfig, cache_dir: str | os.PathLike[str]
) -> Tokenizer | WordTokenizer:
    """Build (or load from the cache) the tokenizer ``config.kind`` of ``train_file``.

    The cache key hashes the file's bytes, the settings the kind uses and (sentencepiece) its
    version, so a changed corpus or setting builds a new tokenizer and an unchanged one is never
    built twice. Files are written to a temporary folder and renamed into place, so concurrent or
    interrupted runs never see a partial tokenizer.

    Returns:
        A sentencepiece :class:`Tokenizer` (model at ``<cache_dir>/tokenizers/<key>/spm.model``) or a
        :class:`~kpca.language_model.word_tokenizer.WordTokenizer` (``.../<key>/vocab.txt``).

    Raises:
        ValueError: for ``word``, when the vocabulary's size is not ``config.vocab_size`` (names the size).
        DataError: for sentencepiece, when the text is too small for ``config.vocab_size`` (:func:`corpus_too_small`).
    """
    if config.kind == "word":
        return build_word_tokenizer(train_file, config.vocab_size, config.min_freq, cache_dir)
    settings = {
        "vocab_size": config.vocab_size,
        "model_type": config.model_type,
        "max_sentences": config.max_sentences,
        "character_coverage": config.character_coverage,
    }
    key_source = {"train": file_digest(train_file), "sentencepiece": spm.__version__, **settings}
    key = hashlib.sha256(json.dumps(key_source, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(cache_dir).expanduser() / "tokenizers" / f"{config.model_type}{config.vocab_size}-{key}"
    model_file = folder / "spm.model"

    def write(tmp: Path) -> None:
        with open(os.devnull, "w") as quiet, _too_small_as_data_error(train_file, config.vocab_size):
            spm.SentencePieceTrainer.train(
                input=str(train_file),
                model_prefix=str(tmp / "spm"),
                vocab_size=config.vocab_size,
                model_type=config.model_type,
                character_coverage=config.character_coverage,
                input_sentence_size=config.max_sentences,
                shuffle_input_sentence=True,
                max_sentence_length=1 << 16,
                byte_fallback=True,
                unk_id=UNK_ID,
                eos_id=EOS_ID,
                bos_id=-1,
                pad_id=-1,
                num_threads=os.cpu_count() or 1,
                logstream=quiet,
            )
        (tmp / "inputs.json").write_text(json.dumps(key_source, indent=2, sort_keys=True))

    write_tree_atomic(folder, model_file.name, write, what="tokenizer folder")  # spm.model marks a complete folder
    return Tokenizer(model_file)


def corpus_too_small(train_file: str | os.PathLike[str], vocab_size: int, largest: int) -> DataProblem:
    """The problem of a train text from which sentencepiece can build at most ``largest`` < ``vocab_size`` pieces.

    The fix is a larger corpus, or a vocabulary between the project's minimum (:data:`MIN_VOCAB_SIZE`) and
    ``largest`` when there is room between them.
    """
    path = str(Path(train_file).absolute())
    if largest < MIN_VOCAB_SIZE:
        problem = (
            f"the corpus is too small: sentencepiece can build at most {largest} pieces from it, fewer than the "
            f"minimum vocab_size of {MIN_VOCAB_SIZE} (256 byte pieces, the specials and text pieces)"
        )
        return DataProblem(path, "train", problem, "Use a larger train text")
    problem = (
        f"the corpus is too small for data.tokenizer.vocab_size={vocab_size}: sentencepiece can build at most "
        f"{largest} pieces from it (the minimum vocab_size is {MIN_VOCAB_SIZE})"
    )
    fix = f"Use a larger train text, or set data.tokenizer.vocab_size between {MIN_VOCAB_SIZE} and {largest}"
    return DataProblem(path, "train", problem, fix)


@contextmanager
def _too_small_as_data_error(train_file: str | os.PathLike[str], vocab_size: int) -> Iterator[None]:
    """Turn sentencepiece's "Vocabulary size too high (V). Please set it to a value <= M." into one DataError."""
    try:
        yield
    except RuntimeError as error:
        match = _VOCAB_TOO_HIGH.search(str(error))
        if match is None:
            raise
        raise DataError(corpus_too_small(train_file, vocab_size, int(match.group(2)))) from error
