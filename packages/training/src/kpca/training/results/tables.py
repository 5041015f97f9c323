"""Result tables: one list of rows written as Markdown and CSV with the same columns, atomically."""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from kpca.training.errors import OptionError
from kpca.training.files import write_atomic

logger = logging.getLogger(__name__)

REPORT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A report's file stem: letters, digits, ``.``, ``_``, ``-``; no path separators."""


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
    if not isinstance(name, str) or not REPORT_NAME.fullmatch(name):
        raise OptionError(f"report name must be a plain file stem like 'imagenet_c', got {name!r}")
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
        raise OptionError("rows is empty; pass at least one row (a dict of column -> value)")
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
