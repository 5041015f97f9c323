"""The WikiText layout, the built-in corpus, word counting, and the cached sentencepiece tokenizer."""

import os
from pathlib import Path

import numpy as np
import pytest

from kpca.language_model.corpus import (
    SPLITS,
    check_layout,
    count_words,
    split_file,
    topic_to_article,
    write_builtin_corpus,
)
from kpca.language_model.tokenizer import EOS_ID, UNK_ID, Tokenizer, TokenizerConfig, train_tokenizer


def test_count_words_counts_whitespace_words_and_one_end_of_line_per_line():
    text = " = Title = \n \n The cat sat . \n\n"  # lines: heading (3 words), blank, sentence (4), empty
    assert count_words(text) == 3 + 0 + 4 + 0 + 4
    assert count_words("no final newline") == 3 + 1
    assert count_words("") == 0


def test_topic_to_article_writes_wikitext_headings_and_one_line_per_paragraph():
    text = 'The "pass" statement\n********************\n\nSome words\nwrapped here.\n\nUsage\n=====\n\nMore.\n'
    assert topic_to_article(text) == [
        ' = The "pass" statement = ', " ", " Some words wrapped here. ", " ", " = = Usage = = ", " ", " More. ", " ",
    ]  # fmt: skip


def test_builtin_corpus_has_the_wikitext_layout_balanced_splits_and_is_written_once(lm_cache_dir: Path):
    folder = write_builtin_corpus(lm_cache_dir)
    assert check_layout(folder) == folder
    sizes = {s: split_file(folder, s).stat().st_size for s in SPLITS}
    total = sum(sizes.values())
    assert 0.85 < sizes["train"] / total < 0.92 and all(0.03 < sizes[s] / total < 0.08 for s in ("valid", "test"))
    text = split_file(folder, "train").read_text()
    assert text.startswith(" = ") and count_words(text) > 50_000
    mtimes = [split_file(folder, s).stat().st_mtime_ns for s in SPLITS]
    assert write_builtin_corpus(lm_cache_dir) == folder
    assert [split_file(folder, s).stat().st_mtime_ns for s in SPLITS] == mtimes


def test_a_folder_without_the_raw_files_names_the_expected_layout(tmp_path: Path):
    (tmp_path / "wiki.train.raw").write_text("x\n")
    with pytest.raises(FileNotFoundError, match=r"lacks \['wiki.valid.raw', 'wiki.test.raw'\].*builtin"):
        check_layout(tmp_path)


def test_tokenizer_encodes_lines_with_end_of_line_ids_and_decodes_back(tokenizer: Tokenizer):
    text = "The return statement\nexits a function.\n\nж"  # ж never occurs in the corpus: bytes, not <unk>
    ids = tokenizer.encode_lines(text.split("\n"))
    assert ids.dtype == np.int64 and tokenizer.vocab_size == 500
    assert (ids == EOS_ID).sum() == 4 and ids[-1] == EOS_ID and UNK_ID not in ids
    assert tokenizer.decode(ids.tolist()) == text + "\n"
    prompt = tokenizer.encode_prompt("The return\nstatement")
    assert prompt[-1] != EOS_ID and prompt.count(EOS_ID) == 1


def test_tokenizer_is_trained_once_per_corpus_and_setting(lm_cache_dir: Path, corpus_folder: Path, tmp_path: Path):
    train = split_file(corpus_folder, "train")
    first = train_tokenizer(train, TokenizerConfig(vocab_size=500), lm_cache_dir)
    mtime = first.model_file.stat().st_mtime_ns
    again = train_tokenizer(train, TokenizerConfig(vocab_size=500), lm_cache_dir)
    assert again.model_file == first.model_file and again.model_file.stat().st_mtime_ns == mtime
    bigger = train_tokenizer(train, TokenizerConfig(vocab_size=600), lm_cache_dir)
    assert bigger.model_file != first.model_file and bigger.vocab_size == 600
    edited = tmp_path / "wiki.train.raw"
    edited.write_text(train.read_text() + " An extra line . \n")
    assert train_tokenizer(edited, TokenizerConfig(vocab_size=500), lm_cache_dir).model_file != first.model_file
    assert not [p for p in (lm_cache_dir / "tokenizers").iterdir() if p.name.startswith(".")]  # no temporaries left
    assert os.path.getsize(first.model_file) > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vocab_size": 100}, "vocab_size"),
        ({"model_type": "word"}, "data.tokenizer.model_type='word' is not one of 'unigram', 'bpe'; choose one of them"),
    ],
)
def test_bad_tokenizer_settings_name_the_value(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        TokenizerConfig(**kwargs)
