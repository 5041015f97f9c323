"""The plan's report (``kpca-experiment report``): one Markdown page comparing every run of a plan over its seeds.

``<out>/report.md`` holds, under the plan's title: for a plan with steps not done yet, the status table
(:func:`kpca.training.experiment.status.status_markdown`) and whatever results exist so far; the ``kpca-report``
comparison of the plan's runs (:func:`kpca.training.results.compare.compare`: ``comparison.{md,csv,png}``, one row per
model, mean ± std over seeds); the headlines (each a mean over metric regexes, mean ± std over seeds, and which run
is higher by how much); each run's own evaluation report (the first seed's in full, the others linked); the
merged kernel-PCA tables of the ``analyze`` steps (``kernel_pca.{md,csv,png}``, the first seed of each run) when the
plan asks for them; and the text samples of ``predict`` steps that write ``predictions.jsonl`` (the language
model's). Figures are PNG files next to it.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kpca.training.analysis import analysis_markdown, read_analysis, write_analysis
from kpca.training.errors import OptionError
from kpca.training.experiment.plan import Plan, PlanError, PlannedRun, step_folder
from kpca.training.experiment.status import status_markdown, step_states
from kpca.training.files import write_atomic
from kpca.training.results.collect import Run, collect_runs, report_schema
from kpca.training.results.compare import compare
from kpca.training.results.schema import ReportSchema

REPORT_FILE = "report.md"
COMPARISON = "comparison"
"""The file stem of the ``kpca-report`` comparison in the plan's folder."""
KERNEL_PCA = "kernel_pca"
"""The file stem of an ``analyze`` step's tables, and of the merged ones in the plan's folder."""
PREDICTIONS_FILE = "predictions.jsonl"
"""What a ``predict`` step may write into its folder: JSON lines with a ``text`` (the language model's samples)."""


@dataclass(frozen=True)
class HeadlineValues:
    """One run's value of one headline for each of its seeds that has it.

    Attributes:
        label: the run's display name.
        values: the mean of the headline's matching metrics, one per seed (in plan order).
    """

    label: str
    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        """The mean over seeds."""
        return statistics.fmean(self.values)

    def describe(self) -> str:
        """``label 0.9000`` for one seed, ``label 0.9000 ± 0.0100`` (sample std) for several."""
        if len(self.values) == 1:
            return f"{self.label} {self.mean:.4f}"
        return f"{self.label} {self.mean:.4f} ± {statistics.stdev(self.values):.4f}"


def write_plan_report(plan: Plan) -> Path:
    """Write ``<plan.out>/report.md`` (and the comparison and kernel-PCA files beside it); return its path.

    A plan whose steps are not all done gets the status table first and the results that exist so far.

    Raises:
        PlanError: when the plan has no ``report`` section, or its task is not an installed ``kpca-report`` task.
    """
    if plan.report is None:
        raise PlanError(
            f"{plan.path}: report: the plan has no report section, so there is nothing to write; add one, e.g. "
            f"report: {{task: {plan.app}, title: ...}}"
        )
    spec = plan.report
    try:
        schema = report_schema(spec.task)
    except ValueError as error:
        raise PlanError(f"{plan.path}: report.task: {error}") from error
    runs = plan_runs(plan, schema)
    metrics = {planned: run.metrics for planned, run in runs.items() if run.metrics is not None}
    sections = [f"# {spec.title}\n", status_section(plan), comparison_section(plan, spec.task, runs)]
    sections += [headlines_markdown(spec.headlines, plan, metrics), evaluation_section(plan, runs)]
    if spec.kernel_pca:
        sections.append(kernel_pca_section(plan))
    sections.append(samples_section(plan))
    page = "\n".join(section for section in sections if section)
    path = plan.out / REPORT_FILE
    write_atomic(path, lambda stream: stream.write(page), mode="w", encoding="utf-8")
    return path


def missing_report_note(plan: Plan) -> str:
    """What ``run`` says of a plan without a ``report`` section: no ``report.md``, and the two ways to get one."""
    return (
        f"no report: {shown(plan.path)} has no report section, so {shown(plan.out / REPORT_FILE)} is not written; add "
        f"one (e.g. report: {{task: {plan.app}}}) and run `kpca-experiment report {shown(plan.path)}`, or compare "
        f"the runs with `kpca-report {shown(plan.out)} --task {plan.app}`"
    )


def status_section(plan: Plan) -> str:
    """The status table with progress when some step of the plan is not done; "" when all are."""
    states = step_states(plan)
    pending = sum(state.state != "done" for state in states)
    if not pending:
        return ""
    return (
        f"## Status: {pending} of {len(states)} steps not done\n\n"
        f"The results below are those of the finished steps (`kpca-experiment status {shown(plan.path)}`).\n\n"
        f"{status_markdown(plan)}"
    )


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it, else absolute (for commands in the text)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def relative_link(path: Path, plan: Plan) -> str:
    """``path`` relative to the plan's folder, with ``/``: a link target in ``report.md``."""
    return Path(os.path.relpath(path, plan.out)).as_posix()


def plan_runs(plan: Plan, schema: ReportSchema) -> dict[PlannedRun, Run]:
    """The ``kpca-report`` run of each run and seed of the plan that has one yet, with its newest evaluation.

    That is the fit's folder once it holds checkpoints, or, for a plan without ``fit``, the folder of an
    evaluation step once it holds its report.
    """
    by_folder = {run.folder.resolve(): run for run in collect_runs(plan.out, schema)}
    found = {}
    for planned in plan.runs:
        for step in plan.steps:
            run = by_folder.get(step_folder(plan, planned, step.name).resolve())
            if run is not None:
                found[planned] = run
                break
    return found


def comparison_section(plan: Plan, task: str, runs: Mapping[PlannedRun, Run]) -> str:
    """The ``kpca-report`` comparison of the plan's runs (written as ``comparison.{md,csv,png}``), with its figure."""
    heading = f"## Results (`kpca-report {shown(plan.out)} --task {task}`)\n\n"
    if not runs:
        return f"{heading}No run has a checkpoint or an evaluation report yet.\n"
    labels = {run.folder: planned.label for planned, run in runs.items()}  # plan order, the plan's words
    md_path = compare(plan.out, task, plan.out, COMPARISON, only=list(labels), labels=labels)
    figure = md_path.with_suffix(".png")
    image = f"![comparison]({figure.name})\n\n" if figure.is_file() else ""
    return f"{heading}{image}{md_path.read_text(encoding='utf-8')}"


def headline_values(
    patterns: Sequence[str], plan: Plan, metrics: Mapping[PlannedRun, Mapping[str, float]]
) -> list[HeadlineValues]:
    """Per run (in plan order) the mean of the metrics that fully match any of ``patterns``, for each seed.

    Runs with no matching metric in any seed are left out.
    """
    values: dict[str, tuple[str, list[float]]] = {}
    for planned in plan.runs:
        found = metrics.get(planned, {})
        matches = [value for name, value in found.items() if any(re.fullmatch(p, name) for p in patterns)]
        if matches:
            values.setdefault(planned.name, (planned.label, []))[1].append(statistics.fmean(matches))
    return [HeadlineValues(label, tuple(seed_values)) for label, seed_values in values.values()]


def verdict(results: Sequence[HeadlineValues]) -> str:
    """Which run is higher and by how much (``A higher by 0.0100``); with more than two, the highest over the next."""
    if len(results) < 2:
        return ""
    first, second = sorted(results, key=lambda result: result.mean, reverse=True)[:2]
    margin = first.mean - second.mean
    if math.isclose(margin, 0.0, abs_tol=1e-12):
        return " (neither higher)" if len(results) == 2 else " (no single highest)"
    if len(results) == 2:
        return f" ({first.label} higher by {margin:.4f})"
    return f" ({first.label} highest, by {margin:.4f} over {second.label})"


def headlines_markdown(
    headlines: Mapping[str, Sequence[str]], plan: Plan, metrics: Mapping[PlannedRun, Mapping[str, float]]
) -> str:
    """A line per headline: each run's mean (± std over seeds) and which is higher; "" without headlines."""
    if not headlines:
        return ""
    seeds = len({run.seed for run in plan.runs})
    over = f" (mean ± std over {seeds} seeds)" if seeds > 1 else ""
    lines = [f"What the data shows{over}:", ""]
    for label, patterns in headlines.items():
        results = headline_values(patterns, plan, metrics)
        if not results:
            lines.append(f"- {label}: no finished run has a metric matching {', '.join(patterns)}")
            continue
        lines.append(f"- {label}: {', '.join(result.describe() for result in results)}{verdict(results)}")
    return "\n".join(lines) + "\n"


def evaluation_section(plan: Plan, runs: Mapping[PlannedRun, Run]) -> str:
    """Each run's own evaluation report (every metric, e.g. per corruption); "" when none exists yet.

    The first seed's are shown in full, the other seeds' linked.
    """
    first = set(first_seed_runs(plan))
    shown, links = [], []
    for planned, run in runs.items():
        report = own_report(run)
        if report is None:
            continue
        target = relative_link(report, plan)
        if planned in first:
            shown.append(f"### {planned.label}, seed {planned.seed} ([{target}]({target}))\n\n{demoted(report)}")
        else:
            links.append(f"- {planned.label}, seed {planned.seed}: [{target}]({target})")
    if not shown and not links:
        return ""
    text = "## Each run's own evaluation\n\n" + "\n".join(shown)
    if links:
        text += "\nThe other seeds' reports:\n\n" + "\n".join(links) + "\n"
    return text


def own_report(run: Run) -> Path | None:
    """The Markdown report of ``run``'s newest evaluation (beside its CSV), None when there is none."""
    if run.report is None:
        return None
    report = run.report.with_suffix(".md")
    return report if report.is_file() else None


def demoted(report: Path) -> str:
    """The text of a Markdown report with its headings two levels down, to sit under a run's heading."""
    lines = report.read_text(encoding="utf-8").splitlines()
    return "\n".join(f"##{line}" if line.startswith("#") else line for line in lines) + "\n"


def first_seed_runs(plan: Plan) -> list[PlannedRun]:
    """The first seed of each run, in plan order."""
    first: dict[str, PlannedRun] = {}
    for planned in plan.runs:
        first.setdefault(planned.name, planned)
    return list(first.values())


def kernel_pca_section(plan: Plan) -> str:
    """The ``analyze`` steps' kernel-PCA tables merged over runs (first seed of each), written as ``kernel_pca.*``."""
    heading = "## Kernel-PCA diagnostics\n\n"
    if not any(step.name == "analyze" for step in plan.steps):
        return f"{heading}The plan has no analyze step: add `- name: analyze` to its steps for this section.\n"
    step = plan.step("analyze")
    runs = first_seed_runs(plan)
    tables = {planned: step_folder(plan, planned, "analyze") / f"{KERNEL_PCA}.csv" for planned in runs}
    analysed = [planned for planned, table in tables.items() if table.is_file()]
    checkpoint = f"the {step.ckpt} checkpoint" if step.ckpt else "the checkpoint its overrides name"
    arguments = f" (`{' '.join(step.overrides)}`)" if step.overrides else ""
    text = f"{heading}The analyze step{arguments} on {checkpoint} of seed {runs[0].seed} of each run.\n\n"
    missing = [planned.id for planned in runs if planned not in analysed]
    if missing:
        text += f"Not analysed yet: {', '.join(missing)}.\n\n"
    if not analysed:
        return text
    analyses = {planned.label: read_analysis(tables[planned]) for planned in analysed}
    write_analysis(analyses, plan.out, KERNEL_PCA)
    figures = ", ".join(
        f"[{planned.label}]({relative_link(tables[planned].with_suffix('.png'), plan)})" for planned in analysed
    )
    return (
        f"{text}![kernel PCA]({KERNEL_PCA}.png)\n\n{analysis_markdown(analyses)}\n"
        f"Each run's own figure, with the Gram spectra: {figures}.\n"
    )


def read_samples(path: Path) -> list[str]:
    """The ``text`` of each JSON line of a ``predictions.jsonl`` that has one.

    Raises:
        ValueError: naming the file and line when a line is not JSON.
    """
    texts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise OptionError(f"{path}, line {number}: not JSON ({error}); rerun the predict step") from error
        if isinstance(row, dict) and isinstance(row.get("text"), str):
            texts.append(row["text"])
    return texts


def samples_section(plan: Plan) -> str:
    """The texts the ``predict`` steps wrote (first seed of each run), indented as code; "" when there are none."""
    if not any(step.name == "predict" for step in plan.steps):
        return ""
    blocks = []
    for planned in first_seed_runs(plan):
        path = step_folder(plan, planned, "predict") / PREDICTIONS_FILE
        if path.is_file():
            texts = [f"    {text}".replace("\n", "\n    ") for text in read_samples(path)]
            blocks.append(f"{planned.label}:\n\n" + "\n".join(texts) + "\n")
    if not blocks:
        return ""
    seed = first_seed_runs(plan)[0].seed
    return f"## Samples (predict step, seed {seed})\n\n" + "\n".join(blocks)
