"""Token arrays prepared once, training blocks, sliding windows that score every token once, the data sources."""

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from torch.utils.data import DataLoader

from kpca.language_model.corpus import SPLITS, split_file
from kpca.language_model.data import (
    LanguageData,
    SlidingWindows,
    TokenArray,
    TokenBlocks,
    WikiTextDataModule,
    prepare_tokens,
)
from kpca.language_model.tokenizer import EOS_ID, Tokenizer, TokenizerConfig
from kpca.language_model.word_swap import WordSwap
from kpca.training.data import require_datamodule
from kpca.training.data_checks.problems import DataError


def array_of(tmp_path: Path, ids: list[int]) -> TokenArray:
    path = tmp_path / "tokens.bin"
    np.asarray(ids, dtype=np.uint16).tofile(path)
    return TokenArray(path, "uint16", len(ids), words=len(ids))


def test_prepare_tokens_streams_the_encoding_into_a_memmap_once(tmp_path: Path, tokenizer: Tokenizer, corpus_folder):
    text_file = split_file(corpus_folder, "valid")
    array = prepare_tokens(text_file, tokenizer, tmp_path, "valid")
    lines = text_file.read_text().split("\n")[:-1]
    assert array.dtype == "uint16" and array.length == len(tokenizer.encode_lines(lines))
    np.testing.assert_array_equal(array.open(), tokenizer.encode_lines(lines))
    assert array.words == sum(len(line.split()) + 1 for line in lines)
    mtime = array.path.stat().st_mtime_ns
    assert prepare_tokens(text_file, tokenizer, tmp_path, "valid") == array
    assert array.path.stat().st_mtime_ns == mtime


def test_training_blocks_are_contiguous_and_shifted_by_one(tmp_path: Path):
    blocks = TokenBlocks(array_of(tmp_path, list(range(23))), context=5)
    assert len(blocks) == 4  # (23 - 1) // 5
    inputs, targets = blocks[2]
    assert inputs.tolist() == [10, 11, 12, 13, 14] and targets.tolist() == [11, 12, 13, 14, 15]
    batch = next(iter(DataLoader(blocks, batch_size=4, num_workers=1)))  # the memmap reopens in the worker
    assert batch[0].shape == (4, 5) and batch[0].dtype == torch.long
    with pytest.raises(ValueError, match="fewer than one block"):
        TokenBlocks(array_of(tmp_path, [1, 2, 3]), context=5)


@pytest.mark.parametrize(("length", "context", "stride"), [(37, 8, 3), (37, 8, 8), (8, 8, 4), (5, 8, 2), (64, 16, 5)])
def test_sliding_windows_score_every_token_exactly_once_with_enough_context(length, context, stride, tmp_path):
    ids = [int(x) for x in np.random.default_rng(0).integers(2, 60000, length)]
    windows = SlidingWindows(array_of(tmp_path, ids), context, stride, eos_id=EOS_ID)
    scored_targets, stream = [], [EOS_ID, *ids]
    for index in range(len(windows)):
        begin, _, _ = windows.window(index)
        inputs, targets, scored = windows[index]
        n = min(context, length - begin)
        assert (
            inputs[:n].tolist() == stream[begin : begin + n]
            and targets[:n].tolist() == stream[begin + 1 : begin + n + 1]
        )
        assert not scored[n:].any()
        positions = torch.nonzero(scored).flatten().tolist()
        if index > 0:
            assert min(positions) >= min(context - stride, n) - 1  # each scored token sees >= N - stride tokens
        scored_targets += targets[scored].tolist()
    assert scored_targets == ids


def test_bad_stride_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="stride"):
        SlidingWindows(array_of(tmp_path, list(range(10))), context=4, stride=5, eos_id=EOS_ID)


def builtin_datamodule(cache: Path, **kwargs) -> WikiTextDataModule:
    options = {"data_dir": "builtin", "cache_dir": str(cache), "tokenizer": TokenizerConfig(vocab_size=500)}
    return WikiTextDataModule(**{**options, "context": 32, "batch_size": 4, "num_workers": 0, **kwargs})


def test_datamodule_on_the_builtin_corpus_prepares_clean_and_attacked_sets(lm_cache_dir: Path):
    datamodule = builtin_datamodule(lm_cache_dir)
    datamodule.prepare_data()
    datamodule.setup("test")
    assert datamodule.eval_names("validate") == ["valid"]
    assert datamodule.eval_names("test") == ["valid", "valid_wordswap", "test", "test_wordswap"]
    assert set(datamodule.arrays) == {*SPLITS, "valid_wordswap", "test_wordswap"}
    assert datamodule.arrays["test_wordswap"].words == datamodule.arrays["test"].words
    assert not np.array_equal(datamodule.arrays["test_wordswap"].open()[:5000], datamodule.arrays["test"].open()[:5000])
    inputs, targets = next(iter(datamodule.train_dataloader()))
    assert inputs.shape == targets.shape == (4, 32)
    loaders = datamodule.test_dataloader()
    n_valid = datamodule.arrays["valid"].length
    assert len(loaders) == 4 and len(loaders[0].dataset) == math.ceil((n_valid - 32) / 16) + 1  # stride N / 2
    prompt, ids = datamodule.predict_dataloader().dataset[0]
    assert prompt == "The" and ids.ndim == 1
    assert require_datamodule(SimpleNamespace(datamodule=datamodule), LanguageData) is datamodule


def test_batch_size_is_global_and_split_over_the_processes(lm_cache_dir: Path):
    datamodule = builtin_datamodule(lm_cache_dir, word_swap=None)
    datamodule.trainer = SimpleNamespace(world_size=2, global_rank=1, accelerator=CPUAccelerator())
    datamodule.setup("fit")
    assert datamodule.batch_size_per_device == 2
    assert next(iter(datamodule.train_dataloader()))[0].shape == (2, 32)
    assert datamodule.val_dataloader().batch_size == 2  # evaluation: per device, default the training share
    datamodule.eval_batch_size = 5
    assert datamodule.val_dataloader().batch_size == 5
    datamodule.trainer = SimpleNamespace(world_size=3, global_rank=0, accelerator=CPUAccelerator())
    with pytest.raises(ValueError, match=r"batch_size=4 .* world_size=3 .* data.batch_size to a multiple of 3"):
        datamodule.setup("fit")


def test_a_cpu_trainer_does_not_pin_memory_even_where_cuda_is_available(lm_cache_dir: Path, monkeypatch):
    datamodule = builtin_datamodule(lm_cache_dir, word_swap=None)
    datamodule.trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    datamodule.setup("fit")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not datamodule.train_dataloader().pin_memory and not datamodule.val_dataloader().pin_memory


def test_the_default_cache_is_the_language_model_folder_of_kpca_cache(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("KPCA_CACHE", str(tmp_path))
    assert WikiTextDataModule(data_dir="builtin").cache_dir == tmp_path / "language_model"
    monkeypatch.delenv("KPCA_CACHE")
    assert WikiTextDataModule(data_dir="builtin").cache_dir == Path.home() / ".cache" / "kpca" / "language_model"


def test_without_word_swap_test_evaluates_the_clean_splits_only(lm_cache_dir: Path):
    datamodule = builtin_datamodule(lm_cache_dir, word_swap=None, test_splits=("test",))
    assert datamodule.eval_names("test") == ["test"]
    with pytest.raises(ValueError, match="data.test_splits='dev' is not one of 'train', 'valid', 'test'"):
        builtin_datamodule(lm_cache_dir, test_splits=("train", "dev"))
    with pytest.raises(ValueError, match=r"data.test_splits is empty; name at least one of \['train', 'valid'"):
        builtin_datamodule(lm_cache_dir, test_splits=())
    with pytest.raises(ValueError, match="split='dev' is not one of 'train', 'valid', 'test'"):
        split_file(lm_cache_dir, "dev")


def test_hf_datasets_path_copies_the_splits_into_the_wikitext_layout(lm_cache_dir: Path, corpus_folder, tmp_path):
    files = {"train": "train", "validation": "valid", "test": "test"}
    datamodule = builtin_datamodule(
        tmp_path,
        data_dir=None,
        hf_path="text",
        hf_name=None,
        hf_data_files={hf: str(split_file(corpus_folder, split)) for hf, split in files.items()},
    )
    folder = datamodule.corpus_folder()
    for split in SPLITS:
        assert split_file(folder, split).read_text() == split_file(corpus_folder, split).read_text()


def test_unreachable_hf_dataset_names_both_ways_to_get_wikitext(tmp_path: Path):
    datamodule = builtin_datamodule(tmp_path, data_dir=None, hf_path="no-such-org/no-such-wikitext")
    with pytest.raises(
        DataError, match=r"set data.data_dir to a folder with WikiText-103's wiki.train.raw.*local HF cache"
    ):
        datamodule.corpus_folder()


def test_word_swap_attack_is_cached_as_text(lm_cache_dir: Path):
    datamodule = builtin_datamodule(lm_cache_dir, word_swap=WordSwap(rate=0.5, seed=1))
    datamodule.prepare_data()
    attacked = list((lm_cache_dir / "attacked").glob("*wordswap-0.5-AAA-seed1.raw"))
    assert len(attacked) == 2 and "AAA" in attacked[0].read_text()
