"""The argument parser of every app's command: Lightning's, with a refusal a user reads in one line.

:class:`ProjectArgumentParser` is the parser class :class:`kpca.training.cli.ProjectCLI` builds its parsers from.
Prefix matching is off (``--trainer.max_step`` is refused, not read as ``max_steps``). A refusal starts with what is
wrong, says where the value came from and names a close option, instead of jsonargparse's usage dump::

    error: model.net.init_args.attention.kind: 'rcp' is not one of 'softmax', 'symmetric', 'rpc', ...
      (set in configs/vision_cls/smoke.yaml)
    see: vision-cls fit --help

jsonargparse's message gives the structure (the nested option path, the value given, an unknown key's wording); what
a bad value should have been comes from the parser's own type for that option (:func:`reshape`).
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
import textwrap
import types
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, Union, get_args, get_origin

import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch.cli import LightningArgumentParser

COMMAND_LINE = "(given on the command line)"
"""The origin of a value typed on the command line."""

MAX_DETAIL_LINES = 8
"""jsonargparse's message, when a refusal shows it, is cut after this many lines."""

_LEVEL = re.compile(
    r"""\s*(?:Parser\ key\ "(?P<key>[^"]+)":
      | Problem\ with\ given\ class_path\ '(?P<class_path>[^']+)':
      | Type\ .+?\ expects\ a\ function\ or\ a\ callable\ class:\ (?=Parser\ key))""",
    re.VERBOSE,
)
"""One level of a nested jsonargparse message: an option's key, a class's init_args, a callable class's init_args."""

_ROUTINE = re.compile(
    r"\s*(?:- )?(?:Expected a (?:<class '[^']*'>|typing\.\S.*|dot import path string: .*)(?:\. Got value: .*)?"
    r"|Does not validate against any of the Union subtypes|Subtypes: .*|Errors:|Given value(?: type)?: .*)"
)
"""A line of jsonargparse's message that the one-line problem already says (the types tried, the value given)."""

_YAML_MARK = re.compile(r'\s*in ".*", line (\d+), column (\d+)$')


@dataclass(frozen=True)
class Refusal:
    """A parser error reshaped for a user.

    Attributes:
        path: the failing option's full dotted path, as typed on the command line (None when the error names none).
        problem: what is wrong, in one line.
        details: jsonargparse's own words below the path, when they say more than ``problem``.
        unknown: options the error calls unknown (``--name`` as typed, or a config file's dotted key).
        subcommand: the subcommand the message names.
    """

    path: str | None
    problem: str
    details: str | None = None
    unknown: tuple[str, ...] = ()
    subcommand: str | None = None

    def first_line(self) -> str:
        """``error: <path>: <problem>``, the line a refusal starts with."""
        return f"error: {self.path}: {self.problem}" if self.path else f"error: {self.problem}"


def _unnest(message: str) -> tuple[list[str], str | None, str]:
    """The option path a nested message spells out, the class of its innermost ``init_args``, and the rest.

    ``Parser key "model.net": / Problem with given class_path 'C': / Parser key "attention.kind": / Expected ...``
    gives ``["model", "net", "init_args", "attention", "kind"]``, ``"C"`` and ``Expected ...``.
    """
    parts: list[str] = []
    class_path, text = None, message.strip()
    while level := _LEVEL.match(text):
        if level["key"]:
            parts += level["key"].split(".")
        else:
            parts.append("init_args")
            class_path = level["class_path"] or _named_class(text)
        inline, _, block = text[level.end() :].partition("\n")
        text = "\n".join(part for part in (inline.strip(), textwrap.dedent(block).strip("\n")) if part)
    return parts, class_path, text


def _named_class(text: str) -> str | None:
    """The class a callable class's message names in the value it got (``Namespace(class_path='...'``)."""
    named = re.search(r"class_path='([\w.]+)'", text)
    return named[1] if named else None


def _given_value(text: str) -> str | None:
    """The value jsonargparse says it was given (None for a class's whole namespace or when it says none)."""
    given = re.search(r"^Given value: (.*?)(?:\. Got value: .*)?\Z", text, re.M | re.S)
    given = given or re.search(r"\. Got value: (.*)\Z", text, re.S)
    return given[1] if given and not given[1].startswith("Namespace(") else None


def _type_at(parser: ArgumentParser, parts: list[str], class_path: str | None) -> Any:
    """The type the parser gives the option at ``parts``; inside a class, the type that class's parser gives it."""
    if "init_args" in parts:
        if class_path is None:
            return None
        module, _, name = class_path.rpartition(".")
        try:
            parser = ArgumentParser(exit_on_error=False)
            parser.add_class_arguments(getattr(importlib.import_module(module), name))
        except Exception:  # noqa: BLE001 (a class that does not import or has no signature: no type to read)
            return None
        parts = parts[len(parts) - parts[::-1].index("init_args") :]
    action = parser._option_string_actions.get("--" + ".".join(parts))
    return getattr(action, "_typehint", None)


def _alternatives(hint: Any) -> list[tuple[str, bool]]:
    """``(text, is a value)`` for what ``hint`` accepts: each Literal value and None as a value, else a type's name."""
    if get_origin(hint) in (Union, types.UnionType):
        return [alternative for arg in get_args(hint) for alternative in _alternatives(arg)]
    if get_origin(hint) is Literal:
        return [(repr(value), True) for value in get_args(hint)]
    if hint is type(None):
        return [("None", True)]
    if isinstance(hint, type) and not get_args(hint):
        return [(hint.__name__ if hint.__module__ == "builtins" else f"{hint.__module__}.{hint.__qualname__}", False)]
    return [(str(hint).replace("typing.", ""), False)]


def _bad_value(value: str, hint: Any) -> str:
    """The problem of ``value`` for an option of type ``hint``: the values it takes, or the types.

    Types are listed by name (a Union's order depends on which equal Union Python built first), values in the order
    their Literal gives, None last.
    """
    alternatives = _alternatives(hint)
    types_ = sorted({text for text, is_value in alternatives if not is_value})
    values = [text for text, is_value in alternatives if is_value and text != "None"]
    texts = [*types_, *values, *(["None"] if ("None", True) in alternatives else [])]
    if not types_:
        return f"'{value}' is not one of {', '.join(texts)}"
    either = f"{', '.join(texts[:-1])} or {texts[-1]}" if len(texts) > 1 else texts[0]
    return f"expected {either}, got '{value}'"


def _class_problem(text: str) -> str | None:
    """The ``- Problem with given class_path '...':`` item of a Union's errors with its indented lines, dedented."""
    lines = text.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.lstrip().startswith("- Problem with given class_path")), None
    )
    if start is None:
        return None
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next((i for i in range(start + 1, len(lines)) if len(lines[i]) - len(lines[i].lstrip()) <= indent), None)
    return textwrap.dedent("\n".join(lines[start:end])).removeprefix("- ")


def _unknown_key(parts: list[str], class_path: str | None, text: str) -> Refusal | None:
    """An unknown key (in a config file, a subcommand or a class's init_args) or unrecognized arguments."""
    if match := re.fullmatch(r"Subcommand '([^']+)' does not accept option '([^']+)'", text):
        group, _, name = match[2].rpartition(".")
        owner = f"Group '{group}'" if group else f"Subcommand '{match[1]}'"
        return Refusal(match[2], f"{owner} does not accept option '{name}'", unknown=(match[2],), subcommand=match[1])
    if match := re.fullmatch(r"Group '([^']+)' does not accept option '([^']+)'", text):
        return Refusal(f"{match[1]}.{match[2]}", text, unknown=(f"{match[1]}.{match[2]}",))
    if match := re.fullmatch(r"Option '([^']+)' is not accepted(.*)", text):
        key = ".".join((*parts, match[1]))
        if parts[-1:] == ["init_args"]:
            return Refusal(key, f"{class_path} does not accept option '{match[1]}'")
        subcommand = re.search(r"subcommand '([^']+)'", match[2])
        problem = f"not accepted{match[2]}" if match[2] else "no such option"
        return Refusal(key, problem, unknown=(key,), subcommand=subcommand[1] if subcommand else None)
    if match := re.fullmatch(r"unrecognized arguments: (.*)", text, re.S):
        prefix = f"--{'.'.join(parts)}." if parts else "--"
        args = [prefix + arg[2:] if arg.startswith("--") else arg for arg in match[1].split()]
        unknown = tuple(arg.split("=")[0] for arg in args if arg.startswith("--"))
        return Refusal(None, f"unrecognized arguments: {' '.join(args)}", unknown=unknown)
    return None


def _config_problem(text: str) -> Refusal | None:
    """A config file that is missing, no YAML (its last problem and where), or no mapping of options."""
    if match := re.fullmatch(r"File does not exist: (.*)", text):
        return Refusal("config", f"file does not exist: {match[1]}")
    if match := re.fullmatch(r"Unexpected config: (.*)", text, re.S):
        return Refusal("config", f"not a YAML mapping of options: {match[1].strip()!r}")
    if not (match := re.fullmatch(r"Problems parsing config: (.*)", text, re.S)):
        return None
    lines = match[1].splitlines()
    marks = [
        (i, mark) for i, line in enumerate(lines) if (mark := re.match(r'\s*in ".*", line (\d+), column (\d+)$', line))
    ]
    if not marks or marks[-1][0] == 0:
        return Refusal("config", f"not valid YAML: {lines[0]}", details=match[1] if len(lines) > 1 else None)
    at, mark = marks[-1]
    return Refusal("config", f"not valid YAML: {lines[at - 1]} (line {mark[1]}, column {mark[2]})")


def reshape(message: str, parser: ArgumentParser | None = None) -> Refusal:
    """Reshape jsonargparse's error ``message`` into a :class:`Refusal`: the full option path, the problem in a line.

    A bad value's problem lists what the option takes, read from ``parser``'s type for it (the type of the class's
    own option inside a class's ``init_args``); without ``parser`` or a type, jsonargparse's innermost line.
    """
    parts, class_path, text = _unnest(message)
    path = ".".join(parts) or None
    if refusal := _unknown_key(parts, class_path, text) or _config_problem(text):
        return refusal
    if match := re.fullmatch(r"argument ([^:]+): (.*)", text, re.S):
        return Refusal(match[1].lstrip("-"), match[2])
    if block := _class_problem(text):  # a Union's class member, whose own problem is the one to say
        inner = reshape(block)
        return Refusal(".".join(part for part in (path, inner.path) if part), inner.problem, details=text)
    lines = [line for line in text.splitlines() if line.strip()] or [message.strip()]
    details = text if any(not _ROUTINE.fullmatch(line) for line in lines) and len(lines) > 1 else None
    value = _given_value(text)
    hint = _type_at(parser, parts, class_path) if parser is not None and value is not None else None
    if hint is not None:
        return Refusal(path, _bad_value(value, hint), details=details)
    problem = lines[0].strip().removeprefix("- ")
    problem = f"'{value}' is not accepted: {problem}" if value is not None else problem
    if parts[-1:] == ["init_args"]:  # the class itself failed (an import, a required argument)
        path, problem = ".".join(parts[:-1]), f"class_path '{class_path}': {problem}"
    return Refusal(path, problem, details=text if len(lines) > 1 else None)


def _command_line_items(args: Sequence[str]) -> Iterator[tuple[str, str]]:
    """``("config", file)`` for each ``-c``/``--config`` file and ``("option", dotted name)`` for each other option."""
    for i, arg in enumerate(args):
        if arg in ("-c", "--config") and i + 1 < len(args):
            yield "config", args[i + 1]
        elif arg.startswith("--config="):
            yield "config", arg.removeprefix("--config=")
        elif arg.startswith("--"):
            yield "option", arg[2:].split("=")[0]


def config_files(args: Sequence[str]) -> list[str]:
    """The config files of command line ``args``, as typed, in order (the main command's and the subcommand's)."""
    return [item for kind, item in _command_line_items(list(args)) if kind == "config"]


def _load(file: str) -> Any:
    """The content of a YAML file; None if it cannot be read."""
    try:
        return yaml.safe_load(Path(file).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def _holds(tree: Any, parts: Sequence[str]) -> bool:
    """Whether a config's ``tree`` sets the key ``parts``: nested or dotted, with or without ``init_args``."""
    if not parts:
        return True
    if not isinstance(tree, dict):
        return False
    if parts[0] == "init_args" and _holds(tree, parts[1:]):
        return True
    return any(
        ".".join(parts[:n]) in tree and _holds(tree[".".join(parts[:n])], parts[n:]) for n in range(1, len(parts) + 1)
    )


def _within(key: str, group: str) -> bool:
    """Whether ``key`` is ``group`` or a key inside it, ``init_args`` left out of both."""
    key, group = (".".join(part for part in name.split(".") if part != "init_args") for name in (key, group))
    return key == group or key.startswith(f"{group}.")


def origin(path: str, args: Sequence[str], subcommand: str | None = None) -> str | None:
    """Where the value of option ``path`` comes from on command line ``args``; None if nothing there sets it.

    That is the last config file or option that sets it, a key inside it or the group it is in (``(set in <file>)``
    or :data:`COMMAND_LINE`); for ``config``, the config file that cannot be read (``(in <file>)``), or the command
    line for a missing one.
    """
    if path == "config":
        broken = next((file for file in config_files(args) if not isinstance(_load(file), dict)), None)
        return None if broken is None else COMMAND_LINE if not Path(broken).is_file() else f"(in {broken})"
    where = None
    for kind, item in _command_line_items(list(args)):
        if kind == "config":
            tree = _load(item)
            scoped = tree.get(subcommand) if subcommand and isinstance(tree, dict) else None
            if _holds(tree, path.split(".")) or _holds(scoped, path.split(".")):
                where = f"(set in {item})"
        elif _within(path, item) or _within(item, path):
            where = COMMAND_LINE
    return where


def suggestions(unknown: Iterable[str], options: Iterable[str]) -> list[str]:
    """For each unknown option (``--name`` as typed, or a dotted key), the closest of ``options``, if one is close.

    ``options`` are a parser's option strings (``--trainer.max_steps``); a key's suggestion is spelled as a key.
    """
    options = [option for option in options if option.startswith("--")]
    found = []
    for name in unknown:
        flag = name.startswith("--")
        close = difflib.get_close_matches(name if flag else f"--{name}", options, n=1, cutoff=0.8)
        if close and close[0] != name:
            found.append(close[0] if flag else close[0][2:])
    return found


def error_report(
    refusal: Refusal, args: Sequence[str], command: str, options: Iterable[str] = (), subcommand: str | None = None
) -> str:
    """What a refused ``command`` prints (``args``: its command line without the program's name).

    The error's line, where the value came from, a close option among ``options``, jsonargparse's message when it
    says more (cut at :data:`MAX_DETAIL_LINES`) and where to see the accepted options; no usage.
    """
    lines = [refusal.first_line()]
    if refusal.path and (where := origin(refusal.path, args, subcommand or refusal.subcommand)):
        lines.append(f"  {where}")
    lines += [f"did you mean {close}?" for close in suggestions(refusal.unknown, options)]
    if refusal.details:
        details = refusal.details.strip("\n").splitlines()
        details = [*details[: MAX_DETAIL_LINES - 1], "..."] if len(details) > MAX_DETAIL_LINES else details
        lines += [f"  {line}" for line in details]
    return "\n".join([*lines, f"see: {command} --help"]) + "\n"


_NESTED_NULL = re.compile(r"^(--[\w.]+)=None$")
"""A nested option jsonargparse hands a class's parser after loading its value: ``--attention.lambd=None``."""


class ProjectArgumentParser(LightningArgumentParser):
    """Lightning's parser without prefix matching; a refusal starts with its one line (:func:`error_report`)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None, *rest: Any, **kwargs: Any) -> Any:
        """Parse as jsonargparse does; a class's parser reads a nested ``null`` as null.

        ``--model.net.init_args.attention.lambd=null`` reaches the class's own parser as ``--attention.lambd=None``:
        jsonargparse (4.53, ``adapt_class_type``) formats the value it already loaded with ``str``. Only a class's
        parser (``exit_on_error`` off) gets that line back as ``=null``; ``test_nested_null_still_needs_the_fix``
        fails once jsonargparse passes the value on itself.
        """
        if args is not None and not self.exit_on_error and len(args) == 1 and isinstance(args[0], str):
            args = [_NESTED_NULL.sub(r"\1=null", args[0])]
        return super().parse_args(args, *rest, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """Exit with status 2 and :func:`error_report`; raise as jsonargparse does when it would not exit."""
        if not self.exit_on_error or "JSONARGPARSE_DEBUG" in os.environ:  # a nested parser, or debugging
            super().error(message, ex)
        self.logger.error(message)
        root = self
        while getattr(root, "parent_parser", None) is not None:
            root = root.parent_parser
        args = sys.argv[1:] if getattr(root, "args", None) is None else root.args
        parser = getattr(ex, "subcommand_parser", None) or self
        subcommand, command = getattr(parser, "subcommand", None), parser.prog.replace(" [options]", "")
        if subcommand is None and (subcommand := self._subcommand_in(args)):  # the main parser, checking its values
            command, parser = f"{command} {subcommand}", self._subcommand_parser(subcommand) or parser
        refusal = reshape(message, parser)
        if parser is self and refusal.subcommand and (named := self._subcommand_parser(refusal.subcommand)):
            command, parser, subcommand = f"{command} {refusal.subcommand}", named, refusal.subcommand
        sys.stderr.write(error_report(refusal, args, command, parser._option_string_actions, subcommand))
        self.exit(2)

    def _subcommand_parser(self, name: str) -> LightningArgumentParser | None:
        action = getattr(self, "_subcommands_action", None)
        return action._name_parser_map.get(name) if action is not None else None

    def _subcommand_in(self, args: Sequence[str]) -> str | None:
        """The subcommand on command line ``args`` (the first argument naming one, not a config file)."""
        after_config = [i + 1 for i, arg in enumerate(args) if arg in ("-c", "--config")]
        words = (arg for i, arg in enumerate(args) if i not in after_config)
        return next((word for word in words if self._subcommand_parser(word)), None)
