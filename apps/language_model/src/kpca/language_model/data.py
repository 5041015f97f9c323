"""WikiTextDataModule: WikiText-103 (local files, HF datasets, or the built-in corpus) as token blocks.

Legend: N context (tokens per block / window), T tokens in a split.
Each split is tokenised once into a memory-mapped array (``<cache>/tokens/...bin``, uint16 when the
vocabulary fits); training reads contiguous blocks of N + 1 tokens, evaluation reads sliding
windows that score every token of the split exactly once (all but the first under the authors'
protocol, ``score_first_token: false``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from kpca.language_model.corpus import (
    SPLITS,
    Split,
    TextFiles,
    check_layout,
    count_words,
    file_digest,
    iter_lines,
    layout_hint,
    split_file,
    write_builtin_corpus,
)
from kpca.language_model.data_checks import check_text_file
from kpca.language_model.tokenizer import Tokenizer, TokenizerConfig, train_tokenizer
from kpca.language_model.word_swap import WordSwap, word_swap
from kpca.language_model.word_tokenizer import WordTokenizer
from kpca.training.choices import check_choice
from kpca.training.data import ProjectDataModule
from kpca.training.data_checks.check_data import check_in_workers
from kpca.training.data_checks.problems import DataError, DataProblem
from kpca.training.errors import OptionError
from kpca.training.files import write_atomic

BUILTIN = "builtin"
HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
DEFAULT_PROMPTS = ("The", "A function is", "In Python, a class")


def _check_split_file(item: tuple[Path, str], missing_fix: str) -> list[DataProblem]:
    """The problems of one ``(text file, split)`` (a module function, so that DataLoader workers can run it)."""
    path, split = item
    return check_text_file(path, split, missing_fix)


def _fingerprint(path: Path) -> tuple[str, int, int]:
    """``(path, size, mtime)`` of a file, to recognise one already checked; a missing file gets size -1."""
    try:
        stat = path.stat()
    except OSError:
        return str(path), -1, 0
    return str(path), stat.st_size, stat.st_mtime_ns


@dataclass(frozen=True)
class TokenArray:
    """A tokenised text on disk: ``length`` token ids of ``dtype`` at ``path``, from a text of ``words`` words.

    ``source`` is the text file it was made from (named in errors), None when unknown.
    """

    path: Path
    dtype: str
    length: int
    words: int
    source: Path | None = None

    @property
    def origin(self) -> Path:
        """The file to name in errors about these tokens: the text file when known, else the token file."""
        return self.source or self.path

    def open(self) -> np.ndarray:
        """The (T,) token ids, memory-mapped read-only."""
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.length,))


def prepare_tokens(text_file: Path, tokenizer: Tokenizer | WordTokenizer, cache_dir: Path, name: str) -> TokenArray:
    """Tokenise ``text_file`` into ``<cache_dir>/tokens/<tokenizer>/<name>-<text digest>.bin`` once, and describe it.

    The token file is streamed line chunk by line chunk (WikiText-103's 540 MB never sits in memory
    as Python ints) and renamed into place; its ``.json`` sidecar, written last, marks it complete. A failure
    (text that is not UTF-8, an empty text) leaves neither file behind.

    Raises:
        DataError: naming ``text_file``, when it is not UTF-8 (line, byte offset) or holds no text.
    """
    folder = cache_dir / "tokens" / tokenizer.cache_name
    stem = f"{name}-{file_digest(text_file)[:16]}"
    meta_file = folder / f"{stem}.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        return TokenArray(folder / f"{stem}.bin", meta["dtype"], meta["length"], meta["words"], text_file)
    dtype = "uint16" if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else "uint32"
    counts = {"length": 0, "words": 0}

    def write(stream) -> None:
        for lines in iter_lines(text_file, split=name):
            ids = tokenizer.encode_lines(lines).astype(dtype)
            ids.tofile(stream)
            counts["length"] += len(ids)
            counts["words"] += count_words("\n".join(lines) + "\n")
        if counts["length"] == 0:
            fix = "Every split needs text: copy or download the file again"
            raise DataError(DataProblem(str(text_file.absolute()), name, "the file holds no text (0 tokens)", fix))

    write_atomic(folder / f"{stem}.bin", write)
    meta = {"dtype": dtype, "source": str(text_file), **counts}
    write_atomic(meta_file, lambda f: f.write(json.dumps(meta, indent=2)), mode="w")
    return TokenArray(folder / f"{stem}.bin", dtype, counts["length"], counts["words"], text_file)


class TokenBlocks(Dataset):
    """Training blocks: item i is (inputs, targets) = tokens[iN : iN + N], tokens[iN + 1 : iN + N + 1], each (N,)."""

    def __init__(self, tokens: TokenArray, context: int) -> None:
        self.tokens, self.context = tokens, context
        self._array: np.ndarray | None = None  # opened lazily, once per process (a memmap does not pickle)
        if len(self) == 0:
            raise OptionError(
                f"{tokens.origin} holds {tokens.length} tokens, fewer than one block of {context + 1} (context + 1); "
                "use a larger text or a smaller data.context"
            )

    def __len__(self) -> int:
        return (self.tokens.length - 1) // self.context

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._array is None:
            self._array = self.tokens.open()
        start = index * self.context
        block = torch.from_numpy(self._array[start : start + self.context + 1].astype(np.int64))  # (N + 1,)
        return block[:-1], block[1:]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_array": None}


class SlidingWindows(Dataset):
    """Evaluation windows of N inputs that score each target of a split exactly once.

    The stream is ``[eos] + tokens`` when ``score_first_token`` (the text starts after an end of
    line, so all T tokens are predicted), or the tokens alone (the authors' ``eval_sliding_window.py``:
    the first token is context only, T - 1 are predicted). With P the number of targets, window w
    reads the inputs ``stream[b : e]`` and targets ``stream[b + 1 : e + 1]``, b = w * stride,
    e = min(b + N, P), and scores the targets after the previous window's end. The first window
    therefore scores all of its positions (target t sees t tokens of context, as the authors' first
    window does) and every later target sees at least N - stride tokens; ``stride = 1`` is the
    authors' protocol, one scored target per window, each with the full N tokens of context.
    Windows are computed from their index (no list is kept). Item: inputs (N,), targets (N,) and a
    bool mask (N,) of scored targets; padding beyond the split is 0 and unscored.
    """

    def __init__(
        self, tokens: TokenArray, context: int, stride: int, eos_id: int, score_first_token: bool = True
    ) -> None:
        if not 1 <= stride <= context:
            raise OptionError(f"eval stride must be in [1, context={context}], got {stride}")
        self.tokens, self.context, self.stride, self.eos_id = tokens, context, stride, eos_id
        self.score_first_token = score_first_token
        self.num_targets = tokens.length if score_first_token else tokens.length - 1  # P
        if self.num_targets < 1:
            raise OptionError(f"{tokens.origin} holds {tokens.length} tokens, too few to score one; use a larger text")
        self._array: np.ndarray | None = None

    def __len__(self) -> int:
        return max(math.ceil((self.num_targets - self.context) / self.stride), 0) + 1

    def window(self, index: int) -> tuple[int, int, int]:
        """(begin, end, first scored target) of window ``index`` in stream coordinates."""
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} of {len(self)}")
        begin = index * self.stride
        end = min(begin + self.context, self.num_targets)
        previous_end = min(begin - self.stride + self.context, self.num_targets) if index else 0
        return begin, end, previous_end

    def _stream(self, start: int, stop: int) -> np.ndarray:
        """Positions [start, stop) of the stream (``[eos] + tokens`` or ``tokens``)."""
        if self._array is None:
            self._array = self.tokens.open()
        if not self.score_first_token:
            return self._array[start:stop].astype(np.int64)
        head = [self.eos_id] if start == 0 else []
        body = self._array[max(start - 1, 0) : stop - 1].astype(np.int64)
        return np.concatenate([np.asarray(head, dtype=np.int64), body])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        begin, end, first_scored = self.window(index)
        n = end - begin
        inputs = torch.zeros(self.context, dtype=torch.long)
        targets = torch.zeros(self.context, dtype=torch.long)
        inputs[:n] = torch.from_numpy(self._stream(begin, end))
        targets[:n] = torch.from_numpy(self._stream(begin + 1, end + 1))
        scored = torch.zeros(self.context, dtype=torch.bool)
        scored[first_scored - begin : n] = True  # targets begin+1..end; those <= first_scored were scored before
        return inputs, targets, scored

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_array": None}


class Prompts(Dataset):
    """Prompt texts with their token ids, for ``predict``."""

    def __init__(self, prompts: list[str], tokenizer: Tokenizer | WordTokenizer) -> None:
        self.items = [(text, torch.tensor(tokenizer.encode_prompt(text), dtype=torch.long)) for text in prompts]
        empty = [text for text, ids in self.items if ids.numel() == 0]
        if empty:
            raise OptionError(f"prompts {empty} encode to no tokens; give each prompt at least one word")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[str, torch.Tensor]:
        return self.items[index]


class LanguageData(Protocol):
    """What :class:`~kpca.language_model.module.LanguageModelModule` and its callbacks read from the datamodule.

    :class:`WikiTextDataModule` provides it. The module and the sample-text callback check any other datamodule
    against it (:func:`kpca.training.data.require_datamodule`), naming what is missing.

    Attributes:
        arrays: The token arrays by evaluation set name (words and tokens count the perplexities).
        tokenizer: The tokenizer (None until ``setup``), which encodes prompts and decodes generations.
        predict_prompts: The texts that ``predict`` and the sample-text callback continue.
    """

    arrays: dict[str, TokenArray]
    tokenizer: Tokenizer | WordTokenizer | None
    predict_prompts: tuple[str, ...]

    def eval_names(self, stage: str) -> list[str]:
        """Names of the evaluation sets of ``stage``, in dataloader order."""

    def scored_tokens(self, name: str) -> int:
        """How many tokens of evaluation set ``name`` are scored."""


class WikiTextDataModule(ProjectDataModule):
    """WikiText-103 as tokens, for training, sliding-window evaluation and the word-swap attack.

    Where the text comes from, in order: ``data_dir: builtin`` (CPython's docs, written once into the
    WikiText raw layout under ``cache_dir``), ``data_dir: <folder>`` with
    ``wiki.{train,valid,test}.<text_files>``, or, when ``data_dir`` is None, HF
    ``datasets.load_dataset(hf_path, hf_name)`` from the hub or the local HF cache (copied once into
    the same layout).

    Our defaults: raw text, a sentencepiece tokenizer, stride N / 2, the uniform word swap. The
    authors' set-up: ``text_files: tokens`` (``hf_name: wikitext-103-v1``), ``tokenizer.kind: word``,
    ``eval_stride: 1``, ``score_first_token: false`` and ``word_swap.protocol: textattack``.

    Args:
        data_dir: ``builtin``, a WikiText-103 folder, or None for HF datasets.
        hf_path: HF dataset path (``wikitext``; ``text`` with ``hf_data_files`` for other local files).
        hf_name: HF configuration name (``wikitext-103-raw-v1`` raw text, ``wikitext-103-v1`` tokens).
        hf_data_files: split -> file mapping passed to ``load_dataset`` (``train``, ``validation``, ``test``).
        text_files: ``raw`` (``wiki.*.raw``, the original text) or ``tokens`` (``wiki.*.tokens``, the
            tokenised text with ``<unk>`` that the authors' word-level models read).
        cache_dir: where the corpus copy, tokenizer and token arrays are cached; None: ``$KPCA_CACHE/language_model``
            (``~/.cache/kpca/language_model`` without ``$KPCA_CACHE``).
        tokenizer: which tokenizer and its settings (built from the train split once per setting).
        context: tokens per training block and evaluation window (N).
        batch_size: training blocks per step over all devices and nodes (the global batch; the paper: 96);
            each process loads ``batch_size // world_size`` (setup raises ValueError if it does not divide).
        eval_batch_size: evaluation windows per device and step (as segmentation's; default: the per-device
            training batch). Evaluation batches do not change the result, so they are not split.
        eval_stride: tokens between evaluation windows (default: N / 2; 1 is the authors' protocol: every
            token scored with the full context, one scored token per window, many windows per forward).
        score_first_token: predict each split's first token after an end of line (True), or keep it as
            context only, as the authors do (False: T - 1 tokens scored).
        num_workers: DataLoader workers per device.
        word_swap: the attack evaluated by ``test`` beside the clean text (None: clean only).
        test_splits: the splits ``test`` evaluates.
        predict_prompts: texts ``predict`` continues.
    """

    def __init__(
        self,
        data_dir: str | None = None,
        hf_path: str = "wikitext",
        hf_name: str | None = "wikitext-103-raw-v1",
        hf_data_files: dict[str, str] | None = None,
        text_files: TextFiles = "raw",
        cache_dir: str | None = None,
        tokenizer: TokenizerConfig = TokenizerConfig(),  # noqa: B008 (frozen dataclass)
        context: int = 256,
        batch_size: int = 96,
        eval_batch_size: int | None = None,
        eval_stride: int | None = None,
        score_first_token: bool = True,
        num_workers: int = 2,
        word_swap: WordSwap | None = WordSwap(),  # noqa: B008 (frozen dataclass)
        test_splits: tuple[Split, ...] = ("valid", "test"),
        predict_prompts: tuple[str, ...] = DEFAULT_PROMPTS,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            num_workers=num_workers,
            cache_dir=cache_dir,
            app_folder="language_model",
            eval_batch_size=eval_batch_size,
            persistent_workers=True,
        )
        if context < 1:
            raise OptionError(f"context={context} must be >= 1 (tokens per training block and evaluation window)")
        if eval_stride is not None and not 1 <= eval_stride <= context:
            raise OptionError(
                f"eval_stride={eval_stride} must be in [1, context={context}] (tokens between evaluation windows), "
                "or null for context / 2"
            )
        if not test_splits:
            raise OptionError(f"data.test_splits is empty; name at least one of {list(SPLITS)} (default: valid, test)")
        for split in test_splits:
            check_choice("data.test_splits", split, Split)
        check_choice("data.text_files", text_files, TextFiles)
        if data_dir == BUILTIN and text_files != "raw":
            raise OptionError("data_dir: builtin is raw text only; set text_files: raw, or give a wiki.*.tokens folder")
        self.save_hyperparameters()
        self.tokenizer_config = tokenizer
        self.context = context
        self.predict_prompts = tuple(predict_prompts)
        self.eval_stride = eval_stride or max(context // 2, 1)
        self.word_swap = word_swap
        self.tokenizer: Tokenizer | WordTokenizer | None = None
        self.arrays: dict[str, TokenArray] = {}
        self._sound_files: set[tuple[str, int, int]] = set()  # text files this process found sound, by size and mtime

    @property
    def vocab_size(self) -> int:
        """The vocabulary size the tokenizer is built to (the model's V)."""
        return self.tokenizer_config.vocab_size

    def scored_tokens(self, name: str) -> int:
        """How many tokens of evaluation set ``name`` the sliding windows score (T, or T - 1 without the first)."""
        return self.arrays[name].length - (0 if self.hparams.score_first_token else 1)

    def eval_names(self, stage: str) -> list[str]:
        """Names of the evaluation sets of a stage, in dataloader order: ``valid``, ``test_wordswap``, ..."""
        if stage == "validate":
            return ["valid"]
        names = []
        for split in self.hparams.test_splits:
            names += [split, f"{split}_wordswap"] if self.word_swap is not None else [split]
        return names

    def corpus_folder(self) -> Path:
        """The WikiText-layout folder the text is read from (written first for builtin and HF sources)."""
        data_dir = self.hparams.data_dir
        if data_dir == BUILTIN:
            return write_builtin_corpus(self.cache_dir)
        if data_dir is not None:
            return check_layout(data_dir, self.hparams.text_files)
        return self._hf_folder()

    def _split_file(self, folder: Path, split: str) -> Path:
        return split_file(folder, split, self.hparams.text_files)

    def _hf_folder(self) -> Path:
        source = json.dumps([self.hparams.hf_path, self.hparams.hf_name, self.hparams.hf_data_files], sort_keys=True)
        slug = re.sub(r"[^A-Za-z0-9.-]+", "_", f"{self.hparams.hf_path}-{self.hparams.hf_name}")
        folder = self.cache_dir / "hf" / f"{slug}-{hashlib.sha256(source.encode()).hexdigest()[:8]}"
        if all(self._split_file(folder, s).is_file() for s in SPLITS):
            return folder
        try:
            import datasets

            dataset = datasets.load_dataset(
                self.hparams.hf_path, self.hparams.hf_name, data_files=self.hparams.hf_data_files
            )
            for split, hf_split in HF_SPLITS.items():
                lines = dataset[hf_split]["text"]
                write_atomic(
                    self._split_file(folder, split),
                    lambda f, lines=lines: f.writelines(line if line.endswith("\n") else line + "\n" for line in lines),
                    mode="w",
                    encoding="utf-8",
                )
        except Exception as error:  # noqa: BLE001 (any failure of the hub or its cache: the message says both fixes)
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise DataError(
                f"could not load {self.hparams.hf_path!r} / {self.hparams.hf_name!r} with HF datasets ({reason}). "
                "Either set data.data_dir to a folder with WikiText-103's wiki.train.raw, wiki.valid.raw and "
                "wiki.test.raw (wiki.*.tokens with text_files: tokens), or make the dataset reachable for "
                "datasets.load_dataset (network access to the hub, or a local HF cache with HF_DATASETS_OFFLINE=1); "
                "data.data_dir=builtin uses the built-in corpus."
            ) from error
        return folder

    def prepare_data(self) -> None:
        """Write the corpus, check its text files, train the tokenizer and tokenise every split (once per node)."""
        self._load()

    def setup(self, stage: str) -> None:
        """Split the global batch (:class:`ProjectDataModule`), check the text files, load the tokenizer and tokens.

        Raises:
            DataError: before any model step, naming every text file that is missing, empty or not UTF-8, a train
                text too small for the vocabulary, or a split too short for one block or window.
        """
        super().setup(stage)
        self._load()

    def check_data(self, progress: bool = True) -> tuple[int, list[DataProblem]]:
        """Check every split's text file (exists, non-empty, UTF-8) in the loader's workers, then the vocabulary.

        The vocabulary check builds the tokenizer from a sound train file when it is not in the cache yet (the run
        would build it first, and reuses it): a corpus too small for ``tokenizer.vocab_size`` is reported with the
        largest vocabulary it allows.

        Args:
            progress: show a progress bar on stderr.

        Returns:
            The number of text files checked and every problem found (each names its file and the fix).
        """
        files = self._text_files()
        problems = check_in_workers(
            [(path, split) for split, path in files.items()],
            partial(_check_split_file, missing_fix=layout_hint(self.hparams.text_files)),
            num_workers=min(self.num_workers, len(files)),
            description="text files",
            progress=progress,
            chunk=1,
        )
        if not any(problem.split == "train" for problem in problems):
            problems += self._vocabulary_problems(files["train"])
        return len(files), problems

    def _text_files(self) -> dict[str, Path]:
        """The text file of each split, not checked (the built-in and HF sources are written first)."""
        data_dir = self.hparams.data_dir
        folder = Path(data_dir).expanduser() if data_dir not in (None, BUILTIN) else self.corpus_folder()
        return {split: self._split_file(folder, split) for split in SPLITS}

    def _require_sound_text(self, files: dict[str, Path]) -> None:
        """The cheap checks, before the tokenizer trains: DataError naming every missing, empty or non-UTF-8 file.

        A file found sound is not read again by this process while its size and modification time stay the same.
        """
        unchecked = [(path, split) for split, path in files.items() if _fingerprint(path) not in self._sound_files]
        missing_fix = layout_hint(self.hparams.text_files)
        problems = [problem for item in unchecked for problem in _check_split_file(item, missing_fix)]
        if problems:
            raise DataError(problems)
        self._sound_files.update(_fingerprint(path) for path, _ in unchecked)

    def _vocabulary_problems(self, train_file: Path) -> list[DataProblem]:
        """The problem of a train text too small for the vocabulary (none when the tokenizer builds)."""
        try:
            train_tokenizer(train_file, self.tokenizer_config, self.cache_dir)
        except DataError as error:
            return error.problems
        return []

    def _require_enough_tokens(self) -> None:
        """DataError naming each text too short for one training block (train) or one scored target (evaluation)."""
        problems = []
        train = self.arrays["train"]
        if train.length <= self.context:
            problem = f"the text gives {train.length} tokens, fewer than one training block of context + 1 = "
            problem += str(self.context + 1)
            fix = "Use a larger train text, or a smaller data.context"
            problems.append(DataProblem(str(train.origin.absolute()), "train", problem, fix))
        minimum = 1 if self.hparams.score_first_token else 2
        for name, tokens in self.arrays.items():
            if name != "train" and tokens.length < minimum:
                problem = f"the text gives {tokens.length} tokens, too few to score one (score_first_token: false)"
                problems.append(DataProblem(str(tokens.origin.absolute()), name, problem, "Use a larger text"))
        if problems:
            raise DataError(problems)

    def _load(self) -> None:
        files = self._text_files()
        self._require_sound_text(files)
        self.tokenizer = train_tokenizer(files["train"], self.tokenizer_config, self.cache_dir)
        for split in SPLITS:
            self.arrays[split] = prepare_tokens(files[split], self.tokenizer, self.cache_dir, split)
        if self.word_swap is not None:
            for split in self.hparams.test_splits:
                attacked = self._attacked_file(files[split])
                self.arrays[f"{split}_wordswap"] = prepare_tokens(
                    attacked, self.tokenizer, self.cache_dir, f"{split}_{self.word_swap.tag}"
                )
        self._require_enough_tokens()

    def _attacked_file(self, text_file: Path) -> Path:
        """``text_file`` under the word-swap attack, written once into the cache."""
        name = f"{text_file.stem}-{file_digest(text_file)[:16]}-{self.word_swap.tag}{text_file.suffix}"
        path = self.cache_dir / "attacked" / name
        if not path.exists():
            attacked, _ = word_swap(text_file.read_text(encoding="utf-8"), self.word_swap)
            write_atomic(path, lambda f: f.write(attacked), mode="w", encoding="utf-8")
        return path

    def train_dataloader(self) -> DataLoader:
        """Shuffled training blocks of the per-device batch; the last partial batch is kept."""
        return self.train_loader(TokenBlocks(self.arrays["train"], self.context), drop_last=False)

    def val_dataloader(self) -> DataLoader:
        """Sliding windows over the validation split."""
        return self._windows_loader("valid")

    def test_dataloader(self) -> list[DataLoader]:
        """One loader of sliding windows per name of ``eval_names("test")``, in that order."""
        return [self._windows_loader(name) for name in self.eval_names("test")]

    def predict_dataloader(self) -> DataLoader:
        """The prompts, one ``(text, token ids)`` per batch."""
        prompts = Prompts(list(self.predict_prompts), self.tokenizer)
        return DataLoader(prompts, batch_size=1, collate_fn=lambda items: items[0])

    def _windows_loader(self, name: str) -> DataLoader:
        """Sliding windows over evaluation set ``name``, each on exactly one rank under DDP."""
        windows = SlidingWindows(
            self.arrays[name], self.context, self.eval_stride, self.tokenizer.eos_id, self.hparams.score_first_token
        )
        return self.eval_loader(windows)
