"""The runs under a folder and their evaluations (the reading half of ``kpca-report``), grouped into models.

A run is a folder that LightningCLI saved a ``config.yaml`` into. Training runs hold ``checkpoints/``; evaluation
runs (``test``) hold the task's report CSV and name the checkpoint they evaluated in their config's ``ckpt_path``,
which links them to their training run. Runs whose configurations differ only in the seed (and in paths, logger
folders) are one :class:`Model`. A training run without an evaluation is kept with the reason, never dropped.

Each evaluation's protocol per column group comes from its saved config through the schema's protocol rules
(:mod:`kpca.training.results.protocol`). The evaluation's settings are part of a row's identity, so runs measured
under different protocols, or evaluated with other settings, are never one model (a training run evaluated twice with
other settings gives two).
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from importlib.metadata import entry_points
from pathlib import Path

import yaml

from kpca.attention import AttentionSpec
from kpca.attention.spec import KIND_SETTINGS, kinds, registered_kind, upgrade_saved_attention
from kpca.training.checkpointing.trained_options import OptionDifference
from kpca.training.errors import OptionError
from kpca.training.results.protocol import EvaluationProtocol, read_not_as_trained
from kpca.training.results.schema import REPORT_ENTRY_POINTS, ReportSchema
from kpca.training.run_config import config_value, without_keys

logger = logging.getLogger(__name__)


RUN_SPECIFIC_KEYS = (
    "seed_everything", "ckpt_path", "config", "trainer.logger", "trainer.default_root_dir", "data.cache_dir",
    "model.compile",
)  # fmt: skip
"""Config keys that do not define a model: runs differing only in these are seeds of one model."""


@dataclass
class Run:
    """One training run (or a standalone evaluation) and the report of one of its evaluations, if any.

    A training run evaluated with several settings appears once per setting, each time with the newest evaluation
    made with it.
    """

    folder: Path
    config: dict
    metrics: dict[str, float] | None = None
    evaluation: Path | None = None
    report: Path | None = None
    """The evaluation's report CSV (``<stem>.csv`` in :attr:`evaluation`, the stem its config names)."""
    reason: str = ""
    """Why the run has no metrics (set by :func:`collect_runs`)."""
    evaluation_key: str = ""
    """The evaluation's settings and protocols: runs with other ones are never averaged together."""
    protocols: dict[str, EvaluationProtocol] = field(default_factory=dict)
    """The evaluation's protocol per column group of the report, from its config."""
    evaluated_model: dict = field(default_factory=dict)
    """The evaluation's ``model`` section: what ran, which may differ from the training's (``--ckpt_path`` rule)."""
    not_as_trained: list[OptionDifference] = field(default_factory=list)
    """The evaluation's model options that differ from its checkpoint's training (its ``protocol.json`` says)."""
    attention_task: str = "vision"
    """Whose defaults name the settings its attention leaves null (the report's :attr:`ReportSchema.attention_task`)."""

    @property
    def attention(self) -> dict:
        """The attention that ran (the evaluation's, else the training's), its settings resolved.

        See :func:`resolved_attention`.
        """
        return resolved_attention(
            find_attention(self.evaluated_model or self.config.get("model", {})), self.attention_task
        )

    @property
    def seed(self) -> object:
        """The run's ``seed_everything``."""
        return self.config.get("seed_everything")


@dataclass
class Model:
    """Runs that differ only in the seed (same training and evaluation settings): one row of the comparison."""

    label: str
    attention: dict
    runs: list[Run] = field(default_factory=list)

    @property
    def protocols(self) -> dict[str, EvaluationProtocol]:
        """The protocol of each column group (the same for every run of the model)."""
        return self.runs[0].protocols

    def protocol_of_column(self, column: str) -> EvaluationProtocol | None:
        """The protocol of the group ``column`` belongs to; None when the app declares no rule for it."""
        return next((protocol for protocol in self.protocols.values() if protocol.covers(column)), None)


def _read_config(path: Path) -> dict:
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        logger.warning("kpca-report: skipping %s: unreadable config (%s)", path, error)
        return {}
    return config if isinstance(config, dict) else {}


def installed_tasks() -> dict[str, str]:
    """The report tasks the installed apps register (``kpca.reports`` entry points): name -> ``module:object``.

    Nothing is imported: the apps' modules load only when :func:`report_schema` asks for one task.
    """
    return dict(sorted((entry.name, entry.value) for entry in entry_points(group=REPORT_ENTRY_POINTS)))


def report_schema(task: str) -> ReportSchema:
    """Load the :class:`ReportSchema` that an installed app registers as ``task``.

    Raises:
        ValueError: when no installed app registers ``task`` (the message names those that do).
        TypeError: when the entry point is not a ReportSchema.
    """
    entries = {entry.name: entry for entry in entry_points(group=REPORT_ENTRY_POINTS)}
    if task not in entries:
        raise OptionError(
            f"--task must be one of the installed report tasks {sorted(entries)}, got {task!r}; an app offers its "
            f"task through the {REPORT_ENTRY_POINTS!r} entry points of its pyproject.toml: install it (e.g. "
            "pip install -e apps/vision_cls) or, after editing those entry points, reinstall it"
        )
    schema = entries[task].load()
    if not isinstance(schema, ReportSchema):
        raise TypeError(
            f"the {REPORT_ENTRY_POINTS} entry point {task} = {entries[task].value} is a {type(schema).__name__}; "
            "point it at a kpca.training.results.schema.ReportSchema"
        )
    return schema


def _model_key(config: dict, ignored: Sequence[str] = ()) -> str:
    """Equal for seeds of one model: the config as JSON without :data:`RUN_SPECIFIC_KEYS` and ``ignored``."""
    plain = json.loads(json.dumps(config, default=str))
    return json.dumps(without_keys(plain, (*RUN_SPECIFIC_KEYS, *ignored)), sort_keys=True)


def _spellings(dotted_key: str) -> list[str]:
    """Every way a saved config can hold ``dotted_key``: with or without ``init_args`` under each of its parents."""
    first, *rest = dotted_key.split(".")
    spellings = [first]
    for part in rest:
        spellings = [f"{head}{middle}.{part}" for head in spellings for middle in ("", ".init_args")]
    return spellings


def _evaluation_key(config: dict, protocols: Mapping[str, EvaluationProtocol], schema: ReportSchema) -> str:
    """Equal for evaluations made with the same settings: the config (not the report's name) and the protocols."""
    ignored = () if schema.name_setting is None else _spellings(schema.name_setting)
    texts = {group: protocol.text for group, protocol in protocols.items()}
    return json.dumps([_model_key(config, ignored), texts], sort_keys=True)


def find_attention(config: object) -> dict:
    """The first ``attention`` mapping in a (model) config, depth first; {} when there is none."""
    if isinstance(config, Mapping):
        if isinstance(config.get("attention"), Mapping):
            return dict(config["attention"])
        for value in config.values():
            found = find_attention(value)
            if found:
                return found
    return {}


def resolved_attention(attention: Mapping, task: str = "vision") -> dict:
    """A saved attention group with the settings its kind reads filled in and the others left out.

    A setting the saved config leaves null (``lambd`` of ``rpc`` or ``neutreno``) gets the value its kind gives it
    for ``task`` (:meth:`kpca.attention.AttentionSpec.resolved`); settings saved by configs older than that rule
    for a kind that does not read them are dropped. An attention group that is no valid spec is returned as saved.
    """
    spec_fields = {field.name for field in fields(AttentionSpec)}
    try:
        spec = AttentionSpec(**{k: v for k, v in upgrade_saved_attention(attention).items() if k in spec_fields})
        resolved = asdict(spec.resolved(task))
    except (TypeError, ValueError):
        return dict(attention)
    unread = set(KIND_SETTINGS) - set(registered_kind(spec.kind).settings)
    return {key: value for key, value in resolved.items() if key not in unread}


def model_label(attention: Mapping) -> str:
    """A short name of a model from its resolved attention, e.g. ``rpc n_iter=4 lambd=4.0 layers=[0]``.

    The kind, the settings it reads (``convention`` only when not the kind's default) and ``layers`` when not all; the
    attention is resolved by :func:`resolved_attention`.
    """
    kind = attention.get("kind", "?")
    default_convention = registered_kind(kind).settings.get("convention") if kind in kinds() else None
    parts = [str(kind)]
    parts += [
        f"{name}={attention[name]}"
        for name in ("n_iter", "lambd", "convention")
        if attention.get(name) is not None and (name, attention[name]) != ("convention", default_convention)
    ]
    if attention.get("layers", "all") != "all":
        parts.append(f"layers={attention.get('layers')}")
    return " ".join(parts)


def _checkpoint_run(ckpt_path: object, training: Mapping[Path, Run]) -> Run | None:
    """The training run whose ``checkpoints/`` holds ``ckpt_path`` (matched on its last folders if relative)."""
    if not isinstance(ckpt_path, str) or not ckpt_path:
        return None
    checkpoint = Path(ckpt_path)
    if checkpoint.parent.name != "checkpoints":
        return None
    run_folder = checkpoint.parent.parent
    for folder, run in training.items():
        if folder == run_folder.resolve() or folder.parts[-len(run_folder.parts) :] == run_folder.parts:
            return run
    return None


def report_stem(config: Mapping, schema: ReportSchema) -> tuple[str, str | None]:
    """The stem of the report a run writes, and the setting that names it when its config renames it.

    Returns:
        ``(stem, setting)``: the value at the schema's ``name_setting`` and ``"<name_setting>=<value>"`` when the
        config sets another stem than the schema's, else ``(schema.stem, None)``.
    """
    if schema.name_setting is not None:
        value = config_value(config, schema.name_setting)
        if value is not None and str(value) != schema.stem:
            return str(value), f"{schema.name_setting}={value}"
    return schema.stem, None


def _missing_report(folder: Path, stem: str, setting: str | None) -> str:
    """Why an evaluation folder without its report gives no metrics."""
    if setting is None:
        return f"the evaluation folder {folder} has config.yaml but no {stem}.csv (did its run stop before the end?)"
    return f"the evaluation folder {folder} has config.yaml but no {stem}.csv, the report its config names ({setting})"


def _no_evaluation(run: Run, root: Path) -> str:
    """Why a training run that no evaluation folder names gives no metrics."""
    return (
        f"no evaluation run found for its checkpoints: no config.yaml under {root} has a ckpt_path in "
        f"{run.folder / 'checkpoints'}; run the app's test subcommand with --ckpt_path set to one of them"
    )


def collect_runs(root: str | Path, schema: ReportSchema) -> list[Run]:
    """Every run under ``root``: training runs with their evaluations, then standalone evaluations.

    An evaluation is a folder holding its report, ``<stem>.csv`` where the stem is the one its config names
    (:func:`report_stem`). A training run gives one :class:`Run` per distinct evaluation setting (its config and the
    protocols it gives, :attr:`Run.evaluation_key`) with the newest evaluation made with it; they are listed oldest
    first, so the last one of a training folder is its newest evaluation. A run left without metrics says why in
    :attr:`Run.reason`: no evaluation names its checkpoints, its newest evaluation folder has no report, or the report
    is unreadable.
    """
    root = Path(root)
    folders = {path.parent: _read_config(path) for path in sorted(root.rglob("config.yaml"))}
    training = {folder.resolve(): Run(folder, config) for folder, config in folders.items() if _is_training(folder)}
    reports: list[tuple[float, Path, Path, dict, Run | None]] = []  # (mtime, report, folder, config, training run)
    problems: dict[Path, list[tuple[float, str]]] = {}  # training folder -> (mtime, why its evaluation failed)
    for folder, config in folders.items():
        stem, setting = report_stem(config, schema)
        report = folder / f"{stem}.csv"
        linked = _checkpoint_run(config.get("ckpt_path"), training)
        if report.is_file():
            reports.append((report.stat().st_mtime, report, folder, config, linked))
        elif linked is not None and not _is_training(folder):
            mtime = (folder / "config.yaml").stat().st_mtime
            problems.setdefault(linked.folder.resolve(), []).append((mtime, _missing_report(folder, stem, setting)))
    standalone = []
    evaluated: dict[Path, dict[str, Run]] = {}  # training folder -> evaluation key -> its newest evaluation
    for mtime, report, folder, config, linked in sorted(reports, key=lambda item: item[0]):
        try:
            metrics = schema.read(report)
        except (OSError, KeyError, ValueError, csv.Error) as error:
            unreadable = f"{report} is unreadable ({type(error).__name__}: {error})"
            if linked is None:
                standalone.append(Run(folder, config, reason=unreadable))
            else:
                problems.setdefault(linked.folder.resolve(), []).append((mtime, unreadable))
            continue
        protocols = schema.protocol_of(config, metrics)
        key = _evaluation_key(config, protocols, schema)
        not_as_trained = read_not_as_trained(folder)
        if linked is None:
            run = Run(folder, config, metrics, folder, report, evaluation_key=key, protocols=protocols)
            standalone.append(replace(run, not_as_trained=not_as_trained))
        else:
            runs = evaluated.setdefault(linked.folder.resolve(), {})
            runs.pop(key, None)  # the newest evaluation with these settings replaces an older one, and goes last
            run = Run(linked.folder, linked.config, metrics, folder, report, evaluation_key=key, protocols=protocols)
            runs[key] = replace(run, evaluated_model=config.get("model") or {}, not_as_trained=not_as_trained)
    collected = []
    for key, run in training.items():
        if key in evaluated:
            collected += evaluated[key].values()
        else:
            run.reason = max(problems[key])[1] if key in problems else _no_evaluation(run, root)
            collected.append(run)
    return [replace(run, attention_task=schema.attention_task) for run in [*collected, *standalone]]


def _is_training(folder: Path) -> bool:
    """Whether a run folder is a training run (it holds ``checkpoints/``)."""
    return (folder / "checkpoints").is_dir()


def group_runs(runs: Sequence[Run]) -> tuple[list[Model], list[Run]]:
    """Complete runs grouped into models (same config but the seed, same evaluation settings), and the incomplete runs.

    Rows that would share a label are told apart by their experiment folder, then by their (first) evaluation folder.
    A model evaluated with other model options than it was trained with is labelled by what ran, with the trained
    values after it (``rpc n_iter=6 lambd=4.0 (trained with n_iter=2)``).
    """
    models: dict[str, Model] = {}
    incomplete = []
    for run in runs:
        if run.metrics is None:
            incomplete.append(run)
            continue
        key = json.dumps([_model_key(run.config), run.evaluation_key])
        if key not in models:
            models[key] = Model(_label(run.attention, run.not_as_trained), run.attention)
        models[key].runs.append(run)
    _distinguish(models.values(), lambda model: f" ({model.runs[0].folder.parent.name})")
    _distinguish(models.values(), lambda model: f" (test: {_folder_name(model.runs[0].evaluation)})")
    return list(models.values()), incomplete


def _label(attention: Mapping, not_as_trained: Sequence[OptionDifference]) -> str:
    """The model's label from the attention that ran, plus what its training had instead, if it differs."""
    label = model_label(attention)
    if not_as_trained:
        label += " (trained with " + ", ".join(difference.short for difference in not_as_trained) + ")"
    return label


def _distinguish(models: Iterable[Model], suffix) -> None:
    """Append ``suffix(model)`` to the labels that several models share, where the suffixes tell them apart."""
    same_label: dict[str, list[Model]] = {}
    for model in models:
        same_label.setdefault(model.label, []).append(model)
    for group in same_label.values():
        if len({suffix(model) for model in group}) > 1:
            for model in group:
                model.label += suffix(model)


def _folder_name(folder: Path) -> str:
    """A run folder as ``<parent>/<name>`` (e.g. ``lightning_logs/version_3``)."""
    return f"{folder.parent.name}/{folder.name}"
