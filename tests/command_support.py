"""The commands a Markdown page shows, and each program's own parser to check them with, without running anything.

Used by tests/test_doc_commands.py (every command of README.md, docs/ and the package and app READMEs) and
tests/test_console_help.py (the examples a ``--help`` prints).

Where commands are found: every line of a fenced block in a shell language (or none), with ``\\`` continuations
joined and ``# comments`` dropped, split at ``;``, ``&&``, ``||`` and ``|``; and inline code that starts with a
program. A program is a kpca console script (``vision-cls``, ``kpca-experiment``, ... from the installed metadata),
``python -m kpca.<module>`` of one (also after ``python -m kpca.training.slurm_start``), or
``docker/launch_{torchrun,slurm}.sh <app>`` (the rest is the app's arguments; ``python -m kpca.<app>``, the app left
open, names no program to check). Inline code of a program and
one word (``vision-cls export``, ``kpca-report --reference``) mentions a subcommand or option: only that word is
checked.

How a command is parsed: an app's by the app's LightningCLI, built once per app and parsed up to where the classes
would be built, with the app's own checks (unknown keys, types, ``-c`` files, ``--ckpt_path``), as
``kpca-experiment validate`` parses a plan's steps; ``kpca-experiment`` and ``kpca-report`` by their argparse
parsers, a plan a command names is loaded, and for ``run`` and ``validate`` its steps are parsed as ``validate``
parses them (its own code, with the app parser built here).

What stands for something else: ``<placeholders>`` are strings (blanks and quotes inside become ``_``), and a
``-c <...>`` file is the matching config of the app (its ``smoke.yaml`` when one matches); ``...`` in an app
command is the elided configs (the app's CPU smoke pair); in a synopsis, ``[...]`` brackets are dropped, each
``a|b`` alternative is parsed, and ``...`` (repeat) is dropped; all-capital words (``PLAN``, ``NAME``) are
placeholders; plan file globs are expanded.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import importlib
import io
import itertools
import os
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^(```|~~~)([^\n]*)\n(.*?)^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
PLACEHOLDER = re.compile(r"<[^<>\n]+>")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
CAPITALS = re.compile(r"[A-Z][A-Z_]*")
SEPARATORS = {";", "&&", "||", "|", "&"}
LAUNCHERS = ("docker/launch_torchrun.sh", "docker/launch_slurm.sh")
"""Scripts whose first argument names an app (``vision_cls``) and whose other arguments are the app's."""

EXPERIMENT_MODULE = "kpca.training.experiment.cli"
SLURM_START = "kpca.training.slurm_start"  # ``python -m kpca.training.slurm_start <module> [args]`` runs the module
REPORT_MODULE = "kpca.training.results.compare"


def doc_pages() -> list[Path]:
    """README.md, docs/*.md, packages/*/README.md, apps/*/README.md (not CHANGELOG.md: history keeps old commands)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return pages + sorted(REPO.glob("packages/*/README.md")) + sorted(REPO.glob("apps/*/README.md"))


@dataclass(frozen=True)
class Command:
    """One command a page shows: where, as written, and the program's arguments as the parser gets them."""

    where: str
    """``page:line``."""
    text: str
    """The command as written (continuations joined, comment dropped)."""
    program: str
    """The console script (``vision-cls``); empty when ``error`` says why the command cannot be checked."""
    args: tuple[str, ...] = ()
    """What follows the program (after a ``python -m`` module or a launcher's app)."""
    mention: bool = False
    """Inline code of the program and one word: a subcommand or option named in prose, not a command to run."""
    error: str | None = None
    """Why the command cannot be read (a shell syntax error, a ``python -m`` module no console script runs)."""


# Finding commands


@functools.cache
def console_scripts() -> dict[str, str]:
    """The kpca console scripts, name -> module (``vision-cls`` -> ``kpca.vision_cls.cli``), as installed."""
    return {ep.name: ep.module for ep in entry_points(group="console_scripts") if ep.module.startswith("kpca.")}


def script_of_module(module: str) -> str | None:
    """The console script that ``python -m <module>`` is (its module, or that module's ``cli``), else None."""
    for name, script_module in console_scripts().items():
        if script_module in (module, f"{module}.cli"):
            return name
    return None


def sanitize_placeholders(line: str) -> str:
    """``line`` with each ``<placeholder>`` made one shell word: blanks and quotes inside become ``_``."""
    return PLACEHOLDER.sub(lambda m: re.sub(r"[\s'\"]", "_", m.group(0)), line)


def strip_comment(line: str) -> str:
    """``line`` without its shell comment: from a ``#`` at the start or after a blank, outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def logical_lines(block: str, first_line: int) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a shell block: placeholders made words, comments dropped, continuations joined."""
    start, parts = None, []
    for offset, raw in enumerate(block.splitlines()):
        code = strip_comment(sanitize_placeholders(raw)).rstrip()
        start = first_line + offset if start is None else start
        if code.endswith("\\"):
            parts.append(code[:-1].strip())
            continue
        parts.append(code.strip())
        yield start, " ".join(part for part in parts if part)
        start, parts = None, []
    if parts:
        yield start, " ".join(part for part in parts if part)


def simple_commands(line: str) -> list[list[str]]:
    """The words of each simple command of ``line`` (split at ``;``, ``&&``, ``||``, ``|``); ValueError: bad quotes."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&")
    lexer.whitespace_split = True
    lexer.commenters = ""
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    return [words for words in commands if words]


def program_in(words: Sequence[str], anywhere: bool) -> tuple[str, list[str]] | str | None:
    """``(console script, its arguments)`` of the first program in ``words``; a str says why it cannot be checked.

    ``anywhere``: the program may follow other words (``NNODES=2 docker/launch_torchrun.sh``, ``sbatch ...``);
    else it must come first (inline code), after ``python -m`` for a module.
    """
    scripts = console_scripts()
    first = 2 if list(words[:2]) in (["python", "-m"], ["python3", "-m"]) else 0  # where inline code's program is
    for i, word in enumerate(words):
        if not anywhere and i > first:
            return None
        rest = list(words[i + 1 :])
        if word in scripts:
            return word, rest
        if word.startswith("kpca.") and i > 0 and words[i - 1] == "-m":
            if word == SLURM_START and rest:  # it runs the module that follows: that module's command
                word, rest = rest[0], rest[1:]
            if "<" in word:  # python -m kpca.<app>: any app, none to check
                return None
            return (script_of_module(word), rest) if script_of_module(word) else f"no kpca console script runs {word}"
        if word in LAUNCHERS and rest and "<" not in rest[0]:
            module = f"kpca.{rest[0]}"
            return (script_of_module(module), rest[1:]) if script_of_module(module) else f"{word}: no app {rest[0]}"
    return None


def blank_fences(text: str) -> str:
    """``text`` with each fenced block replaced by as many newlines (line numbers kept)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def commands_in_text(text: str, page: str) -> list[Command]:
    """The commands of a Markdown text (``page`` names it in ``Command.where``), in order of appearance."""
    found: list[tuple[int, Command]] = []

    def add(line: int, code: str, anywhere: bool) -> None:
        where = f"{page}:{line}"
        try:
            commands = simple_commands(code)
        except ValueError as error:  # a quote left open
            if program_in(code.split(), anywhere):
                found.append((line, Command(where, code, "", error=f"not a shell command: {error}")))
            return
        for words in commands:
            program = program_in(words, anywhere)
            if isinstance(program, str):
                found.append((line, Command(where, code, "", error=program)))
            elif program is not None:
                name, args = program
                mention = not anywhere and len(args) == 1
                if args or anywhere:
                    found.append((line, Command(where, code, name, tuple(args), mention)))

    for match in FENCE.finditer(text):
        if match.group(2).strip().lower() in SHELL_LANGUAGES:
            first = text.count("\n", 0, match.start(3)) + 1
            for line, code in logical_lines(match.group(3), first):
                add(line, code, anywhere=True)
    blanked = blank_fences(text)
    for match in INLINE_CODE.finditer(blanked):
        code = strip_comment(sanitize_placeholders(" ".join(match.group(2).split())))
        add(blanked.count("\n", 0, match.start()) + 1, code, anywhere=False)
    return [command for _, command in sorted(found, key=lambda item: item[0])]


def commands_in(page: Path) -> list[Command]:
    """The commands of the Markdown file ``page``."""
    return commands_in_text(page.read_text(encoding="utf-8"), str(page.relative_to(REPO)))


# What a command's words stand for


def is_placeholder(word: str) -> bool:
    """``<ckpt>``, ``PLAN``, ``NAME``: a value the reader fills in."""
    return "<" in word or bool(CAPITALS.fullmatch(word.removesuffix("...")))


def synopsis_variants(args: Sequence[str]) -> list[list[str]]:
    """The argument lists a synopsis stands for: ``[`` / ``]`` dropped, one list per ``a|b`` alternative."""
    choices = []
    for word in args:
        if word.startswith("[") and word.count("[") > word.count("]"):
            word = word[1:]
        if word.endswith("]") and word.count("]") > word.count("["):
            word = word[:-1]
        alternatives = word.split("|") if "|" in word and not word.startswith("-") and "=" not in word else [word]
        choices.append([w for w in alternatives if w])
    return [list(variant) for variant in itertools.product(*choices)]


def app_config_for(value: str, app: str) -> str:
    """The config file a ``-c <...>`` placeholder stands for: the app's smoke.yaml if it matches, else the first."""
    pattern = PLACEHOLDER.sub("*", value)
    matches = sorted(p for p in glob.glob(pattern if "/" in pattern else f"configs/{app}/{pattern}", root_dir=REPO))
    matches = [m for m in matches if m.endswith((".yaml", ".yml"))]
    smoke = f"configs/{app}/smoke.yaml"
    return smoke if smoke in matches else (matches[0] if matches else value)


def app_argument_lists(args: Sequence[str], app: str) -> list[list[str]]:
    """An app command's argument lists as parsed: ``...`` the CPU smoke configs, ``-c <...>`` a real config."""
    smoke = ["configs/trainer/cpu.yaml", "-c", f"configs/{app}/smoke.yaml"]
    out = []
    for variant in synopsis_variants(args):
        argv: list[str] = []
        for word in variant:
            after_config = bool(argv) and argv[-1] in ("-c", "--config")
            if word == "...":
                argv += smoke if after_config else ["-c", *smoke]
            elif after_config and "<" in word:
                argv.append(app_config_for(word, app))
            else:
                argv.append(word)
        out.append(argv)
    return out


def plain_argument_lists(args: Sequence[str]) -> list[list[str]]:
    """A kpca-experiment / kpca-report command's argument lists: ``...`` (repeat) dropped, plan globs expanded."""
    out = []
    for variant in synopsis_variants(args):
        argv: list[str] = []
        for word in variant:
            if word == "...":
                continue
            word = word.removesuffix("...") if not word.startswith("-") else word
            if "*" in word and not word.startswith("-"):
                argv += sorted(glob.glob(word, root_dir=REPO)) or [word]
            else:
                argv.append(word)
        out.append(argv)
    return out


# Parsing


@contextlib.contextmanager
def in_repo() -> Iterator[None]:
    """Work from the repository root, where the pages' relative paths (``configs/...``) start."""
    before = os.getcwd()
    os.chdir(REPO)
    try:
        yield
    finally:
        os.chdir(before)


def app_of(program: str) -> str | None:
    """``vision_cls`` for ``vision-cls`` (a console script that runs ``kpca.<app>.cli``), else None."""
    match = re.fullmatch(r"kpca\.(\w+)\.cli", console_scripts().get(program, ""))
    return match.group(1) if match and match.group(1) != "training" else None


class _Captured(Exception):  # noqa: N818 (a signal, not an error)
    """Raised in place of the first parse: the app's CLI and its parser are built."""


@functools.cache
def app_cli(app: str):
    """The app's LightningCLI with its parser built, stopped before it parsed anything (built once per app)."""
    from lightning.pytorch.cli import LightningCLI

    main = importlib.import_module(f"kpca.{app}.cli").main
    built = []

    def capture(cli, parser, args) -> None:
        built.append(cli)
        raise _Captured

    with (
        mock.patch.object(sys, "argv", [app.replace("_", "-")]),
        mock.patch.object(LightningCLI, "parse_arguments", capture),
        contextlib.suppress(_Captured),
    ):
        main([])
    (cli,) = built
    return cli


def parse_app(app: str, argv: Sequence[str]) -> str | None:
    """None when the app's parser accepts ``argv``, else its error (the app's ``parse_arguments``, no class built).

    ``--help`` and ``--print_config`` exit with status 0 after parsing what precedes them: accepted.
    """
    from kpca.training.experiment.cli import QUIET_WHILE_PARSING
    from kpca.training.experiment.status import quiet_loggers

    cli = app_cli(app)
    errors = io.StringIO()
    with (
        in_repo(),
        mock.patch.object(sys, "argv", [app.replace("_", "-")]),
        mock.patch.dict(os.environ),
        quiet_loggers(QUIET_WHILE_PARSING),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(errors),
    ):
        try:
            cli.parse_arguments(cli.parser, list(argv))
            cli._parse_ckpt_path()  # Lightning's: a checkpoint's hyper-parameters merged into the config
        except SystemExit as exit_:
            if exit_.code == 0:
                return None
            text = errors.getvalue()
            return text[text.rfind("error:") :].strip() or f"exit status {exit_.code}"
        except Exception as error:  # a refusal by the app's own checks (--ckpt_path)
            return f"{type(error).__name__}: {error}"
    return None


def parse_argparse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[str | None, object]:
    """``(None, namespace)`` when ``parser`` accepts ``argv``, else ``(its error, None)``; ``(None, None)``: --help."""
    errors = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        try:
            return None, parser.parse_args(list(argv))
        except SystemExit as exit_:
            if exit_.code == 0:
                return None, None
            text = errors.getvalue()
            return text[text.rfind("error:") :].strip() or f"exit status {exit_.code}", None


def validate_with_app_parsers(plan) -> None:
    """``kpca-experiment validate`` of ``plan`` (its code), each step parsed by the app parser built here."""
    from kpca.training.experiment import cli as experiment_cli

    with mock.patch.object(experiment_cli, "_parse_error", lambda _main, app, argv: parse_app(app, argv)):
        experiment_cli.validate_plan(plan)


def parse_experiment(argv: Sequence[str], parse_steps: bool = True) -> str | None:
    """None when ``kpca-experiment`` accepts ``argv``: its parser, the plans it names, (``parse_steps``) their steps."""
    from kpca.training.experiment.cli import ValidationError, _parser
    from kpca.training.experiment.plan import PlanError, load_plan

    message, args = parse_argparse(_parser(), argv)
    if message is not None or args is None:
        return message
    paths = args.plans if args.command == "validate" else [args.plan]
    with in_repo():
        for path in paths:
            if is_placeholder(str(path)):
                continue
            try:
                plan = load_plan(path, args.override)
                if parse_steps and args.command in ("run", "validate"):
                    validate_with_app_parsers(plan)
                if args.command == "exec":
                    if not is_placeholder(args.run):
                        plan.run(args.run)
                    if not is_placeholder(args.step):
                        plan.step(args.step)
            except (PlanError, ValidationError) as error:
                return f"{type(error).__name__}: {error}"
    return None


def parse_report(argv: Sequence[str]) -> str | None:
    """None when ``kpca-report`` accepts ``argv``: its parser, and what its ``main`` refuses (no root, unknown task)."""
    from kpca.training.results.collect import installed_tasks
    from kpca.training.results.compare import _parser

    message, args = parse_argparse(_parser(), argv)
    if message is not None or args is None or args.task == "":  # --task alone lists the tasks
        return message
    if args.task is None or args.root is None:
        return "kpca-report needs the runs folder and --task TASK (its main refuses the command)"
    if not is_placeholder(args.task) and args.task not in installed_tasks():
        return f"--task {args.task!r} is not an installed report task ({', '.join(installed_tasks())})"
    return None


def argparse_words(parser: argparse.ArgumentParser) -> set[str]:
    """The subcommands and option strings of an argparse parser."""
    words = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            words |= set(action.choices)
    return words


def words_of(program: str) -> set[str]:
    """The subcommands and top-level options of ``program``: what a mention may name."""
    app = app_of(program)
    if app is not None:
        cli = app_cli(app)
        return set(cli.subcommands()) | set(cli.parser._option_string_actions)
    module = importlib.import_module(console_scripts()[program])
    return argparse_words(module._parser())


def problem(command: Command, parse_steps: bool = True) -> str | None:
    """None when ``command``'s program accepts it, else why not (the parser's message).

    ``parse_steps=False``: a ``kpca-experiment run`` / ``validate`` plan is loaded but its steps are not parsed.
    """
    if command.error is not None:
        return command.error
    return _problem(command.program, command.args, command.mention, parse_steps)


@functools.cache  # the same command on several pages is parsed once
def _problem(program: str, args: tuple[str, ...], mention: bool, parse_steps: bool) -> str | None:
    module = console_scripts()[program]
    app = app_of(program)
    if mention:
        (word,) = args
        return None if word in words_of(program) else f"{program} has no subcommand or option {word!r}"
    if app is not None:
        variants, parse = app_argument_lists(args, app), functools.partial(parse_app, app)
    elif module == EXPERIMENT_MODULE:
        variants, parse = plain_argument_lists(args), functools.partial(parse_experiment, parse_steps=parse_steps)
    elif module == REPORT_MODULE:
        variants, parse = plain_argument_lists(args), parse_report
    else:
        return f"no parser known for the console script {program} ({module}); add it to tests/command_support.py"
    for argv in variants:
        message = parse(argv)
        if message is not None:
            return f"{message}\n  arguments parsed: {shlex.join(argv)}"
    return None


def checkable(program: str) -> bool:
    """Whether :func:`problem` knows a parser for the console script ``program``."""
    return app_of(program) is not None or console_scripts()[program] in (EXPERIMENT_MODULE, REPORT_MODULE)
