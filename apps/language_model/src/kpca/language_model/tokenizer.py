"""A sentencepiece tokenizer trained on the training split, cached under a key of its inputs.

Text is encoded line by line, each line followed by the end-of-line token (WikiText's ``<eos>``),
so decoding turns it back into a newline. Byte fallback makes every character representable:
no ``<unk>`` ever inflates or deflates a perplexity.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm

from kpca.training.files import write_tree_atomic

UNK_ID, EOS_ID = 0, 1
_HASH_CHUNK = 1 << 24


@dataclass(frozen=True)
class TokenizerConfig:
    """How the sentencepiece model is trained (every field is part of the cache key).

    Args:
        vocab_size: number of pieces, specials and 256 byte pieces included.
        model_type: ``unigram`` or ``bpe``.
        max_sentences: train on at most this many lines, sampled by sentencepiece (WikiText-103's
            train split has 1.8M lines; 2M keeps them all).
        character_coverage: share of characters that get their own piece; the rest fall back to bytes.
    """

    vocab_size: int = 32000
    model_type: str = "unigram"
    max_sentences: int = 2_000_000
    character_coverage: float = 0.9995

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be >= 300 (256 byte pieces + specials + text), got {self.vocab_size}")
        if self.model_type not in ("unigram", "bpe"):
            raise ValueError(f"model_type must be 'unigram' or 'bpe', got {self.model_type!r}")


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Tokenizer:
    """A trained sentencepiece model with line-aware encoding and decoding."""

    def __init__(self, model_file: str | os.PathLike[str]) -> None:
        self.model_file = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.model_file))
        if self.sp.eos_id() != EOS_ID:
            raise ValueError(
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


def iter_lines(path: str | os.PathLike[str], chunk_lines: int = 100_000) -> Iterator[list[str]]:
    """The lines of a text file (newlines stripped), in chunks of ``chunk_lines``."""
    chunk: list[str] = []
    with open(path, encoding="utf-8") as stream:
        for line in stream:
            chunk.append(line.rstrip("\n"))
            if len(chunk) == chunk_lines:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def train_tokenizer(
    train_file: str | os.PathLike[str], config: TokenizerConfig, cache_dir: str | os.PathLike[str]
) -> Tokenizer:
    """Train (or load from the cache) a sentencepiece model on ``train_file``.

    The cache key hashes the file's bytes, the config and the sentencepiece version, so a changed
    corpus or setting trains a new model and an unchanged one never trains twice. The model is
    written to a temporary folder and renamed into place, so concurrent or interrupted runs never
    see a partial model.

    Returns:
        The tokenizer, whose model lives at ``<cache_dir>/tokenizers/<key>/spm.model``.
    """
    key_source = {"train": file_digest(train_file), "sentencepiece": spm.__version__, **asdict(config)}
    key = hashlib.sha256(json.dumps(key_source, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(cache_dir).expanduser() / "tokenizers" / f"{config.model_type}{config.vocab_size}-{key}"
    model_file = folder / "spm.model"

    def write(tmp: Path) -> None:
        with open(os.devnull, "w") as quiet:
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
