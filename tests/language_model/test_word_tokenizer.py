"""The authors' word vocabulary on a hand-made ``wiki.*.tokens`` corpus, and the datamodule reading it."""

from pathlib import Path

import numpy as np
import pytest

from kpca.language_model.corpus import split_file
from kpca.language_model.data import WikiTextDataModule
from kpca.language_model.tokenizer import TokenizerConfig, train_tokenizer
from kpca.language_model.word_swap import WordSwap
from kpca.language_model.word_tokenizer import WordTokenizer, count_vocabulary

# wiki.*.tokens style: blank " " lines, headings, <unk>, @-@ joins; counts: the 6, cat 3, <unk> 3, = 2, sat 2, ...
TRAIN_LINES = [
    " ",
    " = Cats = ",
    " ",
    " the cat sat on the mat . ",
    " the <unk> cat , the dog @-@ like <unk> . ",
    " a cat sat ; a <unk> the the ",
]
TRAIN = "\n".join(TRAIN_LINES) + "\n"
VALID = " \n the cat barked . \n"
TEST = " \n = Dogs = \n the dog sat . \n"


def write_corpus(folder: Path, train: str = TRAIN) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in (("train", train), ("valid", VALID), ("test", TEST)):
        split_file(folder, split, "tokens").write_text(text, encoding="utf-8")
    return folder


def test_vocabulary_is_eos_then_words_by_count_ties_in_first_seen_order(tmp_path: Path):
    words = count_vocabulary(split_file(write_corpus(tmp_path), "train", "tokens"))
    assert words == [
        "<eos>", "the", "cat", "<unk>",  # 6, 3 (seen first), 3
        "=", "sat", ".", "a",  # 2 each, in order of first occurrence
        "Cats", "on", "mat", ",", "dog", "@-@", "like", ";",  # 1 each, in order of first occurrence
    ]  # fmt: skip
    assert count_vocabulary(split_file(tmp_path, "train", "tokens"), min_freq=2) == words[:8]


def test_a_text_without_unk_gets_it_appended_last(tmp_path: Path):
    train = write_corpus(tmp_path, train=" b a b \n")
    assert count_vocabulary(split_file(train, "train", "tokens")) == ["<eos>", "b", "a", "<unk>"]


def test_lines_encode_as_words_and_one_eos_each_unknown_words_as_unk(tmp_path: Path):
    folder = write_corpus(tmp_path / "corpus")
    tokenizer = train_tokenizer(
        split_file(folder, "train", "tokens"), TokenizerConfig(kind="word", vocab_size=16), tmp_path / "cache"
    )
    assert isinstance(tokenizer, WordTokenizer) and tokenizer.vocab_size == 16 and tokenizer.eos_id == 0
    ids = tokenizer.encode_lines([" ", " the cat barked . ", "", "AAA.S. cat"])
    assert ids.tolist() == [0, 1, 2, 3, 6, 0, 0, 3, 2, 0]  # barked and AAA.S. are <unk> (id 3)
    assert tokenizer.decode([1, 2, 0, 5]) == "the cat\nsat"
    assert tokenizer.encode_prompt("the cat\nsat") == [1, 2, 0, 5]


def test_the_vocabulary_is_cached_and_its_size_must_match_the_config(tmp_path: Path):
    train = split_file(write_corpus(tmp_path / "corpus"), "train", "tokens")
    first = train_tokenizer(train, TokenizerConfig(kind="word", vocab_size=16), tmp_path / "cache")
    mtime = first.vocab_file.stat().st_mtime_ns
    assert train_tokenizer(train, TokenizerConfig(kind="word", vocab_size=16), tmp_path / "cache").vocab_file == (
        first.vocab_file
    )
    assert first.vocab_file.stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match=r"has 16 words, but .*vocab_size is 32000; set data.tokenizer.vocab_size: 16"):
        train_tokenizer(train, TokenizerConfig(kind="word", vocab_size=32000), tmp_path / "cache")
    with pytest.raises(ValueError, match="data.tokenizer.kind='char' is not one of 'sentencepiece', 'word'; choose"):
        TokenizerConfig(kind="char")


def test_datamodule_reads_tokens_files_with_the_word_vocabulary_and_the_authors_count(tmp_path: Path):
    folder = write_corpus(tmp_path / "corpus")
    datamodule = WikiTextDataModule(
        data_dir=str(folder), text_files="tokens", cache_dir=str(tmp_path / "cache"),
        tokenizer=TokenizerConfig(kind="word", vocab_size=16), context=4, batch_size=2, eval_stride=1,
        score_first_token=False, num_workers=0, word_swap=WordSwap(protocol="textattack"),
    )  # fmt: skip
    datamodule.prepare_data()
    datamodule.setup("test")
    test = datamodule.arrays["test"]
    assert test.length == test.words == 1 + 4 + 5  # " ", " = Dogs = ", " the dog sat . ": words + <eos> each
    np.testing.assert_array_equal(test.open(), [0, 4, 3, 4, 0, 1, 12, 5, 6, 0])  # Dogs is <unk> (3)
    assert datamodule.scored_tokens("test") == test.length - 1
    loaders = datamodule.test_dataloader()
    assert [len(loader.dataset) for loader in loaders[2:]] == [test.length - 4] * 2  # the authors' T - N windows
    attacked = next((tmp_path / "cache" / "attacked").glob("wiki.test-*-wordswap-textattack-0.015-AAA-seed0.tokens"))
    assert attacked.read_text() == " \n = AAA = \n the dog sat . \n"  # seed 0: one line of two keeps its words
    np.testing.assert_array_equal(datamodule.arrays["test_wordswap"].open(), test.open())  # AAA is <unk> here too
    with pytest.raises(FileNotFoundError, match=r"wiki.train.tokens.*text_files: tokens.*wikitext-103-v1"):
        WikiTextDataModule(data_dir=str(tmp_path), text_files="tokens").corpus_folder()
    with pytest.raises(ValueError, match="builtin is raw text only"):
        WikiTextDataModule(data_dir="builtin", text_files="tokens")
    with pytest.raises(ValueError, match="data.text_files='words' is not one of 'raw', 'tokens'; choose one of them"):
        WikiTextDataModule(data_dir=str(tmp_path), text_files="words")
    with pytest.raises(ValueError, match="text_files='words' is not one of 'raw', 'tokens'"):
        split_file(tmp_path, "train", "words")
