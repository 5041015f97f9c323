"""Each console command's ``--help`` says what the command does and lists what it accepts, in plain text.

Checked against the code rather than against a copy of its prose, so that rewording a help text passes and a
broken help fails: the app's own description (not Lightning's generic line), every subcommand and every argument
of the subcommands the project adds, no raw reStructuredText from docstrings, and examples that the command's
own parser accepts (tests/command_support.py).
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest
from lightning.pytorch.cli import LightningCLI

from kpca.training.cli import ProjectCLI
from kpca.training.help_text import plain_text
from tests.command_support import app_cli, commands_in_text, problem

APPS = {"vision_cls": "vision-cls", "language_model": "language-model", "segmentation": "segmentation"}
RAW_RST = re.compile(r"``|:(?:class|meth|func|data|mod|attr|obj|exc):`")
"""Docstring markup that a terminal shows as is."""


def help_of(main, argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """What ``main(argv)`` prints (``--help`` in ``argv``); it must exit with status 0."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    printed = capsys.readouterr()
    assert exit_info.value.code == 0, printed.err
    return printed.out


def flat(text: str) -> str:
    return " ".join(text.split())


def section(text: str, heading: str) -> str:
    """The lines of ``text`` after the line ``heading`` up to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == heading) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end])


def examples(text: str, program: str) -> str:
    """The example commands of a help's ``examples:`` section, as a Markdown shell block (descriptions dropped)."""
    joined = text.split("\nexamples:\n", 1)[1].replace("\\\n", " ")  # continuation lines joined
    lines = [line.strip() for line in joined.splitlines()]
    commands = [re.split(r"\s{2,}", line)[0] for line in lines if line.startswith(program)]
    return "```bash\n" + "\n".join(commands) + "\n```\n"


# The apps (LightningCLI)


@pytest.fixture(params=list(APPS), ids=list(APPS.values()))
def app(request, monkeypatch) -> str:
    monkeypatch.setattr("sys.argv", [APPS[request.param]])  # LightningCLI warns when argv and args are both given
    return request.param


def app_help(app: str, argv: list[str], capsys) -> str:
    return help_of(importlib.import_module(f"kpca.{app}.cli").main, argv, capsys)


def test_app_help_shows_the_apps_description(app, capsys, monkeypatch):
    """The console script's ``--help`` shows its CLI class's description, not Lightning's or ProjectCLI's default."""
    console_main = importlib.import_module(f"kpca.{app}.cli").console_main  # what the console script runs
    monkeypatch.setattr("sys.argv", [APPS[app], "--help"])
    out = help_of(lambda _: console_main(), [], capsys)
    description = type(app_cli(app)).description
    assert out.startswith(f"usage: {APPS[app]} ")
    assert description != ProjectCLI.description and flat(description) in flat(out)
    assert "Lightning Trainer command line tool" not in out
    assert "options:" in out and "subcommands:" in out


def test_app_help_lists_every_subcommand_with_a_line(app, capsys):
    """Every subcommand of the CLI class (Lightning's and the project's) is listed with a line saying what it does."""
    out = app_help(app, ["--help"], capsys)
    listed = section(out, "Available subcommands:")
    for name in type(app_cli(app)).subcommands():
        assert re.search(rf"^\s+{re.escape(name)}\s+\S", listed, re.M), f"{name} is not listed with its help:\n{listed}"


def listed_subcommands(text: str) -> dict[str, str]:
    """Each subcommand of a help's ``Available subcommands:`` list with its description, wrapped lines joined."""
    listed: dict[str, str] = {}
    name = None
    for line in section(text, "Available subcommands:").splitlines():
        entry = re.match(r" {4}(\S+)\s+(.+)", line)
        if entry:
            name, listed[entry[1]] = entry[1], entry[2]
        elif name is not None:
            listed[name] += f" {line.strip()}"
    return listed


def test_app_help_describes_each_subcommand_in_whole_sentences(app, capsys):
    """Each subcommand's line is the whole first paragraph of its Trainer method's docstring, not its first line.

    LightningCLI takes the first line, which ends mid-sentence where the paragraph wraps (Lightning's test, predict).
    """
    trainer = type(app_cli(app)).trainer_type
    listed = listed_subcommands(app_help(app, ["--help"], capsys))
    assert sorted(listed) == sorted(type(app_cli(app)).subcommands())
    for name, description in listed.items():
        first_paragraph = inspect.getdoc(getattr(trainer, name)).split("\n\n")[0]
        assert description.endswith("."), (name, description)
        assert description == flat(plain_text(first_paragraph)), name


def test_app_help_has_no_raw_markup(app, capsys):
    """The description and the subcommands' lines (from the Trainer's docstrings) read as plain text."""
    out = app_help(app, ["--help"], capsys)
    assert not RAW_RST.findall(out), [line for line in out.splitlines() if RAW_RST.search(line)]


def test_every_subcommand_help_is_plain_text(app, capsys):
    """Each subcommand's option help comes from docstrings (Lightning's and ours) and reads as plain text too."""
    for name in type(app_cli(app)).subcommands():
        out = app_help(app, [name, "--help"], capsys)
        assert "--trainer.max_epochs" in out or name == "check-data", name  # the whole help, not an error
        assert not RAW_RST.findall(out), (name, [line for line in out.splitlines() if RAW_RST.search(line)][:5])


def test_plain_text_keeps_the_words_of_roles_and_literals():
    assert plain_text("(:class:`~kpca.vision_cls.eval_data.EvalData`, the ``data.eval`` group)") == (
        "(EvalData, the 'data.eval' group)"
    )
    assert plain_text('Default: ``"auto"``; see :func:`run_data_check` and :mod:`kpca.training`.') == (
        'Default: "auto"; see run_data_check and kpca.training.'
    )


def project_subcommands(app: str) -> dict[str, set[str]]:
    """The subcommands the project adds to Lightning's (analyze, check-data, ...), each with the arguments it skips."""
    ours = type(app_cli(app)).subcommands()
    return {name: skip for name, skip in ours.items() if name not in LightningCLI.subcommands()}


def test_the_project_adds_subcommands(app):
    """The apps add analyze and check-data (else the next test would check no subcommand)."""
    assert {"analyze", "check-data"} <= set(project_subcommands(app))


def test_each_added_subcommand_lists_its_arguments(app, capsys):
    """``<app> <subcommand> --help`` lists every argument of the Trainer method it runs, but the skipped ones."""
    trainer = type(app_cli(app)).trainer_type
    for name, skipped in project_subcommands(app).items():
        method = getattr(trainer, name.replace("-", "_"))
        arguments = [p for p in inspect.signature(method).parameters if p != "self" and p not in skipped]
        out = app_help(app, [name, "--help"], capsys)
        assert out.startswith(f"usage: {APPS[app]} [options] {name} "), name
        assert arguments and all(re.search(rf"^\s+--{a}\b", out, re.M) for a in arguments), (name, arguments)


# kpca-experiment and kpca-report (argparse)


def subparsers(parser) -> dict:
    (action,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return dict(action.choices)


def test_kpca_experiment_help_lists_each_subcommand_with_its_description(capsys):
    """The main help says what the tool does and lists each subcommand's line; each subcommand's help shows it too."""
    from kpca.training.experiment import cli

    out = help_of(cli.main, ["--help"], capsys)
    assert out.startswith("usage: kpca-experiment ") and flat(cli.DESCRIPTION) in flat(out)
    for name, sub in subparsers(cli._parser()).items():
        assert sub.description and flat(sub.description) in flat(out), name
        sub_out = help_of(cli.main, [name, "--help"], capsys)
        assert sub_out.startswith(f"usage: kpca-experiment {name} "), name
        assert flat(sub.description) in flat(sub_out), name
        assert "--override --KEY=VALUE" in sub_out, name  # every subcommand takes the plan's overrides
    assert not RAW_RST.findall(out)


def test_kpca_experiment_exec_and_run_list_their_options(capsys):
    """The options that select what runs: run's executors, exec's run, step and launcher, validate's several plans."""
    from kpca.training.experiment import cli

    assert re.search(r"--executor \{local,slurm\}", help_of(cli.main, ["run", "--help"], capsys))
    exec_help = help_of(cli.main, ["exec", "--help"], capsys)
    assert all(option in exec_help for option in ("--run ID", "--step NAME", "--launcher CMD"))
    assert "plan [plan ...]" in help_of(cli.main, ["validate", "--help"], capsys)


def test_kpca_experiment_help_examples_are_accepted(capsys):
    """Every example ``kpca-experiment --help`` prints is parsed and its plans loaded.

    Their steps are not parsed here: tests/training/test_experiment_plan.py validates every shipped plan (slow).
    """
    from kpca.training.experiment import cli

    commands = commands_in_text(examples(help_of(cli.main, ["--help"], capsys), "kpca-experiment"), "--help")
    assert {c.args[0] for c in commands} == set(subparsers(cli._parser())) - {"exec"}  # exec: what executors run
    refused = [(c.text, problem(c, parse_steps=False)) for c in commands]
    assert [(text, message) for text, message in refused if message is not None] == []


def test_kpca_report_help_lists_the_installed_tasks_and_working_examples(capsys):
    """The task list is the installed entry points' (every app's), and the three examples parse."""
    from kpca.training.results import compare

    out = help_of(compare.main, ["--help"], capsys)
    assert out.startswith("usage: kpca-report ") and not RAW_RST.findall(out)
    assert f"installed tasks: {', '.join(compare.installed_tasks())}" in out
    assert {"vision_cls", "language_model", "segmentation"} <= set(compare.installed_tasks())
    commands = commands_in_text(examples(out, "kpca-report"), "--help")
    assert len(commands) == 3 and [(c.text, problem(c)) for c in commands if problem(c) is not None] == []
