"""``kpca-report``: collect every run's report under a folder into one side-by-side comparison.

A run is a folder that LightningCLI saved a ``config.yaml`` into. Training runs hold ``checkpoints/``;
evaluation runs (``test``) hold the task's report CSV and name the checkpoint they evaluated in their
config's ``ckpt_path``, which links them to their training run. Runs whose configurations differ only in
the seed (and in paths, logger folders) are one model: its row shows mean ± std over the seeds. A
training run without an evaluation is listed as incomplete, never dropped silently.

    kpca-report runs/ --task vision_cls          # runs/comparison.md, .csv and .png
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kpca.training.files import write_atomic
from kpca.training.reports import markdown_table, write_report

logger = logging.getLogger(__name__)

VOLATILE = ("seed_everything", "ckpt_path", "config", "trainer.logger", "trainer.default_root_dir", "data.cache_dir")
"""Config keys that do not define a model: runs differing only in these are seeds of one model."""


def _metric_value_rows(path: Path) -> dict[str, float]:
    """A ``metric,value`` report (vision_cls ``robustness.csv``)."""
    with path.open(newline="") as stream:
        return {row["metric"]: float(row["value"]) for row in csv.DictReader(stream) if row["value"] != ""}


def _perplexity_rows(path: Path) -> dict[str, float]:
    """``perplexity.csv``: word-level perplexity of each evaluated set, as ``<set>/ppl``."""
    with path.open(newline="") as stream:
        return {f"{row['set']}/ppl": float(row["ppl_word"]) for row in csv.DictReader(stream)}


def _segmentation_rows(path: Path) -> dict[str, float]:
    """``segmentation.csv``: the clean set's and the corrupted mean's metrics (in %)."""
    names = {"clean": "clean", "all corruptions": "corrupted"}
    metrics = {}
    with path.open(newline="") as stream:
        for row in csv.DictReader(stream):
            if row["set"] in names:
                prefix = names[row["set"]]
                metrics |= {f"{prefix}/{m}": float(row[m]) for m in ("mIoU", "mAcc", "aAcc") if row.get(m)}
    return metrics


@dataclass(frozen=True)
class Task:
    """What one app's evaluation writes, and which of its metrics the comparison shows, in order.

    Attributes:
        report: the report CSV an evaluation run writes into its folder.
        read: parses that file into ``metric -> value``.
        columns: regular expressions of the shown metrics, in display order (matches of one pattern in
            natural order, e.g. attack radii ascending).
        higher_is_better: patterns of metrics where higher is better (the rest: lower is better).
    """

    report: str
    read: Callable[[Path], dict[str, float]]
    columns: tuple[str, ...]
    higher_is_better: tuple[str, ...] = ()


TASKS: dict[str, Task] = {
    "vision_cls": Task(
        "robustness.csv",
        _metric_value_rows,
        (
            r"clean/acc1",
            r"clean/acc5",
            r"imagenet_c/mCE",
            r"imagenet_c/mean_acc1",
            r"corrupted/mean_acc1",
            r"imagenet_a/acc1",
            r"imagenet_r/acc1",
            r"imagenet_o/aupr",
            r"attack/[^/]+/eps[^/]+/acc1",
        ),
        higher_is_better=(r".*acc\d", r".*aupr"),
    ),  # fmt: skip
    "language_model": Task(
        "perplexity.csv", _perplexity_rows, (r"valid/ppl", r"valid_wordswap/ppl", r"test/ppl", r"test_wordswap/ppl")
    ),
    "segmentation": Task(
        "segmentation.csv",
        _segmentation_rows,
        (r"clean/mIoU", r"clean/mAcc", r"clean/aAcc", r"corrupted/mIoU", r"corrupted/mAcc", r"corrupted/aAcc"),
        higher_is_better=(r".*",),
    ),
}


@dataclass
class Run:
    """One training run (or a standalone evaluation) and the report of its newest evaluation, if any."""

    folder: Path
    config: dict
    metrics: dict[str, float] | None = None
    evaluation: Path | None = None

    @property
    def seed(self) -> object:
        """The run's ``seed_everything``."""
        return self.config.get("seed_everything")


@dataclass
class Model:
    """Runs that differ only in the seed: one row of the comparison."""

    label: str
    attention: dict
    runs: list[Run] = field(default_factory=list)


def _natural_key(text: str) -> list:
    return [float(part) if re.fullmatch(r"\d+(\.\d+)?", part) else part for part in re.split(r"(\d+(?:\.\d+)?)", text)]


def _read_config(path: Path) -> dict:
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        logger.warning("kpca-report: skipping %s: unreadable config (%s)", path, error)
        return {}
    return config if isinstance(config, dict) else {}


def _without(config: dict, dotted_keys: Iterable[str]) -> dict:
    config = json.loads(json.dumps(config, default=str))
    for dotted in dotted_keys:
        *parents, last = dotted.split(".")
        node = config
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return config


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


def collect_runs(root: str | Path, task: Task) -> list[Run]:
    """Every run under ``root``: training runs with their newest evaluation, then standalone evaluations."""
    configs = sorted(Path(root).rglob("config.yaml"))
    training = {
        p.parent.resolve(): Run(p.parent, _read_config(p)) for p in configs if (p.parent / "checkpoints").is_dir()
    }
    standalone = []
    evaluations = [p.parent for p in configs if (p.parent / task.report).is_file()]
    for folder in sorted(evaluations, key=lambda f: (f / task.report).stat().st_mtime):
        config = _read_config(folder / "config.yaml")
        run = _checkpoint_run(config.get("ckpt_path"), training)
        if run is None:
            run = Run(folder, config)
            standalone.append(run)
        run.metrics, run.evaluation = task.read(folder / task.report), folder  # the newest evaluation wins
    return [*training.values(), *standalone]


def group_runs(runs: Sequence[Run]) -> tuple[list[Model], list[Run]]:
    """Complete runs grouped into models (same config but the seed), and the incomplete runs."""
    models: dict[str, Model] = {}
    incomplete = []
    for run in runs:
        if run.metrics is None:
            incomplete.append(run)
            continue
        key = json.dumps(_without(run.config, VOLATILE), sort_keys=True)
        if key not in models:
            attention = find_attention(run.config.get("model", {}))
            models[key] = Model(model_label(attention), attention)
        models[key].runs.append(run)
    labels = [m.label for m in models.values()]
    for model in models.values():  # same attention, other settings: tell the rows apart by an experiment folder
        if labels.count(model.label) > 1:
            model.label += f" ({model.runs[0].folder.parent.name})"
    return list(models.values()), incomplete


def shown_columns(models: Sequence[Model], task: Task) -> list[str]:
    """The task's metrics present in any run, in the task's order."""
    present = {name for model in models for run in model.runs for name in run.metrics}
    columns = []
    for pattern in task.columns:
        columns += sorted((n for n in present if re.fullmatch(pattern, n) and n not in columns), key=_natural_key)
    return columns


def _mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    if not values:
        return math.nan, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def comparison_rows(models: Sequence[Model], incomplete: Sequence[Run], columns: Sequence[str]) -> list[dict]:
    """The CSV rows: one per model, then one per incomplete run.

    A model's ``<metric>`` is the mean over its seeds and ``<metric>_std`` the sample standard deviation (empty
    with one seed); an incomplete run has status ``incomplete: ...`` and no metrics.
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
        rows.append(row)
    for run in incomplete:
        attention = find_attention(run.config.get("model", {}))
        rows.append(
            {"model": model_label(attention), "kind": attention.get("kind"), "seeds": str(run.seed), "runs": 0,
             "status": f"incomplete: no evaluation report in or for {run.folder}"}
        )  # fmt: skip
    return rows


def _cell(mean: float, std: float | None) -> str:
    if math.isnan(mean):
        return ""
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def comparison_markdown(models: Sequence[Model], incomplete: Sequence[Run], columns: Sequence[str]) -> str:
    """The paper's layout: one row per model, the task's columns as ``mean ± std`` over seeds."""
    table = []
    for model in models:
        row: dict[str, object] = {"model": model.label, "seeds": " ".join(str(r.seed) for r in model.runs)}
        for column in columns:
            row[column] = _cell(*_mean_std([r.metrics[column] for r in model.runs if column in r.metrics]))
        table.append(row)
    text = markdown_table(table) if table else "No complete runs.\n"
    if incomplete:
        text += "\nIncomplete runs (no evaluation report; run `test` on their checkpoint):\n\n"
        text += "".join(f"- `{run.folder}` (seed {run.seed})\n" for run in incomplete)
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
) -> Path:
    """Collect the runs under ``root`` and write ``<name>.md``, ``.csv`` and ``.png`` into ``out_dir`` (default root).

    Args:
        root: folder searched for run folders.
        task: a key of :data:`TASKS`.
        out_dir: output folder, default ``root``.
        name: file stem of the outputs.
        only: keep just these run folders (training runs, or standalone evaluations), e.g. a demo's own runs.

    Returns:
        The Markdown file.

    Raises:
        ValueError: for an unknown ``task`` or a folder without any run.
    """
    if task not in TASKS:
        raise ValueError(f"--task must be one of {sorted(TASKS)}, got {task!r}")
    runs = collect_runs(root, TASKS[task])
    if only is not None:
        keep = {Path(folder).resolve() for folder in only}
        runs = [run for run in runs if run.folder.resolve() in keep]
    if not runs:
        raise ValueError(f"no run under {root}: expected folders with a LightningCLI config.yaml (e.g. runs/)")
    models, incomplete = group_runs(runs)
    columns = shown_columns(models, TASKS[task])
    out = Path(out_dir) if out_dir is not None else Path(root)
    markdown = comparison_markdown(models, incomplete, columns)
    md_path, _ = write_report(comparison_rows(models, incomplete, columns), out, name, markdown=markdown)
    if models:
        from matplotlib import pyplot as plt

        fig = comparison_figure(models, columns)
        write_atomic(out / f"{name}.png", lambda f: fig.savefig(f, format="png", dpi=110))
        plt.close(fig)
    for run in incomplete:
        logger.warning("kpca-report: incomplete run %s (no %s for it)", run.folder, TASKS[task].report)
    logger.info("kpca-report: %d models from %d runs -> %s", len(models), len(runs), md_path)
    return md_path


def main(argv: Sequence[str] | None = None) -> None:
    """The ``kpca-report`` console script: writes the comparison and prints its Markdown."""
    parser = argparse.ArgumentParser(prog="kpca-report", description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder holding the run folders (e.g. runs/)")
    parser.add_argument("--task", required=True, choices=sorted(TASKS), help="which app's reports to compare")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: root)")
    parser.add_argument("--name", default="comparison", help="file stem of the outputs")
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    path = compare(args.root, args.task, args.out, args.name)
    sys.stdout.write(path.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
