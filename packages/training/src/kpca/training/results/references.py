"""Reference rows of ``kpca-report``: numbers published elsewhere (not measured here), read from CSV files.

A reference file has the columns ``model``, ``source`` (the citation or URL the numbers come from), ``protocol``
(``published``, or what differs) and metric columns named as the task's report names them (``clean/acc1``,
``attack/pgd-reference-predicted/eps1/acc1``, ``test/ppl``, ...), each optionally with a ``<metric>_std`` column.
Empty cells are missing values. ``kpca-report`` shows them in a block of their own and never averages them in.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kpca.training.errors import OptionError
from kpca.training.results.schema import ReportSchema

REFERENCE_COLUMNS = ("model", "source", "protocol")
"""The columns every reference file has besides its metrics."""


@dataclass(frozen=True)
class Reference:
    """One reference row: a model's published numbers.

    Attributes:
        model: the model's name, as the source gives it.
        source: the citation or URL of the numbers.
        protocol: the protocol they were measured under, as the file says (e.g. ``published``).
        metrics: metric -> value (report names).
        stds: metric -> standard deviation, where the file gives one.
    """

    model: str
    source: str
    protocol: str
    metrics: dict[str, float]
    stds: dict[str, float]


def _is_metric(name: str, schema: ReportSchema) -> bool:
    """Whether ``name`` is one of the metrics the schema's comparison shows."""
    return any(re.fullmatch(pattern, name) for pattern in schema.columns)


def _number(text: str, where: str) -> float:
    """A cell's number; ValueError naming the cell and its value when it is not a finite number."""
    try:
        value = float(text)
    except ValueError:
        raise OptionError(
            f"{where} is {text!r}, not a number; write a plain number (0.721) or leave it empty"
        ) from None
    if not math.isfinite(value):
        raise OptionError(f"{where} is {text!r}; write a finite number or leave it empty")
    return value


def read_reference_file(path: str | Path, schema: ReportSchema) -> list[Reference]:
    """The reference rows of one CSV file, checked against the task's report.

    Raises:
        ValueError: naming the file and what to fix, for a missing ``model`` / ``source`` / ``protocol`` column or
            value, a metric column the report does not have (with the known ones), a cell that is not a number, or
            a file without rows.
    """
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as stream:
        reader = csv.DictReader(stream)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    missing = [column for column in REFERENCE_COLUMNS if column not in fields]
    if missing:
        raise OptionError(
            f"reference file {path} has no column {', '.join(missing)}; a reference file has the columns "
            f"{', '.join(REFERENCE_COLUMNS)} (source: the citation or URL of the numbers) and metric columns named "
            "as the report's"
        )
    metric_columns = [column for column in fields if column not in REFERENCE_COLUMNS]
    unknown = [column for column in metric_columns if not _is_metric(column.removesuffix("_std"), schema)]
    if unknown:
        raise OptionError(
            f"reference file {path}: unknown metric column(s) {unknown}; the {schema.stem} report's metric columns "
            f"are {', '.join(schema.columns)} (regular expressions), each optionally with a _std column"
        )
    if not rows:
        raise OptionError(f"reference file {path} has a header but no rows; add one row per published model")
    references = []
    for line, row in enumerate(rows, start=2):
        for column in REFERENCE_COLUMNS:
            if not (row.get(column) or "").strip():
                raise OptionError(
                    f"reference file {path} line {line}: the {column} is empty; every reference row names its model, "
                    "its source (the citation or URL of the numbers) and its protocol (e.g. published)"
                )
        values = {
            column: _number(row[column], f"reference file {path} line {line}, column {column}")
            for column in metric_columns
            if (row.get(column) or "").strip()
        }
        references.append(
            Reference(
                model=row["model"].strip(),
                source=row["source"].strip(),
                protocol=row["protocol"].strip(),
                metrics={name: value for name, value in values.items() if not name.endswith("_std")},
                stds={name.removesuffix("_std"): value for name, value in values.items() if name.endswith("_std")},
            )
        )
    return references


def read_references(paths: Iterable[str | Path], schema: ReportSchema) -> list[Reference]:
    """The reference rows of every file in ``paths``, in order (:func:`read_reference_file`)."""
    return [reference for path in paths for reference in read_reference_file(path, schema)]
