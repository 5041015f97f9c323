"""A damaged file named with its split, what is wrong and the fix: :class:`DataProblem`, :class:`DataError`.

Every app's checks speak these: the cheap checks of ``setup`` raise a :class:`DataError` before the model is built, a
file that fails while training raises one naming it (:mod:`kpca.training.data_checks.bad_files`), and ``check-data``
lists every :class:`DataProblem` as one table (:func:`format_problems`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kpca.training.errors import UserError


@dataclass(frozen=True)
class DataProblem:
    """One problem found in the data: the file (full path), the split, what is wrong and what to do.

    Attributes:
        path: the damaged file or folder, as an absolute path.
        split: the split or set it belongs to (``train``, ``val``, ``imagenet_c/fog/3``, ...).
        problem: what is wrong, with values as they are on disk.
        fix: what the user can do about it.
    """

    path: str
    split: str
    problem: str
    fix: str

    def message(self) -> str:
        """The problem as one sentence for an exception: path, split, what is wrong, the fix."""
        return f"{self.path} ({self.split}): {self.problem}. {self.fix}"


class DataError(UserError, ValueError):
    """Data that cannot be used, with the problems that make it so (each names its file and the fix).

    Also built from its message alone (``problems`` then empty): that is how PyTorch re-raises an exception from a
    DataLoader worker in the main process, so a worker's DataError reaches the user as a DataError.
    """

    exit_status = 3

    def __init__(self, problems: Sequence[DataProblem] | DataProblem | str) -> None:
        if isinstance(problems, str):
            self.problems: list[DataProblem] = []
            super().__init__(problems)
            return
        self.problems = [problems] if isinstance(problems, DataProblem) else list(problems)
        if not self.problems:
            raise ValueError("DataError needs at least one DataProblem.")
        lines = [problem.message() for problem in self.problems[:20]]
        if len(self.problems) > 20:
            lines.append(f"... and {len(self.problems) - 20} more (run the app's check-data subcommand for all).")
        super().__init__("\n".join(lines))


def format_problems(problems: Sequence[DataProblem]) -> str:
    """A Markdown table of ``problems`` (path, split, problem, fix), or a line saying there are none."""
    if not problems:
        return "No problems found."
    rows = ["| path | split | problem | fix |", "|---|---|---|---|"]
    for problem in problems:
        cells = (problem.path, problem.split, problem.problem, problem.fix)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)
