"""``check-data``: finding damaged data before it costs a run, with a parallel check over every file.

Every app's datamodule implements ``check_data(progress) -> (files checked, problems)`` (the contract is
:meth:`kpca.training.data.ProjectDataModule.check_data`; the ``check-data`` subcommand runs it through
:func:`run_data_check` and prints the problems as one table, exiting non-zero when there are any) and runs its cheap
checks (layout, non-empty splits, text encoding) in ``setup``, raising :class:`DataError` before the model is built.
:func:`check_in_workers` reads many files in the datamodule's DataLoader workers with a progress bar.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from torch.utils.data import DataLoader, Dataset

from kpca.training.data_checks.problems import DataProblem
from kpca.training.errors import OptionError

T = TypeVar("T")


class _CheckEach(Dataset):
    """Item ``i`` is ``check(items[i])``: the list of problems of one file, computed in a worker."""

    def __init__(self, items: Sequence[T], check: Callable[[T], list[DataProblem]]) -> None:
        self.items = items
        self.check = check

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> list[DataProblem]:
        return self.check(self.items[index])


def _concatenate(batch: list[list[DataProblem]]) -> list[DataProblem]:
    return [problem for problems in batch for problem in problems]


def check_in_workers(
    items: Sequence[T],
    check: Callable[[T], list[DataProblem]],
    num_workers: int,
    description: str,
    progress: bool = True,
    chunk: int = 64,
) -> list[DataProblem]:
    """Run ``check`` on every item in ``num_workers`` DataLoader workers (0: this process), with a progress bar.

    Args:
        items: what to check (paths, or tuples of paths); picklable, as is ``check``.
        check: returns the problems of one item (an empty list when it is sound); it must not raise.
        num_workers: worker processes, as the training loader's.
        description: the progress bar's label (e.g. ``"train images"``).
        progress: show a progress bar on stderr.
        chunk: items per worker task.

    Returns:
        The problems in the order of ``items``.
    """
    from tqdm import tqdm

    loader = DataLoader(
        _CheckEach(items, check), batch_size=chunk, num_workers=num_workers, collate_fn=_concatenate, shuffle=False
    )
    problems: list[DataProblem] = []
    with tqdm(total=len(items), desc=description, unit="file", disable=not progress, file=sys.stderr) as bar:
        done = 0
        for batch_problems in loader:
            problems.extend(batch_problems)
            step = min(chunk, len(items) - done)
            done += step
            bar.update(step)
    return problems


@dataclass(frozen=True)
class DataCheckResult:
    """What a data check found.

    Attributes:
        files: how many files were checked.
        problems: the problems found, each naming its file.
        seconds: how long the check took.
    """

    files: int
    problems: list[DataProblem]
    seconds: float

    def summary(self) -> str:
        """One line: files checked, problems, seconds and files per second."""
        rate = self.files / self.seconds if self.seconds > 0 else float("inf")
        count = len(self.problems)
        return (
            f"check-data: {self.files} files checked, {count} problem{'' if count == 1 else 's'}, "
            f"{self.seconds:.1f} s ({rate:.0f} files/s)"
        )


def run_data_check(datamodule: Any, workers: int | None = None, progress: bool = True) -> DataCheckResult:
    """Run ``datamodule.check_data`` with ``workers`` DataLoader workers (None: its own ``num_workers``), timed.

    Raises:
        TypeError: If the datamodule has no ``check_data`` method (it is not a ``ProjectDataModule``).
        ValueError: If ``workers`` is negative.
    """
    check = getattr(datamodule, "check_data", None)
    if not callable(check):
        raise TypeError(
            f"{type(datamodule).__name__} has no check_data(progress) method, so check-data cannot check its files; "
            "subclass kpca.training.data.ProjectDataModule and implement it (see ProjectDataModule.check_data)."
        )
    if workers is not None:
        if workers < 0:
            raise OptionError(
                f"--workers={workers} must be 0 (check in this process) or more; unset: data.num_workers."
            )
        datamodule.num_workers = workers
    start = time.perf_counter()
    files, problems = check(progress=progress)
    return DataCheckResult(files, list(problems), time.perf_counter() - start)
