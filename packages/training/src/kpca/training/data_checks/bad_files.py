"""Damaged files met while training: named in the error (``data.bad_files: error``) or skipped and counted (``skip``).

:class:`NamedFileErrors` wraps a dataset whose items are read from files. When reading item ``i`` raises, the error
becomes a :class:`~kpca.training.data_checks.problems.DataError` that names the file (``path_of(i)``), the split, what
is wrong and the fix, chained from the original exception. In ``skip`` mode (training only) the item is replaced by the
next one that reads, each damaged file is logged once as a WARNING and flagged in a shared-memory tensor, so the flags
set by DataLoader workers survive them and the main process counts them; past ``max_bad_fraction`` of the set the run
stops with a DataError. :class:`BadFilesMonitor` logs the count as ``data/bad_files`` at the end of every training epoch
(the union over DDP ranks), which the run's HParams summary then reports.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset

from kpca.training.choices import check_choice
from kpca.training.data_checks.problems import DataError, DataProblem
from kpca.training.errors import OptionError
from kpca.training.resumable import training_dataset

logger = logging.getLogger(__name__)

BadFilesMode = Literal["error", "skip"]
BAD_FILES_METRIC = "data/bad_files"


def training_fix(group: str = "data") -> str:
    """The fix of a damaged training file, naming ``<group>.bad_files`` (the app's spelling of the option)."""
    return (
        "Replace it with an intact copy or delete it (the app's check-data subcommand lists every damaged file), or "
        f"set {group}.bad_files=skip to train without it."
    )


TRAINING_FIX = training_fix()
EVALUATION_FIX = (
    "Replace it with an intact copy or delete it (the app's check-data subcommand lists every damaged file); "
    "evaluation never skips files, so that every metric is over the whole set."
)


def check_bad_files_options(bad_files: str, max_bad_fraction: float, group: str = "data") -> None:
    """Raise OptionError naming the value and the choices if ``bad_files`` or ``max_bad_fraction`` is bad.

    The options are named ``<group>.bad_files`` and ``<group>.max_bad_fraction``, as the app spells them.
    """
    check_choice(
        f"{group}.bad_files",
        bad_files,
        BadFilesMode,
        "'error' stops at the first damaged file, naming it; 'skip' trains without it, logging and counting it",
    )
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise OptionError(
            f"{group}.max_bad_fraction={max_bad_fraction} must be a fraction in [0, 1] of the training set that "
            f"{group}.bad_files=skip may skip before the run stops (default 0.001)."
        )


def describe_error(error: BaseException) -> str:
    """What went wrong, for a :class:`DataProblem`: the exception's type and message."""
    return f"cannot be read: {type(error).__name__}: {error}"


class NamedFileErrors(Dataset):
    """A dataset whose read errors name the file; in ``skip`` mode damaged files are replaced, logged and counted.

    Attributes of the wrapped dataset (``samples``, ``classes``, ...) are reachable through the wrapper. Under DDP
    each rank holds its own flags: the limit applies per rank, and a file met on two ranks is logged by each.

    Args:
        dataset: the dataset whose item ``i`` is read from the file ``path_of(i)``.
        path_of: the full path of item ``i``'s file (picklable, like ``dataset``: DataLoader workers call it).
        split: the split named in errors (``train``, ``val``, ``imagenet_c/fog/3``, ...).
        mode: ``error`` raises a DataError at the first damaged file; ``skip`` returns the next item that reads.
        max_bad_fraction: in ``skip`` mode, the run stops once more than this fraction of the set is damaged.
        evaluation: an evaluation set: the mode must be ``error`` and the fix says that evaluation never skips.
        group: how the app spells the options' group in messages (``<group>.bad_files``).

    Raises:
        ValueError: If the options are bad, or ``evaluation`` is set with ``mode="skip"``.
    """

    def __init__(
        self,
        dataset: Dataset,
        path_of: Callable[[int], str],
        split: str,
        mode: BadFilesMode = "error",
        max_bad_fraction: float = 0.001,
        evaluation: bool = False,
        group: str = "data",
    ) -> None:
        check_bad_files_options(mode, max_bad_fraction, group)
        if evaluation and mode != "error":
            raise OptionError(f"{split} is an evaluation set, which never skips files; got mode={mode!r}.")
        self.dataset = dataset
        self.path_of = path_of
        self.split = split
        self.mode = mode
        self.max_bad_fraction = max_bad_fraction
        self.group = group
        self.fix = EVALUATION_FIX if evaluation else training_fix(group)
        # One flag per item, in shared memory: workers (forked or spawned) set them, the main process counts them.
        self.flags = torch.zeros(len(dataset), dtype=torch.uint8).share_memory_()  # (N,)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, index: int) -> Any:
        if not -len(self) <= index < len(self):  # the end of iteration, not a damaged file
            raise IndexError(f"index {index} is out of range for {self.split} ({len(self)} items)")
        index %= len(self)
        if self.mode == "error":
            try:
                return self.dataset[index]
            except DataError:
                raise
            except Exception as error:
                raise DataError(self.problem(index, error)) from error
        return self._first_readable(index)

    @property
    def max_bad_files(self) -> int:
        """How many damaged files ``skip`` mode tolerates: ``floor(max_bad_fraction * len(dataset))``."""
        return math.floor(self.max_bad_fraction * len(self) + 1e-9)  # 1e-9: 0.29 * 100 is 28.999... in floats

    @property
    def bad_count(self) -> int:
        """Distinct damaged files found so far (by this process and its DataLoader workers)."""
        return int(self.flags.sum())

    def bad_paths(self) -> list[str]:
        """The damaged files found so far, in index order."""
        return [self.path_of(int(i)) for i in self.flags.nonzero().flatten()]

    def problem(self, index: int, error: BaseException) -> DataProblem:
        """The problem of item ``index``, whose reading raised ``error``."""
        return DataProblem(self.path_of(index), self.split, describe_error(error), self.fix)

    def _first_readable(self, index: int) -> Any:
        """Item ``index``, or the next one (cyclically) whose file reads; damaged files are flagged and counted."""
        n = len(self)
        for offset in range(n):
            candidate = (index + offset) % n
            if self.flags[candidate]:
                continue
            try:
                return self.dataset[candidate]
            except Exception as error:
                self._flag(candidate, error)
        raise DataError(DataProblem(self.path_of(index), self.split, "no file of the split reads", self.fix))

    def _flag(self, index: int, error: BaseException) -> None:
        """Flag a damaged file, log it once, and stop with a DataError past ``max_bad_fraction``."""
        self.flags[index] = 1
        message = str(error) if isinstance(error, DataError) else self.problem(index, error).message()
        logger.warning("%s.bad_files=skip: skipping a damaged file: %s", self.group, message)
        count = self.bad_count
        if count <= self.max_bad_files:
            return
        summary = DataProblem(
            self.path_of(index),
            self.split,
            f"{count} of the {len(self)} files of {self.split} are damaged, more than {self.group}.max_bad_fraction="
            f"{self.max_bad_fraction} allows ({self.max_bad_files}); this one {describe_error(error)}",
            "Run the app's check-data subcommand to list every damaged file and repair or remove them, or raise "
            f"{self.group}.max_bad_fraction.",
        )
        others = [
            DataProblem(path, self.split, "damaged, skipped earlier (its WARNING line says why)", self.fix)
            for path in self.bad_paths()
            if path != summary.path
        ]
        raise DataError([summary, *others]) from error


class BadFilesMonitor(pl.Callback):
    """Log ``data/bad_files``, the damaged files the training set skipped so far, at the end of each training epoch.

    Only when the training loader's dataset is a :class:`NamedFileErrors` in ``skip`` mode. Under DDP the flags of
    all ranks are merged (a file skipped on two ranks counts once), so every rank logs the same number.
    """

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Merge the ranks' flags and log their count."""
        dataset = training_dataset(trainer.train_dataloader)
        if not isinstance(dataset, NamedFileErrors) or dataset.mode != "skip":
            return
        flags = dataset.flags.to(pl_module.device, copy=True)  # (N,)
        if trainer.world_size > 1:
            flags = trainer.strategy.reduce(flags, reduce_op="max")
        pl_module.log(BAD_FILES_METRIC, float(flags.sum()), on_step=False, on_epoch=True, sync_dist=True)
