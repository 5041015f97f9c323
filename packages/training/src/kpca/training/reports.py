"""Result tables: one list of rows written as Markdown and CSV with the same columns, atomically.

An app's evaluation report is also described by a :class:`ReportSchema`, declared next to its writer and
registered under the ``kpca.reports`` entry points, through which ``kpca-report`` finds and reads it; the schema also
carries the protocol rules of the report's column groups (:mod:`kpca.training.protocols`).
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kpca.training.files import write_atomic
from kpca.training.protocols import Protocol, ProtocolRules, protocol_of

logger = logging.getLogger(__name__)

_REPORT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

REPORT_ENTRY_POINTS = "kpca.reports"
"""The entry-point group in which each app registers its :class:`ReportSchema` under a task name."""


@dataclass(frozen=True)
class ReportSchema:
    """One app's evaluation report: the file its evaluation writes and what ``kpca-report`` shows of it.

    The app declares it next to the code that writes the report, writes the report under ``stem`` (so that
    the two cannot drift) and registers it in its ``pyproject.toml``::

        [project.entry-points."kpca.reports"]
        vision_cls = "kpca.vision_cls.evaluation:ROBUSTNESS_REPORT"

    Attributes:
        stem: the report's default file stem: the evaluation writes ``<stem>.md`` and ``<stem>.csv`` into its
            run folder.
        read: parses the CSV into ``metric -> value``.
        columns: regular expressions of the metrics the comparison shows, in display order (matches of one
            pattern in natural order, e.g. attack radii ascending).
        name_setting: the dotted config key whose value, when a run sets it, replaces ``stem`` (e.g.
            ``model.evaluator.report_name``); None when the name is fixed.
        protocols: the :class:`~kpca.training.protocols.ProtocolRule` of each column group of the report (clean,
            corrupted, each attack, ...), or the function giving them for a run's config; () declares none.
    """

    stem: str
    read: Callable[[Path], dict[str, float]]
    columns: tuple[str, ...]
    name_setting: str | None = None
    protocols: ProtocolRules = ()

    def __post_init__(self) -> None:
        if not isinstance(self.stem, str) or not _REPORT_NAME.fullmatch(self.stem):
            raise ValueError(f"ReportSchema stem must be a plain file stem like 'robustness', got {self.stem!r}")
        for pattern in self.columns:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"ReportSchema pattern {pattern!r} is not a regular expression: {error}") from error

    def protocol_of(self, config: Mapping, metrics: Iterable[str] | None = None) -> dict[str, Protocol]:
        """The protocol of each column group of a run with this saved ``config.yaml`` (:func:`protocol_of`).

        Args:
            config: the run's config as LightningCLI saved it (the test run's).
            metrics: the run's report metrics, when known: only the groups with one of them are returned.

        Returns:
            group -> :class:`~kpca.training.protocols.Protocol`: ``published``, or ours with the differences.
        """
        return protocol_of(config, self.protocols, metrics)


def markdown_table(rows: Sequence[Mapping[str, object]]) -> str:
    """Rows as a Markdown table: columns are the keys in first-seen order, floats with 4 decimals.

    A missing key or ``None`` is an empty cell.
    """
    columns = _columns(rows)
    table = [columns] + [[_markdown_cell(row.get(column)) for column in columns] for row in rows]
    lines = ["| " + " | ".join(table[0]) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table[1:]]
    return "\n".join(lines) + "\n"


def write_report(
    rows: Sequence[Mapping[str, object]],
    out_dir: str | os.PathLike[str],
    name: str,
    *,
    show: bool = False,
    markdown: str | None = None,
) -> tuple[Path, Path]:
    """Write rows as a Markdown table ``<name>.md`` and a CSV ``<name>.csv`` with the same columns, atomically.

    Columns are the rows' keys in first-seen order; a missing key or ``None`` is an empty cell.
    Markdown shows floats with 4 decimals, the CSV keeps full precision. Each file is written to a
    temporary file in ``out_dir`` and moved into place with ``os.replace``, so readers never see a
    half-written report.

    Args:
        rows: one mapping per table row, string keys.
        out_dir: output folder, created if needed.
        name: file stem: letters, digits, ``.``, ``_``, ``-``; no path separators.
        show: also log the Markdown table at INFO (the console table of ``test``).
        markdown: the text of ``<name>.md`` when it is not the rows' table (e.g. formatted cells, notes).

    Returns:
        ``(markdown_path, csv_path)``.
    """
    if not isinstance(name, str) or not _REPORT_NAME.fullmatch(name):
        raise ValueError(f"report name must be a plain file stem like 'imagenet_c', got {name!r}")
    columns = _columns(rows)
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    markdown = markdown_table(rows) if markdown is None else markdown
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    md_path, csv_path = directory / f"{name}.md", directory / f"{name}.csv"
    _write_text(md_path, markdown)
    _write_text(csv_path, buffer.getvalue())
    if show:
        logger.info("%s\n%s", md_path, markdown)
    logger.info("wrote %s and %s", md_path, csv_path)
    return md_path, csv_path


def _columns(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """The keys of ``rows`` in first-seen order; ValueError / TypeError on no rows or a non-mapping row."""
    if not rows:
        raise ValueError("rows is empty; pass at least one row (a dict of column -> value)")
    columns: list[str] = []
    for row in rows:
        if not isinstance(row, Mapping):
            raise TypeError(f"each row must be a mapping of column name -> value, got {type(row).__name__}")
        columns.extend(key for key in row if key not in columns)
    return columns


def _markdown_cell(value: object) -> str:
    if value is None:
        return ""
    text = f"{value:.4f}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|")


def _write_text(path: Path, text: str) -> None:
    """Write text atomically (a temporary file renamed over ``path``)."""
    write_atomic(path, lambda stream: stream.write(text), mode="w", encoding="utf-8", newline="")
