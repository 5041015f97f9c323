"""``kpca-report``: every run's report under a folder, side by side in one comparison.

The command reads what the installed apps register under the ``kpca.reports`` entry points (each app's
:class:`~kpca.training.results.schema.ReportSchema`), so a new evaluation needs no change here. It collects the runs
and groups them into models (:mod:`kpca.training.results.collect`: seeds of one model share a row, evaluations under
other settings or protocols never do, a training run without an evaluation is listed with the reason), then writes the
comparison (:mod:`kpca.training.results.render`: mean ± std over seeds, the protocol of each column group, published
references in a block of their own).

    kpca-report runs/ --task vision_cls          # runs/comparison.md, .csv and .png
    kpca-report runs/ --task vision_cls --reference paper.csv
    kpca-report --task                           # the installed tasks
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from kpca.training.errors import MissingPathError, OptionError, run_command
from kpca.training.files import write_atomic
from kpca.training.results.collect import Model, collect_runs, group_runs, installed_tasks, report_schema
from kpca.training.results.references import read_references
from kpca.training.results.render import (
    comparison_figure,
    comparison_markdown,
    comparison_rows,
    figure_description,
    shown_columns,
)
from kpca.training.results.schema import REPORT_ENTRY_POINTS
from kpca.training.results.tables import write_report

logger = logging.getLogger(__name__)


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


def labelled_in_order(models: Sequence[Model], labels: Mapping[str | Path, str]) -> list[Model]:
    """``models`` under the label of their first run folder in ``labels``, in that mapping's order (others last)."""
    position = {Path(folder).resolve(): index for index, folder in enumerate(labels)}
    label_of = {Path(folder).resolve(): label for folder, label in labels.items()}

    def first(model: Model) -> int:
        return min((position.get(run.folder.resolve(), len(position)) for run in model.runs), default=len(position))

    for model in models:
        named = [label_of[run.folder.resolve()] for run in model.runs if run.folder.resolve() in label_of]
        if named:
            model.label = named[0]
    return sorted(models, key=first)


def compare(
    root: str | Path,
    task: str,
    out_dir: str | Path | None = None,
    name: str = "comparison",
    only: Iterable[str | Path] | None = None,
    *,
    references: Sequence[str | Path] = (),
    require_complete: bool = False,
    labels: Mapping[str | Path, str] | None = None,
) -> Path:
    """Collect the runs under ``root`` and write ``<name>.md``, ``.csv`` and ``.png`` into ``out_dir`` (default root).

    Args:
        root: folder searched for run folders.
        task: an installed report task (:func:`installed_tasks`), e.g. ``vision_cls``.
        out_dir: output folder, default ``root``.
        name: file stem of the outputs.
        only: keep just these run folders (training runs, or standalone evaluations), e.g. a demo's own runs.
        references: CSV files of published numbers (:mod:`kpca.training.results.references`), shown in a block of their
            own and as ``reference (<source>)`` rows of the CSV, never averaged with the runs.
        require_complete: refuse a folder where no run has this task's report (``kpca-report``), naming why;
            otherwise the report says "No complete runs." (a plan's report before its evaluations).
        labels: run folder -> the label of its model (an experiment plan's words); the models are then listed in the
            order of their first folder in this mapping, in the table and in the figure, and the others after them
            under their own labels.

    Returns:
        The Markdown file.

    Raises:
        ValueError: for an unknown ``task``, a folder without any run, or a reference file that does not fit the
            task's report; with ``require_complete``, a folder without a complete run of the task.
        FileNotFoundError: for a ``root`` that does not exist.
    """
    schema = report_schema(task)
    if not Path(root).is_dir():
        raise MissingPathError(f"{root} is not a folder: give the folder the runs were written to (e.g. runs/)")
    reference_rows = read_references(references, schema)
    runs = collect_runs(root, schema)
    if only is not None:
        keep = {Path(folder).resolve() for folder in only}
        runs = [run for run in runs if run.folder.resolve() in keep]
    if not runs:
        raise OptionError(f"no run under {root}: expected folders with a LightningCLI config.yaml (e.g. runs/)")
    models, incomplete = group_runs(runs)
    if labels is not None:
        models = labelled_in_order(models, labels)
    if require_complete and not models:
        raise OptionError(_nothing_complete(root, task, incomplete))
    columns = shown_columns(models, schema)
    out = Path(out_dir) if out_dir is not None else Path(root)
    markdown = comparison_markdown(models, incomplete, columns, reference_rows, schema.columns)
    rows = comparison_rows(models, incomplete, columns, reference_rows)
    md_path, csv_path = write_report(rows, out, name, markdown=markdown)
    written = f"{md_path} and {csv_path.name}"
    if models:
        from matplotlib import pyplot as plt

        fig = comparison_figure(models, columns)
        figure = out / f"{name}.png"
        write_atomic(figure, lambda f: fig.savefig(f, format="png", dpi=110))
        plt.close(fig)
        written += f"; figure {figure}: {figure_description(columns)}"
    for run in incomplete:
        logger.warning("kpca-report: incomplete run %s: %s", run.folder, run.reason)
    logger.info("kpca-report: %d models from %d runs -> %s", len(models), len(runs), written)
    return md_path


def _nothing_complete(root: str | Path, task: str, incomplete: Sequence) -> str:
    """Why no run under ``root`` has a ``task`` report: other apps' runs (named from their configs), or unfinished."""
    found = {match for run in incomplete for match in _APP_IN_CONFIG.findall(json.dumps(run.config, default=str))}
    others = sorted((found & set(installed_tasks())) - {task})
    if others and task not in found:
        return f"no {task} run under {root}: the runs there are {' and '.join(others)} runs; pass --task {others[0]}"
    return (
        f"no complete {task} run under {root}: no run there has an evaluation report yet (of {len(incomplete)}, "
        f"first {incomplete[0].folder}: {incomplete[0].reason})"
    )


_APP_IN_CONFIG = re.compile(r"\bkpca\.(\w+)\.")
"""An app's module named in a saved config (``kpca.vision_cls.model.ViTClassifier``): the app that made the run."""


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
    """The ``kpca-report`` console script: writes the comparison and prints its Markdown (or lists the tasks).

    A user error (an unknown task, a folder without runs, a reference file that does not fit) ends it with one
    ``error:`` line and its exit status.
    """
    run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> None:
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
    path = compare(args.root, args.task, args.out, args.name, references=args.reference, require_complete=True)
    sys.stdout.write(path.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
