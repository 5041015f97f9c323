"""Fixtures shared by the language_model tests: the built-in corpus and a small tokenizer, once per session."""

from pathlib import Path

import pytest

from kpca.language_model.corpus import split_file, write_builtin_corpus
from kpca.language_model.tokenizer import Tokenizer, TokenizerConfig, train_tokenizer

VOCAB = 500  # the smoke config's vocabulary


@pytest.fixture(scope="session")
def lm_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``data.cache_dir`` holding the built-in corpus and its 500-piece tokenizer (about 1 s, shared)."""
    cache = tmp_path_factory.mktemp("lm_cache")
    folder = write_builtin_corpus(cache)
    train_tokenizer(split_file(folder, "train"), TokenizerConfig(vocab_size=VOCAB), cache)
    return cache


@pytest.fixture(scope="session")
def corpus_folder(lm_cache_dir: Path) -> Path:
    return write_builtin_corpus(lm_cache_dir)


@pytest.fixture(scope="session")
def tokenizer(lm_cache_dir: Path, corpus_folder: Path) -> Tokenizer:
    return train_tokenizer(split_file(corpus_folder, "train"), TokenizerConfig(vocab_size=VOCAB), lm_cache_dir)
