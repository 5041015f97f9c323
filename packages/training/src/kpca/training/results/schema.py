"""An app's evaluation report as ``kpca-report`` reads it: :class:`ReportSchema`, registered under ``kpca.reports``.

An app declares its schema next to the code that writes the report (:mod:`kpca.training.results.tables`) and
registers it under a task name in the ``kpca.reports`` entry points, through which ``kpca-report`` finds and reads it;
the schema also carries the protocol rules of the report's column groups (:mod:`kpca.training.results.protocol`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kpca.training.errors import OptionError
from kpca.training.results.protocol import EvaluationProtocol, ProtocolRules, protocol_of
from kpca.training.results.tables import REPORT_NAME

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
        protocols: the :class:`~kpca.training.results.protocol.ProtocolRule` of each column group of the report (clean,
            corrupted, each attack, ...), or the function giving them for a run's config; () declares none.
        attention_task: the ``kpca.attention`` task whose defaults the app's models build with (``vision`` or
            ``language``): a model's label names a setting left null by that task's default (NeuTRENO's lambd).
    """

    stem: str
    read: Callable[[Path], dict[str, float]]
    columns: tuple[str, ...]
    name_setting: str | None = None
    protocols: ProtocolRules = ()
    attention_task: str = "vision"

    def __post_init__(self) -> None:
        if not isinstance(self.stem, str) or not REPORT_NAME.fullmatch(self.stem):
            raise OptionError(f"ReportSchema stem must be a plain file stem like 'robustness', got {self.stem!r}")
        for pattern in self.columns:
            try:
                re.compile(pattern)
            except re.error as error:
                raise OptionError(f"ReportSchema pattern {pattern!r} is not a regular expression: {error}") from error

    def protocol_of(self, config: Mapping, metrics: Iterable[str] | None = None) -> dict[str, EvaluationProtocol]:
        """The protocol of each column group of a run with this saved ``config.yaml`` (:func:`protocol_of`).

        Args:
            config: the run's config as LightningCLI saved it (the test run's).
            metrics: the run's report metrics, when known: only the groups with one of them are returned.

        Returns:
            group -> :class:`~kpca.training.results.protocol.EvaluationProtocol`: ``published``, or ours with
            the differences.
        """
        return protocol_of(config, self.protocols, metrics)
