"""kpca.training.data_checks: the problems table, the parallel per-file check, and DataError across workers."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader, Dataset

from kpca.training.data_checks.check_data import check_in_workers
from kpca.training.data_checks.problems import DataError, DataProblem, format_problems


def _odd_is_damaged(item: int) -> list[DataProblem]:
    return [DataProblem(f"/data/{item}.jpg", "train", f"item {item} is damaged", "Replace it.")] if item % 2 else []


class _DamagedFile(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        raise DataError(DataProblem(f"/data/{index}.jpg", "train", "cannot be read", "Replace it."))


@pytest.mark.parametrize("workers", [0, 2])
def test_check_in_workers_keeps_the_order_of_the_items(workers: int):
    problems = check_in_workers(list(range(9)), _odd_is_damaged, workers, "items", progress=False, chunk=2)
    assert [problem.path for problem in problems] == ["/data/1.jpg", "/data/3.jpg", "/data/5.jpg", "/data/7.jpg"]


def test_format_problems_is_one_row_per_problem_and_escapes_bars():
    table = format_problems([DataProblem("/a|b.jpg", "val", "truncated", "Re-download it.")])
    assert table.splitlines()[2] == "| /a\\|b.jpg | val | truncated | Re-download it. |"
    assert format_problems([]) == "No problems found."


def test_a_data_error_raised_in_a_worker_arrives_as_a_data_error_naming_the_file():
    with pytest.raises(DataError, match=r"/data/0\.jpg \(train\): cannot be read\. Replace it\."):
        next(iter(DataLoader(_DamagedFile(), num_workers=1)))


def test_a_data_error_needs_a_problem():
    with pytest.raises(ValueError, match="at least one DataProblem"):
        DataError([])
