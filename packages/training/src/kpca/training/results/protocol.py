"""Protocol provenance: under which evaluation protocol each column group of a report was measured.

An app declares, next to its report's :class:`~kpca.training.results.schema.ReportSchema`, one :class:`ProtocolRule` per
column group of the report (e.g. ``clean``, ``attack/pgd-reference-predicted``): the config settings that define how
the group is measured, each with the authors' value (:class:`Setting`), and the differences that no setting removes
(``fixed``, read from docs/protocols.md), which keep the group from ever being ``published``.

:func:`protocol_of` reads a run's saved LightningCLI ``config.yaml`` (the same dict ``kpca-report`` reads, so runs
made before this module get a protocol too) and gives each group a :class:`EvaluationProtocol`: ``published`` when every
setting has the authors' value and nothing fixed differs, else ``ours: <the differences>``. A setting the config does
not record at all counts as a difference (``not recorded``): a protocol is ``published`` only on evidence.

A ``test`` run records its protocol next to its report with :func:`record_protocol`: ``protocol.json`` (group ->
protocol text and ``comparable_with_published``) and a "Protocol" section for the report's Markdown.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from kpca.training.checkpointing.trained_options import OptionDifference, run_differences
from kpca.training.errors import OptionError
from kpca.training.files import write_atomic

logger = logging.getLogger(__name__)

PROTOCOL_FILE = "protocol.json"
"""The file a ``test`` run writes next to its report: group -> protocol text and ``comparable_with_published``."""

CHECKPOINT_ENTRY = "checkpoint"
"""The entry of ``protocol.json`` (beside the groups) naming the model options that differ from the checkpoint's
training, when the run was given others than those it was trained with."""

PUBLISHED = "published"
"""The protocol text of a group measured exactly as the authors measured it."""

_NOT_RECORDED = object()
"""What :func:`config_entry` returns for a setting the config does not hold (a null value is recorded)."""


def config_entry(config: object, dotted_key: str) -> object:
    """The setting at ``dotted_key`` of a saved config, or a sentinel when the config does not record it.

    Looks through ``init_args`` as LightningCLI saves class-typed arguments (``model.evaluator.attack_batches``
    finds ``model: {evaluator: {init_args: {attack_batches: ...}}}``) and into lists by index
    (``model.evaluator.attacks.0.space``). Unlike :func:`kpca.training.run_config.config_value`, it tells a recorded
    null from an absent key: use :func:`is_recorded` on the result.
    """
    node = config
    for key in dotted_key.split("."):
        if isinstance(node, Mapping):
            if key not in node and isinstance(node.get("init_args"), Mapping):
                node = node["init_args"]
            if key not in node:
                return _NOT_RECORDED
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return _NOT_RECORDED
    return node


def is_recorded(value: object) -> bool:
    """Whether a :func:`config_entry` result is a value the config records (None included)."""
    return value is not _NOT_RECORDED


def value_text(value: object) -> str:
    """A setting's value as a difference names it: YAML's spelling (``null``, ``false``, ``[1, 2]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(item) for item in value) + "]"
    return str(value)


def _plain(value: object) -> object:
    """Tuples as lists, recursively, so that a saved list equals the tuple a rule declares."""
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


@dataclass(frozen=True)
class Setting:
    """One config setting that defines a protocol, with the authors' value of it.

    Attributes:
        key: the dotted config key (lists by index: ``model.evaluator.attacks.0.space``).
        published: the authors' value.
        name: how a difference names the setting (default: the key's last part).
        default: what a recorded null means (e.g. ``"context / 2"`` for ``data.eval_stride: null``); compared and
            shown in place of the null.
        matches: which values reproduce the authors' protocol, when more than ``published`` does (default: equal to
            ``published``, lists and tuples alike).
        published_text: how a difference shows the authors' value (default: ``published`` in YAML's spelling).
        old_key: the dotted key the setting had before it moved (``data.eval_subset`` for ``data.eval.subset``); a
            config saved before the move, which records the setting there only, is read there.
    """

    key: str
    published: object
    name: str = ""
    default: object = None
    matches: Callable[[object], bool] | None = None
    published_text: str = ""
    old_key: str | None = None

    @property
    def label(self) -> str:
        """The name a difference gives the setting."""
        return self.name or self.key.rpartition(".")[2]

    def difference(self, config: Mapping) -> str | None:
        """``<name>=<value> (published: <value>)`` when ``config`` differs from the authors' value, else None.

        A setting the config does not record is a difference (``<name> not recorded (published: ...)``).
        """
        published = self.published_text or value_text(self.published)
        value = config_entry(config, self.key)
        if not is_recorded(value) and self.old_key is not None:
            value = config_entry(config, self.old_key)
        if not is_recorded(value):
            return f"{self.label} not recorded (published: {published})"
        if value is None:
            value = self.default
        same = self.matches(value) if self.matches is not None else _plain(value) == _plain(self.published)
        return None if same else f"{self.label}={value_text(value)} (published: {published})"


@dataclass(frozen=True)
class ProtocolRule:
    """What defines the protocol of one column group of a report.

    Attributes:
        group: the group's name, e.g. ``clean`` or ``attack/pgd-reference-predicted``.
        columns: a regular expression matching the report metrics of the group (``clean/acc[15]``).
        settings: the config settings that define the group's protocol, with the authors' values.
        fixed: differences from the authors' protocol that no setting removes (docs/protocols.md's remaining
            differences): a group with any is never ``published``.
        complete_when: a metric the report holds only when the group's whole benchmark ran (``imagenet_c/mCE``);
            when a run's metrics have some of the group's columns but not this one, ``incomplete`` is a difference.
        incomplete: the difference named then.
        notes: what a reader must know to compare the group's numbers that is no difference from the authors'
            protocol (e.g. a model that, as the authors', sees later tokens): shown with the protocol, never
            making it ``ours``.
    """

    group: str
    columns: str
    settings: tuple[Setting, ...] = ()
    fixed: tuple[str, ...] = ()
    complete_when: str | None = None
    incomplete: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.group:
            raise OptionError("ProtocolRule group is empty; name the column group, e.g. 'clean'")
        try:
            re.compile(self.columns)
        except re.error as error:
            message = f"ProtocolRule {self.group!r}: columns {self.columns!r} is not a regular expression: {error}"
            raise OptionError(message) from None
        if self.complete_when is not None and not self.incomplete:
            raise OptionError(
                f"ProtocolRule {self.group!r} sets complete_when={self.complete_when!r}; also say in incomplete what "
                "differs when that metric is missing"
            )


ProtocolRules = tuple[ProtocolRule, ...] | Callable[[Mapping], Sequence[ProtocolRule]]
"""An app's rules: a fixed tuple, or a function of the run's config (e.g. one rule per configured attack)."""


@dataclass(frozen=True)
class EvaluationProtocol:
    """The protocol one column group of a run was measured under.

    Attributes:
        group: the column group.
        columns: the regular expression of the group's report metrics.
        differences: each way the run differs from the authors' protocol; empty when it is theirs.
        notes: the rule's notes (:attr:`ProtocolRule.notes`).
    """

    group: str
    columns: str
    differences: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def comparable_with_published(self) -> bool:
        """Whether the group was measured exactly as the authors measured it."""
        return not self.differences

    @property
    def text(self) -> str:
        """``published``, or ``ours: <difference>; <difference>; ...``, then ``; note: <note>`` for each note."""
        text = PUBLISHED if self.comparable_with_published else "ours: " + "; ".join(self.differences)
        return text + "".join(f"; note: {note}" for note in self.notes)

    def covers(self, metric: str) -> bool:
        """Whether ``metric`` is one of the group's columns."""
        return re.fullmatch(self.columns, metric) is not None


def protocol_of(
    config: Mapping, rules: ProtocolRules, metrics: Iterable[str] | None = None
) -> dict[str, EvaluationProtocol]:
    """The protocol of each column group of a run, from its saved ``config.yaml``.

    Args:
        config: the run's config as LightningCLI saved it (the test run's, for an evaluation).
        rules: the app's :class:`ProtocolRule` s, or the function giving them for a config.
        metrics: the metrics of the run's report, when known: then only the groups with at least one of them are
            returned, and a group missing its ``complete_when`` metric gets its ``incomplete`` difference.

    Returns:
        group -> :class:`EvaluationProtocol`, in the rules' order.
    """
    present = None if metrics is None else set(metrics)
    protocols = {}
    for rule in rules(config) if callable(rules) else rules:
        measured = None if present is None else [m for m in present if re.fullmatch(rule.columns, m)]
        if measured is not None and not measured:
            continue
        differences = [text for setting in rule.settings if (text := setting.difference(config)) is not None]
        differences += rule.fixed
        if measured is not None and rule.complete_when is not None and rule.complete_when not in present:
            differences.append(rule.incomplete)
        protocols[rule.group] = EvaluationProtocol(rule.group, rule.columns, tuple(differences), rule.notes)
    return protocols


def protocol_lines(protocols: Mapping[str, EvaluationProtocol]) -> str:
    """One Markdown bullet per group: ``- `<group>`: <protocol text>``."""
    return "".join(f"- `{group}`: {protocol.text}\n" for group, protocol in protocols.items())


def protocol_record(protocols: Mapping[str, EvaluationProtocol]) -> dict[str, dict[str, object]]:
    """The content of ``protocol.json``: group -> protocol text, ``comparable_with_published`` and the differences."""
    return {
        group: {
            "protocol": protocol.text,
            "comparable_with_published": protocol.comparable_with_published,
            "differences": list(protocol.differences),
            **({"notes": list(protocol.notes)} if protocol.notes else {}),
        }
        for group, protocol in protocols.items()
    }


def record_protocol(rules: ProtocolRules, run_dir: str | Path, metrics: Iterable[str]) -> str:
    """Write ``protocol.json`` into a test run's folder and return the "Protocol" section of its report.

    The protocol comes from the ``config.yaml`` that LightningCLI saved into ``run_dir`` at setup, through the
    report's rules (:func:`protocol_of`), for the groups that have one of ``metrics``. When the run's model options
    differ from those its ``ckpt_path`` was trained with, ``protocol.json`` names them under :data:`CHECKPOINT_ENTRY`
    and the section gets a ``model`` line ("not as trained: ... n_iter=6 (trained with 2)"). Without a
    ``config.yaml`` (a run outside the app's command line) nothing is written and the section says so.

    Args:
        rules: the protocol rules of the app's report (its ``ReportSchema.protocols``).
        run_dir: the run's folder, which the report is written into.
        metrics: the metrics of the report, named as the report schema's ``read`` names them.

    Returns:
        The section's Markdown, starting with a blank line.
    """
    folder = Path(run_dir)
    config_path = folder / "config.yaml"
    if not config_path.is_file():
        return (
            f"\n## Protocol\n\nNot recorded: {folder} holds no config.yaml (the apps' command lines save one; "
            "docs/protocols.md lists each setting's published value).\n"
        )
    config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    protocols = protocol_of(config, rules, metrics)
    record = protocol_record(protocols)
    lines = protocol_lines(protocols)
    differences = run_differences(config)
    if differences:
        record[CHECKPOINT_ENTRY] = {
            "path": config["ckpt_path"],
            "differences": [{"option": d.key, "trained": d.trained, "used": d.used} for d in differences],
        }
        texts = "; ".join(difference.text for difference in differences)
        lines += f"- model: not as trained: {texts}, from {config['ckpt_path']}\n"
    text = json.dumps(record, indent=2) + "\n"
    write_atomic(folder / PROTOCOL_FILE, lambda stream: stream.write(text), mode="w", encoding="utf-8")
    logger.info("wrote %s", folder / PROTOCOL_FILE)
    return (
        "\n## Protocol\n\nEach column group against the authors' protocol (docs/protocols.md): `published` when every "
        "setting that defines it has the authors' value, else ours, with the differences.\n\n" + lines
    )


def read_not_as_trained(run_dir: str | Path) -> list[OptionDifference]:
    """The model options of an evaluation run that differ from its checkpoint's training, from its ``protocol.json``.

    Empty for a run that used the options it was trained with, or that wrote no ``protocol.json``.
    """
    path = Path(run_dir) / PROTOCOL_FILE
    if not path.is_file():
        return []
    entry = json.loads(path.read_text(encoding="utf-8")).get(CHECKPOINT_ENTRY) or {}
    return [OptionDifference(d["option"], d["trained"], d["used"]) for d in entry.get("differences", [])]


def read_protocol_file(run_dir: str | Path) -> dict[str, str]:
    """The protocol text of each group in a run's ``protocol.json``; {} when the run wrote none."""
    path = Path(run_dir) / PROTOCOL_FILE
    if not path.is_file():
        return {}
    entries = json.loads(path.read_text(encoding="utf-8"))
    return {group: entry["protocol"] for group, entry in entries.items() if group != CHECKPOINT_ENTRY}


WHOLE_TEST_SET: tuple[Setting, ...] = (
    Setting(
        "trainer.limit_test_batches", None, name="limit_test_batches",
        matches=lambda value: value is None or (isinstance(value, float) and value == 1.0),
        published_text="null (every batch)",
    ),
    Setting("trainer.fast_dev_run", False, name="fast_dev_run", matches=lambda value: value in (None, False, 0)),
)  # fmt: skip
"""The trainer settings that keep ``test`` on every batch of every evaluation set, as the authors evaluate."""
