"""``kpca-experiment``: run a plan's comparison (models x seeds x steps) locally or on SLURM, see where it stands.

kpca-experiment run configs/experiments/deit-tiny_published.yaml --override=--data.root=/data/imagenet
kpca-experiment status configs/experiments/deit-tiny_published.yaml
kpca-experiment validate configs/experiments/*.yaml
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

from jsonargparse import Namespace

from kpca.training.errors import OptionError, run_command
from kpca.training.experiment.plan import Plan, PlannedRun, StepSpec, load_plan, step_argv, step_folder
from kpca.training.experiment.steps import StepError, execute_step, fit_checkpoint, marker

DESCRIPTION = """\
Run an experiment plan: every model (run) of a YAML plan, for every seed, through its steps (fit, then test,
analyze, ...), each an app command that logs into <out>/<run>/seed<k>/<step>, then the plan's report (mean and
std over seeds). Rerunning a plan skips the steps that are done and resumes an interrupted fit from its newest
checkpoint. See docs/experiments.md."""

EXAMPLES = """\
examples:
  kpca-experiment run configs/experiments/deit-tiny_published.yaml --override=--data.root=/data/imagenet
  kpca-experiment run configs/experiments/deit-tiny_published.yaml --executor slurm \\
      --override=--data.root=/data/imagenet
  kpca-experiment status configs/experiments/deit-tiny_published.yaml
  kpca-experiment report configs/experiments/deit-tiny_published.yaml
  kpca-experiment validate configs/experiments/*.yaml"""

OVERRIDE_HELP = (
    "an argument appended to every step of every run, written with '=' (e.g. --override=--data.root=/data/imagenet); "
    "repeat for more; give the same ones to every command on the plan"
)


QUIET_WHILE_PARSING = ("kpca", "lightning.pytorch", "lightning.fabric")
"""Loggers whose INFO lines (auto resume, the seed) validation hides."""


class ValidationError(OptionError):
    """A step's arguments that the app's parser refuses: names the plan, run, step and the parser's message."""


class _ParsedSignal(Exception):  # noqa: N818 (a signal, not an error)
    """Raised in place of building the classes: the app's parser accepted the arguments."""


def validate_plan(plan: Plan, *, skip_done: bool = False) -> int:
    """Parse every step's arguments in the app's LightningCLI, in this process, without building or running anything.

    The parse is the app's own, checks included (unknown keys, types, required values, ``--ckpt_path auto``); it
    stops where the classes would be built. Each run's steps are parsed once (its seeds differ only in
    ``--seed_everything`` and folders); a later step's checkpoint is the one ``fit.done`` names, or, before the fit
    is done, the path of the fit's checkpoint (not read).

    Args:
        plan: the plan.
        skip_done: leave out what ``run`` would not run again: a step is parsed for the first seed that has not
            done it, and not at all when every seed has (a finished plan is checked without importing its app).

    Returns:
        The number of argument lists parsed.

    Raises:
        ValidationError: naming the plan, run, step and the parser's message for the first refused list.
    """
    to_parse = _steps_to_parse(plan, skip_done)
    if not to_parse:
        return 0
    from kpca.training.cli import console_logging  # here: the other subcommands need neither Lightning nor torch

    app_main = importlib.import_module(f"kpca.{plan.app}.cli").main
    console_logging()  # the app's log handler goes to the real stderr, not to the one captured below
    for run, step in to_parse:
        argv = step_argv(plan, run, step.name, _checkpoint_to_parse(plan, run, step.ckpt))
        message = _parse_error(app_main, plan.app, argv)
        if message is not None:
            raise ValidationError(
                f"{plan.path}: run {run.name!r}, step {step.name!r}: the {plan.app} app refuses its arguments:\n"
                f"{message}\narguments: {shlex.join(argv)}"
            )
    return len(to_parse)


def _steps_to_parse(plan: Plan, skip_done: bool) -> list[tuple[PlannedRun, StepSpec]]:
    """Each run's steps with the seed to parse them for, in plan order (see :func:`validate_plan`)."""
    seeds: dict[str, list[PlannedRun]] = {}
    for run in plan.runs:
        seeds.setdefault(run.name, []).append(run)
    to_parse = []
    for runs in seeds.values():
        for step in plan.steps:
            pending = [run for run in runs if not (skip_done and marker(run, step.name, "done").is_file())]
            if pending:
                to_parse.append((pending[0], step))
    return to_parse


def _checkpoint_to_parse(plan: Plan, run: PlannedRun, which: str | None) -> Path | None:
    """The checkpoint a step of ``run`` will read: the one its ``fit.done`` names, else where the fit writes it."""
    if which is None:
        return None
    try:
        return fit_checkpoint(plan, run, which)
    except StepError:
        return step_folder(plan, run, "fit") / "checkpoints" / f"{which}.ckpt"


def _parse_error(app_main: Callable, app: str, argv: list[str]) -> str | None:
    """None when the app's parser accepts ``argv``, else its error message (the classes are never built)."""
    from kpca.training.cli import ProjectCLI
    from kpca.training.experiment.status import quiet_loggers

    errors = io.StringIO()
    with (
        mock.patch.object(sys, "argv", [app.replace("_", "-")]),
        mock.patch.dict(os.environ),
        mock.patch.object(ProjectCLI, "before_instantiate_classes", _stop_after_parsing),
        quiet_loggers(QUIET_WHILE_PARSING),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(errors),
    ):
        try:
            app_main(argv)
        except _ParsedSignal:
            return None
        except SystemExit as exit_:
            return _parser_message(errors.getvalue()) or f"exit status {exit_.code}"
        except Exception as error:  # a refusal raised by the app's own argument checks
            return f"{type(error).__name__}: {error}"
    return "the app ran past its argument parsing"


def _parser_message(text: str) -> str:
    """What follows the last ``error:`` of a parser's output, without the usage lines (the whole text if none)."""
    start = text.rfind("error:")
    return (text[start + len("error:") :] if start >= 0 else text).strip()


def _stop_after_parsing(cli: object) -> None:
    """Check what can be checked without data, then stop before anything is built for real."""
    check_network_without_data(cli.config[cli.subcommand])
    raise _ParsedSignal


def check_network_without_data(config: Namespace) -> None:
    """Build a parsed config's ``model.net`` on the meta device: its attention specs and the network's own checks.

    So a plan is refused before any step for what its run's model would refuse at build time: a setting its
    attention kind does not read, a bad ``lambd``, a block index past the network's depth, a width the heads do not
    divide. Nothing is allocated (meta tensors) and nothing is read: a file the network would load (``init_from``,
    pretrained weights) is left to the step itself, as is a link filled from the data (its class default stands in).

    Raises:
        ValueError: the network's own refusal (an ``OptionError`` where it is an option's), as the step would raise it.
    """
    import torch
    from jsonargparse import ArgumentParser
    from torch import nn

    model = config.get("model")
    net = model.get("net") if isinstance(model, Namespace) else None
    if not isinstance(net, Namespace) or "class_path" not in net:
        return
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--net", type=nn.Module)
    parsed = parser.parse_object({"net": net.as_dict()})
    try:
        with torch.device("meta"):
            parser.instantiate_classes(parsed)
    except (OSError, NotImplementedError):  # a file to read, or a step meta tensors cannot take: left to the step
        return


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kpca-experiment",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_, description=help_)
        sub.add_argument("--override", action="append", default=[], metavar="--KEY=VALUE", help=OVERRIDE_HELP)
        return sub

    run = command(
        "run",
        "Run every step of every run and seed of the plan that is not done yet (done steps are skipped, an "
        "interrupted fit resumes), then write the plan's report. The steps to run are checked first, as validate "
        "checks them: one that the app refuses stops the plan before anything runs.",
    )
    run.add_argument("plan", type=Path, help="the plan file (YAML)")
    run.add_argument(
        "--executor", choices=("local", "slurm"), default="local",
        help="local: one step after another on this machine; slurm: submit sbatch job arrays (fit, later steps "
        "after their fit, the report after all)",
    )  # fmt: skip
    status = command(
        "status",
        "Show each run x step of the plan: done, running, failed (with its log), interrupted or not started; for "
        "fits the epoch and step of the newest checkpoint and the estimated time left.",
    )
    status.add_argument("plan", type=Path, help="the plan file (YAML)")
    report = command("report", "Write the plan's report (<out>/report.md): the comparison, mean ± std over seeds.")
    report.add_argument("plan", type=Path, help="the plan file (YAML)")
    validate = command(
        "validate",
        "Check plan files without running anything: the plan's keys and files, and that the app's parser accepts "
        "every step's arguments (parsed as the app parses them, no model or data built).",
    )
    validate.add_argument("plans", type=Path, nargs="+", metavar="plan", help="plan files (YAML)")
    execute = command("exec", "Run one step of one run and seed (what the executors run; skipped when done).")
    execute.add_argument("plan", type=Path, help="the plan file (YAML)")
    execute.add_argument("--run", required=True, metavar="ID", help="the run and seed, <run>/seed<k>")
    execute.add_argument("--step", required=True, metavar="NAME", help="the step name (fit, test, ...)")
    execute.add_argument("--launcher", default="", metavar="CMD", help="a command that launches the app (e.g. srun)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """The ``kpca-experiment`` console script; a user error ends it with one ``error:`` line and its exit status."""
    run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> None:
    args = _parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    sys.exit(_command(args))


def _command(args: argparse.Namespace) -> int:
    """Run the parsed subcommand; its exit status."""
    if args.command == "validate":
        for path in args.plans:
            plan = load_plan(path, args.override)
            print(f"{plan.path}: ok ({validate_plan(plan)} argument lists parsed)")
        return 0
    plan = load_plan(args.plan, args.override)
    if args.command == "run":
        return _run(plan, args.executor)
    if args.command == "status":
        from kpca.training.experiment.status import status_markdown

        print(status_markdown(plan), end="")
        return 0
    if args.command == "report":
        from kpca.training.experiment.report import write_plan_report

        print(write_plan_report(plan).read_text(encoding="utf-8"), end="")
        return 0
    return execute_step(plan, plan.run(args.run), args.step, shlex.split(args.launcher))


def _run(plan: Plan, executor: str) -> int:
    """``kpca-experiment run``: check every step still to run as ``validate`` does, then run or submit them.

    A refused step refuses the whole plan before any step runs or any job is submitted; a finished plan parses
    nothing.
    """
    validate_plan(plan, skip_done=True)
    if executor == "local":
        from kpca.training.experiment.local import run_local

        return run_local(plan)
    from kpca.training.experiment.report import missing_report_note
    from kpca.training.experiment.slurm import submit_slurm

    for job in submit_slurm(plan):
        print(job)
    if plan.report is None:
        print(missing_report_note(plan))
    return 0
