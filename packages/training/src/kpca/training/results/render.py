"""The comparison ``kpca-report`` writes of the collected models: its Markdown, CSV rows and figure.

A model's row shows mean ± std over its seeds; cells measured under the authors' protocol are marked
(:data:`PUBLISHED_MARK`); each column group's protocol is listed under the table and in the CSV's
``protocol:<group>`` columns. Reference rows (published numbers, not measured here) are a block of their own, never
averaged.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence

from kpca.training.results.collect import Model, Run, model_label
from kpca.training.results.protocol import EvaluationProtocol
from kpca.training.results.references import Reference
from kpca.training.results.schema import ReportSchema
from kpca.training.results.tables import markdown_table

PUBLISHED_MARK = "†"
"""The mark of a cell measured under the authors' published protocol of its column group."""


def _natural_key(text: str) -> list:
    return [float(part) if re.fullmatch(r"\d+(\.\d+)?", part) else part for part in re.split(r"(\d+(?:\.\d+)?)", text)]


def shown_columns(models: Sequence[Model], schema: ReportSchema) -> list[str]:
    """The schema's metrics present in any run, in the schema's order."""
    present = {name for model in models for run in model.runs for name in run.metrics}
    columns = []
    for pattern in schema.columns:
        columns += sorted((n for n in present if re.fullmatch(pattern, n) and n not in columns), key=_natural_key)
    return columns


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and the sample standard deviation of ``values`` (None with one value; NaN mean with none)."""
    if not values:
        return math.nan, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def column_groups(models: Sequence[Model], columns: Sequence[str]) -> list[str]:
    """The column groups (of the models' protocols) that the shown ``columns`` belong to, in column order."""
    groups: list[str] = []
    for column in columns:
        for model in models:
            protocol = model.protocol_of_column(column)
            if protocol is not None and protocol.group not in groups:
                groups.append(protocol.group)
    return groups


def _groups_with_values(model: Model, columns: Sequence[str]) -> dict[str, EvaluationProtocol]:
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
            mean, std = mean_std([run.metrics[column] for run in model.runs if column in run.metrics])
            row[column], row[f"{column}_std"] = mean, std
        row |= {f"protocol:{group}": p.text for group, p in _groups_with_values(model, columns).items()}
        rows.append(row)
    for run in incomplete:
        attention = run.attention
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
            cell = _cell(*mean_std([r.metrics[column] for r in model.runs if column in r.metrics]))
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


def attack_names(columns: Sequence[str]) -> list[str]:
    """The attacks of the ``attack/<name>/eps<ε>`` columns, sorted."""
    return sorted({c.split("/")[1] for c in columns if c.startswith("attack/")})


def figure_description(columns: Sequence[str]) -> str:
    """What :func:`comparison_figure` of ``columns`` shows, in words (for the line that names its file)."""
    parts = []
    if any(not c.startswith("attack/") for c in columns):
        parts.append(
            "a panel per metric with each model's mean over its seeds and the std as error bars, its axis spanning "
            "the values"
        )
    attacks = attack_names(columns)
    if attacks:
        parts.append(f"accuracy against ε for each attack ({', '.join(attacks)})")
    return "; ".join(parts)


FIGURE_COLUMNS = 4
"""Panels per row of the comparison figure."""


def comparison_figure(models: Sequence[Model], columns: Sequence[str]):
    """A panel per non-attack metric (each model's mean, error bar = std over seeds); accuracy against ε per attack.

    Each metric has its own axis, scaled to its values with a margin, so that gaps of 0.01 between models show
    (bars from 0, or a top-5 accuracy near 1 beside a perplexity, would hide them). Models keep their order and
    colour in every panel.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    attacks = attack_names(columns)
    plain = [c for c in columns if not c.startswith("attack/")]
    panels = len(plain) + len(attacks)
    across = min(FIGURE_COLUMNS, max(panels, 1))
    down = math.ceil(max(panels, 1) / across)
    fig, axes = plt.subplots(down, across, figsize=(3.6 * across + 1, 3.2 * down + 0.6), squeeze=False)
    flat = list(axes.flat)
    colours = [f"C{i % 10}" for i in range(len(models))]
    for ax, column in zip(flat, plain, strict=False):
        for i, (model, colour) in enumerate(zip(models, colours, strict=True)):
            mean, std = mean_std([r.metrics[column] for r in model.runs if column in r.metrics])
            if not math.isnan(mean):
                ax.errorbar([i], [mean], yerr=[std or 0.0], marker="o", capsize=4, color=colour, label=model.label)
        ax.set_xticks(range(len(models)), [""] * len(models))
        ax.set_xlim(-0.6, len(models) - 0.4)
        ax.margins(y=0.25)
        ax.set_title(column, fontsize=9)
    for ax, attack in zip(flat[len(plain) :], attacks, strict=False):
        names = [c for c in columns if c.startswith(f"attack/{attack}/")]
        eps = [float(c.split("/")[2].removeprefix("eps")) for c in names]
        for model, colour in zip(models, colours, strict=True):
            stats = [mean_std([r.metrics[c] for r in model.runs if c in r.metrics]) for c in names]
            ax.errorbar(eps, [m for m, _ in stats], yerr=[s or 0.0 for _, s in stats], marker="o", color=colour,
                        label=model.label)  # fmt: skip
        ax.set(title=attack, xlabel="ε (x 1/255)", ylabel="accuracy")
    for ax in flat[panels:]:
        ax.axis("off")
    for ax in flat[:panels]:
        ax.grid(alpha=0.3)
    handles, labels = flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(models), 3), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * math.ceil(len(models) / 3), 1, 1))
    return fig
