"""Damaged WikiText folders: every error names the text file and the fix, before the tokenizer or the model runs.

Each test copies the built-in corpus into the WikiText-103 layout and damages it as a download or a copy can:
a byte that is not UTF-8, an empty split, a missing file, a train text too small for the vocabulary.
"""

import re
import shutil
import time
from pathlib import Path

import pytest

from kpca.language_model.corpus import SPLITS, split_file
from kpca.language_model.data import WikiTextDataModule, prepare_tokens
from kpca.language_model.data_checks import find_invalid_utf8
from kpca.language_model.tokenizer import MIN_VOCAB_SIZE, Tokenizer, TokenizerConfig
from kpca.training.data_checks.problems import DataError
from tests.cli_support import CONFIGS, CPU
from tests.console_support import console

SMOKE = CONFIGS / "language_model" / "smoke.yaml"
LATIN1_E_ACUTE = b"\xe9"  # "é" as a Latin-1 file holds it: an invalid start byte in UTF-8


def copy_corpus(source: Path, folder: Path) -> Path:
    """The three raw files of ``source`` copied into ``folder`` (the WikiText-103 layout)."""
    folder.mkdir(parents=True)
    for split in SPLITS:
        shutil.copy(split_file(source, split), split_file(folder, split))
    return folder


def insert_bytes(path: Path, line: int, column: int, bad: bytes) -> int:
    """Insert ``bad`` at ``column`` of line ``line`` (from 1) of ``path``; return its byte offset."""
    data = path.read_bytes()
    offset = sum(len(text) + 1 for text in data.split(b"\n")[: line - 1]) + column
    path.write_bytes(data[:offset] + bad + data[offset:])
    return offset


def datamodule_of(folder: Path, cache: Path, vocab_size: int = 500, **kwargs) -> WikiTextDataModule:
    options = {"context": 32, "batch_size": 4, "num_workers": 0, "word_swap": None, **kwargs}
    tokenizer = TokenizerConfig(vocab_size=vocab_size)
    return WikiTextDataModule(data_dir=str(folder), cache_dir=str(cache), tokenizer=tokenizer, **options)


def files_under(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file()) if folder.exists() else []


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 64, 1 << 18])
def test_the_utf8_scan_agrees_with_python_s_decoder_across_chunk_boundaries(tmp_path: Path, chunk_size: int):
    texts = ["ab\né€𝄞ж \n" * 5, "plain ascii\n" * 3, ""]
    damaged = [b"\xff", b"\xc3", b"\xe2\x82", b"\x80", b"\xf0\x9d\x84"]
    for text in texts:
        for position in range(0, len(text.encode()) + 1, 7):
            for bad in [b"", *damaged]:
                data = text.encode()[:position] + bad + text.encode()[position:]
                path = tmp_path / "text.raw"
                path.write_bytes(data)
                found = find_invalid_utf8(path, chunk_size)
                try:
                    data.decode("utf-8")
                    expected = None
                except UnicodeDecodeError as error:  # the reference: Python's own decoder on the whole file
                    expected = (error.start, data.count(b"\n", 0, error.start) + 1, data[error.start : error.end])
                assert (found and (found.offset, found.line, found.bad_bytes)) == expected, (data, chunk_size)


def test_invalid_utf8_in_train_is_named_with_line_and_offset_before_the_tokenizer_trains(
    corpus_folder: Path, tmp_path: Path
):
    folder = copy_corpus(corpus_folder, tmp_path / "wikitext")
    train = split_file(folder, "train")
    offset = insert_bytes(train, line=51, column=3, bad=LATIN1_E_ACUTE)
    datamodule = datamodule_of(folder, tmp_path / "cache")
    with pytest.raises(DataError) as caught:
        datamodule.prepare_data()
    message = str(caught.value)
    assert f"{train} (train): not valid UTF-8: bytes b'\\xe9' at line 51, byte offset {offset}" in message
    assert "download the file again" in message and "iconv -f <its encoding> -t utf-8 -c" in message
    assert files_under(tmp_path / "cache") == []  # no tokenizer, no token cache


def test_tokenising_a_text_that_breaks_midway_leaves_no_cache_file(tokenizer: Tokenizer, tmp_path: Path):
    text_file = tmp_path / "wiki.valid.raw"
    text_file.write_bytes(b" The return statement exits a function . \n" * 120_000)  # two chunks of lines
    offset = insert_bytes(text_file, line=110_001, column=5, bad=b"\xff\xfe")
    with pytest.raises(DataError, match=rf"wiki.valid.raw \(valid\): .* line 110001, byte offset {offset}"):
        prepare_tokens(text_file, tokenizer, tmp_path / "cache", "valid")  # fails after the first chunk was written
    assert files_under(tmp_path / "cache") == []  # no .bin, no .json, no temporary file


def test_an_empty_valid_split_names_the_text_file_and_leaves_no_token_cache(
    corpus_folder: Path, tokenizer: Tokenizer, tmp_path: Path
):
    folder = copy_corpus(corpus_folder, tmp_path / "wikitext")
    valid = split_file(folder, "valid")
    valid.write_bytes(b"")
    datamodule = datamodule_of(folder, tmp_path / "cache", word_swap=None)
    with pytest.raises(DataError, match=rf"^{re.escape(str(valid))} \(valid\): the file is empty \(0 bytes\)"):
        datamodule.setup("fit")
    assert files_under(tmp_path / "cache") == []
    with pytest.raises(DataError, match=rf"{re.escape(str(valid))} \(valid\): the file holds no text \(0 tokens\)"):
        prepare_tokens(valid, tokenizer, tmp_path / "direct", "valid")  # the guard of the token cache itself
    assert files_under(tmp_path / "direct") == []  # no 0-byte .bin


def train_of_lines(corpus_folder: Path, folder: Path, lines: int) -> Path:
    """A WikiText folder whose train split is the first ``lines`` lines of the built-in one."""
    copy_corpus(corpus_folder, folder)
    train = split_file(folder, "train")
    train.write_text("".join(train.read_text().splitlines(keepends=True)[:lines]))
    return train


def test_a_corpus_too_small_for_the_vocabulary_gets_one_message_with_the_largest_vocabulary(
    corpus_folder: Path, tmp_path: Path
):
    train = train_of_lines(corpus_folder, tmp_path / "wikitext", lines=40)
    datamodule = datamodule_of(tmp_path / "wikitext", tmp_path / "cache", vocab_size=2000)
    with pytest.raises(DataError) as caught:
        datamodule.prepare_data()
    message = str(caught.value)
    largest = int(re.search(r"can build at most (\d+) pieces", message).group(1))
    assert MIN_VOCAB_SIZE <= largest < 2000
    assert message == (
        f"{train} (train): the corpus is too small for data.tokenizer.vocab_size=2000: sentencepiece can build at most "
        f"{largest} pieces from it (the minimum vocab_size is 300). Use a larger train text, or set "
        f"data.tokenizer.vocab_size between 300 and {largest}"
    )
    assert (
        datamodule_of(tmp_path / "wikitext", tmp_path / "cache", vocab_size=largest).check_data(progress=False)[1] == []
    )
    assert not [p for p in (tmp_path / "cache" / "tokenizers").iterdir() if p.name.startswith(".")]  # no temporaries


def test_a_corpus_too_small_for_the_minimum_vocabulary_says_so_without_a_range(corpus_folder: Path, tmp_path: Path):
    train = train_of_lines(corpus_folder, tmp_path / "wikitext", lines=4)
    with pytest.raises(DataError) as caught:
        datamodule_of(tmp_path / "wikitext", tmp_path / "cache", vocab_size=MIN_VOCAB_SIZE).prepare_data()
    message = str(caught.value)
    assert message.startswith(f"{train} (train): the corpus is too small: sentencepiece can build at most ")
    assert "fewer than the minimum vocab_size of 300" in message and "between" not in message
    assert message.endswith("Use a larger train text")


def test_check_data_lists_every_damaged_file_in_workers(corpus_folder: Path, tmp_path: Path):
    folder = copy_corpus(corpus_folder, tmp_path / "wikitext")
    train_offset = insert_bytes(split_file(folder, "train"), line=7, column=0, bad=LATIN1_E_ACUTE)
    split_file(folder, "valid").write_bytes(b"")
    split_file(folder, "test").unlink()
    checked, problems = datamodule_of(folder, tmp_path / "cache", num_workers=1).check_data(progress=False)
    assert checked == 3
    assert [(p.path, p.split) for p in problems] == [(str(split_file(folder, s)), s) for s in SPLITS]
    train, valid, test = problems
    assert f"line 7, byte offset {train_offset}" in train.problem and "iconv" in train.fix
    assert valid.problem == "the file is empty (0 bytes)"
    assert test.problem == "the file does not exist" and "wiki.test.raw" in test.fix and "builtin" in test.fix
    assert files_under(tmp_path / "cache") == []  # the vocabulary is not checked on a damaged train file


def test_check_data_on_a_sound_corpus_finds_nothing(corpus_folder: Path, lm_cache_dir: Path, tmp_path: Path):
    folder = copy_corpus(corpus_folder, tmp_path / "wikitext")
    assert datamodule_of(folder, lm_cache_dir).check_data(progress=False) == (3, [])


def test_a_train_text_shorter_than_one_block_names_the_text_file_in_setup(lm_cache_dir: Path):
    datamodule = WikiTextDataModule(
        data_dir="builtin", cache_dir=str(lm_cache_dir), tokenizer=TokenizerConfig(vocab_size=500),
        context=1_000_000, batch_size=4, num_workers=0, word_swap=None,
    )  # fmt: skip
    train = split_file(datamodule.corpus_folder(), "train")
    with pytest.raises(DataError, match=rf"{re.escape(str(train))} \(train\): the text gives \d+ tokens, fewer than"):
        datamodule.setup("fit")


def test_fit_fails_in_seconds_before_the_sanity_check_and_writes_no_run_files(
    corpus_folder: Path, tmp_path: Path, capfd: pytest.CaptureFixture
):
    folder = copy_corpus(corpus_folder, tmp_path / "wikitext")
    valid = split_file(folder, "valid")
    offset = insert_bytes(valid, line=3, column=2, bad=b"\xc3(")
    root = tmp_path / "root"
    options = [
        "fit", "-c", CPU, "-c", SMOKE,
        f"--data.data_dir={folder}", f"--data.cache_dir={tmp_path / 'cache'}", f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root / 'runs'}",
    ]  # fmt: skip
    start = time.monotonic()
    # the console script's path in this process (tests/console_support.py): a local folder, no hub data to import
    done = console(capfd, "language-model", tmp_path, *options)  # capfd: sentencepiece would need stderr's fd
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert f"{valid} (valid): not valid UTF-8: bytes b'\\xc3' at line 3, byte offset {offset}" in done.stderr
    assert "Sanity Checking" not in done.stderr and "Epoch 0" not in done.stderr
    assert not list(root.rglob("*.ckpt")) and not list(root.rglob("events.out.tfevents.*"))
    assert files_under(tmp_path / "cache") == []
    assert elapsed < 120, f"the data error came after {elapsed:.0f} s"
