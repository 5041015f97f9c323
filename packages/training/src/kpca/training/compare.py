"""``kpca-report``: collect every run's report under a folder into one side-by-side comparison.

A run is a folder that LightningCLI saved a ``config.yaml`` into. Training runs hold ``checkpoints/``;
evaluation runs (``test``) hold the task's report CSV and name the checkpoint they evaluated in their
config's ``ckpt_path``, which links them to their training run. Runs whose configurations differ only in
the seed (and in paths, logger folders) are one model: its row shows mean ± std over the seeds. A
training run without an evaluation is listed as incomplete with the reason, never dropped silently.

Each app declares its report (a :class:`kpca.training.reports.ReportSchema`) next to the code that writes
it and registers it under a task name in the ``kpca.reports`` entry points; ``kpca-report`` reads only
what the installed apps register, so a new evaluation needs no change here.

Provenance: each evaluation's protocol per column group comes from its saved config through the schema's protocol
rules (:mod:`kpca.training.protocols`). The evaluation's settings are part of a row's identity, so runs measured
under different protocols, or evaluated with other settings, are never averaged into one cell: they are separate
rows (a training run evaluated twice with other settings gives two rows). Cells measured under the authors'
protocol are marked; each group's protocol is listed under the table and in the CSV's ``protocol:<group>`` columns.
Reference rows (``--reference``: published numbers, not measured here) are a block of their own, never averaged.

    kpca-report runs/ --task vision_cls          # runs/comparison.md, .csv and .png
    kpca-report runs/ --task vision_cls --reference paper.csv
    kpca-report --task                           # the installed tasks
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import re
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

import yaml

from kpca.training.files import write_atomic
from kpca.training.protocols import Protocol
from kpca.training.references import Reference, read_references
from kpca.training.reports import REPORT_ENTRY_POINTS, ReportSchema, markdown_table, write_report
from kpca.training.run_config import config_value, without_keys

logger = logging.getLogger(__name__)

RUN_SPECIFIC_KEYS = (
    "seed_everything", "ckpt_path", "config", "trainer.logger", "trainer.default_root_dir", "data.cache_dir",
    "model.compile",
)  # fmt: skip
"""Config keys that do not define a model: runs differing only in these are seeds of one model."""

PUBLISHED_MARK = "†"
"""The mark of a cell measured under the authors' published protocol of its column group."""

DESCRIPTION = """\
Collect the evaluation reports of every run under ROOT into one side-by-side comparison.

A run is a folder holding the config.yaml that LightningCLI saved. An evaluation run (the app's test
subcommand) names the checkpoint it evaluated in its config's ckpt_path, which links it to its training
run. Runs whose configs differ only in the seed (and in paths and logger folders) are one model: one row
with the mean and standard deviation of each metric over the seeds. Runs evaluated with other settings
(another protocol) are other rows, never averaged together; each column group's protocol is listed under
the table, and cells measured under the authors' published protocol are marked with a dagger. Writes
<name>.md, <name>.csv and <name>.png into the output folder and prints the Markdown table; training runs
without a report are listed with the reason. --reference adds published numbers from a CSV (columns
model, source, protocol and the report's metric names) as a separate block, never averaged in."""


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
    protocols: dict[str, Protocol] = field(default_factory=dict)
    """The evaluation's protocol per column group of the report, from its config."""

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
    def protocols(self) -> dict[str, Protocol]:
        """The protocol of each column group (the same for every run of the model)."""
        return self.runs[0].protocols

    def protocol_of_column(self, column: str) -> Protocol | None:
        """The protocol of the group ``column`` belongs to; None when the app declares no rule for it."""
        return next((protocol for protocol in self.protocols.values() if protocol.covers(column)), None)


def _natural_key(text: str) -> list:
    return [float(part) if re.fullmatch(r"\d+(\.\d+)?", part) else part for part in re.split(r"(\d+(?:\.\d+)?)", text)]


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
        raise ValueError(
            f"--task must be one of the installed report tasks {sorted(entries)}, got {task!r}; an app offers its "
            f"task through the {REPORT_ENTRY_POINTS!r} entry points of its pyproject.toml: install it (e.g. "
            "pip install -e apps/vision_cls) or, after editing those entry points, reinstall it"
        )
    schema = entries[task].load()
    if not isinstance(schema, ReportSchema):
        raise TypeError(
            f"the {REPORT_ENTRY_POINTS} entry point {task} = {entries[task].value} is a {type(schema).__name__}; "
            "point it at a kpca.training.reports.ReportSchema"
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


def _evaluation_key(config: dict, protocols: Mapping[str, Protocol], schema: ReportSchema) -> str:
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


def model_label(attention: Mapping) -> str:
    """A short name of a model from its attention settings, e.g. ``rpc n_iter=4 lambd=4.0 layers=[0]``."""
    kind = attention.get("kind", "?")
    parts = [str(kind)]
    if kind == "rpc":
        parts += [f"n_iter={attention.get('n_iter')}", f"lambd={attention.get('lambd')}"]
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
        if linked is None:
            standalone.append(Run(folder, config, metrics, folder, report, evaluation_key=key, protocols=protocols))
        else:
            runs = evaluated.setdefault(linked.folder.resolve(), {})
            runs.pop(key, None)  # the newest evaluation with these settings replaces an older one, and goes last
            runs[key] = Run(
                linked.folder, linked.config, metrics, folder, report, evaluation_key=key, protocols=protocols
            )
    collected = []
    for key, run in training.items():
        if key in evaluated:
            collected += evaluated[key].values()
        else:
            run.reason = max(problems[key])[1] if key in problems else _no_evaluation(run, root)
            collected.append(run)
    return [*collected, *standalone]


def _is_training(folder: Path) -> bool:
    """Whether a run folder is a training run (it holds ``checkpoints/``)."""
    return (folder / "checkpoints").is_dir()


def group_runs(runs: Sequence[Run]) -> tuple[list[Model], list[Run]]:
    """Complete runs grouped into models (same config but the seed, same evaluation settings), and the incomplete runs.

    Rows that would share a label are told apart by their experiment folder, then by their (first) evaluation folder.
    """
    models: dict[str, Model] = {}
    incomplete = []
    for run in runs:
        if run.metrics is None:
            incomplete.append(run)
            continue
        key = json.dumps([_model_key(run.config), run.evaluation_key])
        if key not in models:
            attention = find_attention(run.config.get("model", {}))
            models[key] = Model(model_label(attention), attention)
        models[key].runs.append(run)
    _distinguish(models.values(), lambda model: f" ({model.runs[0].folder.parent.name})")
    _distinguish(models.values(), lambda model: f" (test: {_folder_name(model.runs[0].evaluation)})")
    return list(models.values()), incomplete


def _distinguish(models: Iterable[Model], suffix) -> None:
    """Append ``suffix(model)`` to the labels that several models share, where the suffixes tell them apart."""
    same_label: dict[str, list[Model]] = {}
    for model in models:
        same_label.setdefault(model.label, []).append(model)
    for group in same_label.values():
        if len({suffix(model) for model in group}) > 1:
            for model in group:
                model.label += suffix(model)


def shown_columns(models: Sequence[Model], schema: ReportSchema) -> list[str]:
    """The schema's metrics present in any run, in the schema's order."""
    present = {name for model in models for run in model.runs for name in run.metrics}
    columns = []
    for pattern in schema.columns:
        columns += sorted((n for n in present if re.fullmatch(pattern, n) and n not in columns), key=_natural_key)
    return columns


def _mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    if not values:
        return math.nan, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def _folder_name(folder: Path) -> str:
    """A run folder as ``<parent>/<name>`` (e.g. ``lightning_logs/version_3``)."""
    return f"{folder.parent.name}/{folder.name}"


def column_groups(models: Sequence[Model], columns: Sequence[str]) -> list[str]:
    """The column groups (of the models' protocols) that the shown ``columns`` belong to, in column order."""
    groups: list[str] = []
    for column in columns:
        for model in models:
            protocol = model.protocol_of_column(column)
            if protocol is not None and protocol.group not in groups:
                groups.append(protocol.group)
    return groups


def _groups_with_values(model: Model, columns: Sequence[str]) -> dict[str, Protocol]:
    """The model's protocols of the groups it has a value in."""
    shown = {}
    for column in columns:
        protocol = model.protocol_of_column(column)
        if protocol is not None and any(column in run.metrics for run in model.runs):
            shown[protocol.group] = protocol
    return shown


def comparison_rows(
    models: Sequence[Model], incomplete: Sequence[Run], columns: Sequence[str], references: Sequence[Reference] = ()
) -> list[dict]:
    """The CSV rows: one per model, then one per incomplete run, then one per reference.

    A model's ``<metric>`` is the mean over its seeds and ``<metric>_std`` the sample standard deviation (empty
    with one seed), and ``protocol:<group>`` the protocol of each column group it has values in (``published`` or
    ``ours: <differences>``); an incomplete run has status ``incomplete: <folder>: <reason>`` and no metrics; a
    reference has status ``reference (<source>)``, its numbers and its stated protocol.
    """
    rows = []
    for model in models:
        row: dict[str, object] = {
            "model": model.label, "kind": model.attention.get("kind"), "n_iter": model.attention.get("n_iter"),
            "lambd": model.attention.get("lambd"), "layers": json.dumps(model.attention.get("layers")),
            "seeds": " ".join(str(run.seed) for run in model.runs), "runs": len(model.runs), "status": "complete",
        }  # fmt: skip
        for column in columns:
            mean, std = _mean_std([run.metrics[column] for run in model.runs if column in run.metrics])
            row[column], row[f"{column}_std"] = mean, std
        row |= {f"protocol:{group}": p.text for group, p in _groups_with_values(model, columns).items()}
        rows.append(row)
    for run in incomplete:
        attention = find_attention(run.config.get("model", {}))
        rows.append(
            {"model": model_label(attention), "kind": attention.get("kind"), "seeds": str(run.seed), "runs": 0,
             "status": f"incomplete: {run.folder}: {run.reason}"}
        )  # fmt: skip
    for reference in references:
        row = {"model": reference.model, "runs": 0, "status": f"reference ({reference.source})"}
        for column, value in reference.metrics.items():
            row[column], row[f"{column}_std"] = value, reference.stds.get(column)
        groups = column_groups(models, list(reference.metrics))
        row |= {f"protocol:{group}": reference.protocol for group in groups}
        rows.append(row)
    return rows


def _cell(mean: float, std: float | None) -> str:
    if math.isnan(mean):
        return ""
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def _protocol_section(models: Sequence[Model], columns: Sequence[str]) -> str:
    """The legend of the marks and each column group's protocol (per row where the rows differ)."""
    groups = column_groups(models, columns)
    if not groups:
        return ""
    marked = any(p.comparable_with_published for m in models for p in _groups_with_values(m, columns).values())
    text = (
        f"\n{PUBLISHED_MARK} measured under the authors' published protocol of its column group (docs/protocols.md); "
        "unmarked cells were measured under another protocol, named below.\n"
        if marked
        else "\nNo cell was measured under the authors' published protocol (docs/protocols.md); each column group's "
        "protocol is named below.\n"
    )
    text += "\nProtocol of each column group:\n\n"
    for group in groups:
        by_model = {m.label: p.text for m in models if (p := _groups_with_values(m, columns).get(group)) is not None}
        if len(set(by_model.values())) == 1:
            text += f"- `{group}`: {next(iter(by_model.values()))}\n"
        else:
            text += f"- `{group}`:\n" + "".join(f"  - {label}: {protocol}\n" for label, protocol in by_model.items())
    return text


def _reference_section(references: Sequence[Reference], schema_columns: Sequence[str]) -> str:
    """The "Reference (not measured here)" block: one row per reference with its source and protocol."""
    present = {name for reference in references for name in reference.metrics}
    columns = []
    for pattern in schema_columns:
        columns += sorted((n for n in present if re.fullmatch(pattern, n) and n not in columns), key=_natural_key)
    table = []
    for reference in references:
        row: dict[str, object] = {"model": reference.model, "source": reference.source, "protocol": reference.protocol}
        for column in columns:
            value = reference.metrics.get(column)
            row[column] = "" if value is None else _cell(value, reference.stds.get(column))
        table.append(row)
    return "\nReference (not measured here; never averaged with the rows above):\n\n" + markdown_table(table)


def comparison_markdown(
    models: Sequence[Model],
    incomplete: Sequence[Run],
    columns: Sequence[str],
    references: Sequence[Reference] = (),
    schema_columns: Sequence[str] = (),
) -> str:
    """The paper's layout: one row per model, the task's columns as ``mean ± std`` over seeds.

    A cell measured under the authors' published protocol of its column group is marked with
    :data:`PUBLISHED_MARK`; the protocol of each group follows the table (per row where the rows differ), then the
    references (matched to ``schema_columns``, the report's metric patterns) and the incomplete runs.
    """
    table = []
    for model in models:
        row: dict[str, object] = {"model": model.label, "seeds": " ".join(str(r.seed) for r in model.runs)}
        for column in columns:
            cell = _cell(*_mean_std([r.metrics[column] for r in model.runs if column in r.metrics]))
            protocol = model.protocol_of_column(column)
            published = cell and protocol is not None and protocol.comparable_with_published
            row[column] = f"{cell} {PUBLISHED_MARK}" if published else cell
        table.append(row)
    text = markdown_table(table) if table else "No complete runs.\n"
    text += _protocol_section(models, columns)
    if references:
        text += _reference_section(references, schema_columns)
    if incomplete:
        text += "\nIncomplete runs (no metrics to show):\n\n"
        text += "".join(f"- `{run.folder}` (seed {run.seed}): {run.reason}\n" for run in incomplete)
    return text


def comparison_figure(models: Sequence[Model], columns: Sequence[str]):
    """Bars (mean, error bar = std over seeds) of the non-attack metrics; accuracy against ε for each attack."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    attacks = sorted({c.split("/")[1] for c in columns if c.startswith("attack/")})
    plain = [c for c in columns if not c.startswith("attack/")]
    fig, axes = plt.subplots(1, 1 + len(attacks), figsize=(6 + 4 * len(attacks), 4), squeeze=False)
    width = 0.8 / max(len(models), 1)
    for i, model in enumerate(models):
        stats = [_mean_std([r.metrics[c] for r in model.runs if c in r.metrics]) for c in plain]
        axes[0, 0].bar(
            [j + i * width for j in range(len(plain))], [m for m, _ in stats], width,
            yerr=[s or 0.0 for _, s in stats], capsize=3, label=model.label,
        )  # fmt: skip
        for ax, attack in zip(axes[0, 1:], attacks, strict=True):
            names = [c for c in columns if c.startswith(f"attack/{attack}/")]
            eps = [float(c.split("/")[2].removeprefix("eps")) for c in names]
            stats = [_mean_std([r.metrics[c] for r in model.runs if c in r.metrics]) for c in names]
            ax.errorbar(eps, [m for m, _ in stats], yerr=[s or 0.0 for _, s in stats], marker="o", label=model.label)
            ax.set(title=attack, xlabel="ε (x 1/255)", ylabel="accuracy")
    axes[0, 0].set_xticks([j + 0.4 - width / 2 for j in range(len(plain))], plain, rotation=30, ha="right")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def compare(
    root: str | Path,
    task: str,
    out_dir: str | Path | None = None,
    name: str = "comparison",
    only: Iterable[str | Path] | None = None,
    *,
    references: Sequence[str | Path] = (),
) -> Path:
    """Collect the runs under ``root`` and write ``<name>.md``, ``.csv`` and ``.png`` into ``out_dir`` (default root).

    Args:
        root: folder searched for run folders.
        task: an installed report task (:func:`installed_tasks`), e.g. ``vision_cls``.
        out_dir: output folder, default ``root``.
        name: file stem of the outputs.
        only: keep just these run folders (training runs, or standalone evaluations), e.g. a demo's own runs.
        references: CSV files of published numbers (:mod:`kpca.training.references`), shown in a block of their
            own and as ``reference (<source>)`` rows of the CSV, never averaged with the runs.

    Returns:
        The Markdown file.

    Raises:
        ValueError: for an unknown ``task``, a folder without any run, or a reference file that does not fit the
            task's report.
    """
    schema = report_schema(task)
    reference_rows = read_references(references, schema)
    runs = collect_runs(root, schema)
    if only is not None:
        keep = {Path(folder).resolve() for folder in only}
        runs = [run for run in runs if run.folder.resolve() in keep]
    if not runs:
        raise ValueError(f"no run under {root}: expected folders with a LightningCLI config.yaml (e.g. runs/)")
    models, incomplete = group_runs(runs)
    columns = shown_columns(models, schema)
    out = Path(out_dir) if out_dir is not None else Path(root)
    markdown = comparison_markdown(models, incomplete, columns, reference_rows, schema.columns)
    rows = comparison_rows(models, incomplete, columns, reference_rows)
    md_path, _ = write_report(rows, out, name, markdown=markdown)
    if models:
        from matplotlib import pyplot as plt

        fig = comparison_figure(models, columns)
        write_atomic(out / f"{name}.png", lambda f: fig.savefig(f, format="png", dpi=110))
        plt.close(fig)
    for run in incomplete:
        logger.warning("kpca-report: incomplete run %s: %s", run.folder, run.reason)
    logger.info("kpca-report: %d models from %d runs -> %s", len(models), len(runs), md_path)
    return md_path


def task_listing() -> str:
    """The installed report tasks, one a line with the object that declares each (``kpca-report --task``)."""
    tasks = installed_tasks()
    if not tasks:
        return (
            f"No report tasks installed: no installed app registers one under the {REPORT_ENTRY_POINTS!r} entry "
            "points (install an app, e.g. pip install -e apps/vision_cls).\n"
        )
    width = max(map(len, tasks))
    lines = [f"  {name:<{width}}  {value}\n" for name, value in tasks.items()]
    return f"Report tasks of the installed apps ({REPORT_ENTRY_POINTS} entry points):\n" + "".join(lines)


def _parser() -> argparse.ArgumentParser:
    examples = (
        "examples:\n"
        "  kpca-report runs/ --task vision_cls   writes runs/comparison.md, .csv and .png\n"
        "  kpca-report runs/ --task vision_cls --reference paper.csv\n"
        "                                        adds the published numbers of paper.csv as reference rows\n"
        "  kpca-report --task                    lists the installed tasks\n\n"
        f"installed tasks: {', '.join(installed_tasks()) or 'none'}"
    )
    parser = argparse.ArgumentParser(
        prog="kpca-report",
        description=DESCRIPTION,
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("root", type=Path, nargs="?", help="folder searched for run folders (e.g. runs/)")
    parser.add_argument(
        "--task", nargs="?", const="", metavar="TASK",
        help="the app whose reports to compare (e.g. vision_cls); without a value, list the installed tasks",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: ROOT)")
    parser.add_argument("--name", default="comparison", help="file stem of the outputs (default: comparison)")
    parser.add_argument(
        "--reference", action="append", type=Path, default=[], metavar="CSV",
        help="published numbers to show beside the runs, never averaged in (repeatable): a CSV with the columns "
        "model, source (citation or URL), protocol (e.g. published) and metric columns named as the report's",
    )  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """The ``kpca-report`` console script: writes the comparison and prints its Markdown (or lists the tasks)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.task == "":
        sys.stdout.write(task_listing())
        return
    if args.task is None or args.root is None:
        parser.error(
            "give the runs folder and the task, e.g. kpca-report runs/ --task vision_cls "
            f"(installed tasks: {', '.join(installed_tasks()) or 'none'})"
        )
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    try:
        path = compare(args.root, args.task, args.out, args.name, references=args.reference)
    except ValueError as error:
        parser.error(str(error))
    sys.stdout.write(path.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
