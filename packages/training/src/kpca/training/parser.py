"""The argument parser of every app's command: Lightning's, with errors that a user reads in one line.

:class:`ProjectArgumentParser` is the parser class :class:`kpca.training.cli.ProjectCLI` builds its main and
subcommand parsers from. Prefix matching is off (``--trainer.max_step`` is refused, not read as ``max_steps``).

A refusal is short and starts with what is wrong (:func:`error_report`), instead of jsonargparse's usage dump that
ends with a nested message::

    error: model.net.init_args.attention.kind: 'rcp' is not one of 'softmax', 'symmetric', 'rpc', ...
      (set in configs/vision_cls/smoke.yaml)
    see: vision-cls fit --help

:func:`reshape` reads jsonargparse's message into the option's full dotted path and a one-line problem; the command
line tells where the value came from (:func:`origin`) and a close option name (:func:`suggestions`).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml
from lightning.pytorch.cli import LightningArgumentParser

COMMAND_LINE = "(given on the command line)"
"""The origin of a value typed on the command line."""

MAX_DETAIL_LINES = 8
"""jsonargparse's message, when a refusal shows it, is cut after this many lines."""

_STEP = re.compile(
    r"""\s*(?:
        Parser\ key\ "(?P<key>[^"]+)":
      | Problem\ with\ given\ class_path\ '(?P<class_path>[^']+)':
      | Type\ .+?\ expects\ a\ function\ or\ a\ callable\ class:\ (?=Parser\ key)
    )""",
    re.VERBOSE,
)
"""One level of a nested jsonargparse message: a key, a class's init_args, a callable class's init_args."""

_GIVEN = re.compile(r"^Given value: (?P<value>.*?)(?:\. Got value: .*)?\Z", re.M | re.S)
_YAML_MARK = re.compile(r'^\s*in ".*", line (?P<line>\d+), column (?P<column>\d+)$')


@dataclass(frozen=True)
class Refusal:
    """A parser error reshaped for a user.

    Attributes:
        path: the failing option's full dotted path, as typed on the command line (None when the error names none).
        problem: what is wrong, in one line.
        details: jsonargparse's own words for the failing value (its message below the levels that ``path`` spells
            out), when they say more than ``problem``.
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


@dataclass(frozen=True)
class _Unnested:
    """A nested jsonargparse message: the path down to the innermost problem, and that problem's text."""

    parts: tuple[str, ...]
    class_path: str | None
    text: str

    @property
    def path(self) -> str:
        return ".".join(self.parts)


def _unnest(message: str) -> _Unnested:
    """Follow a message's ``Parser key "..."`` / ``Problem with given class_path`` levels down to its problem."""
    parts: list[str] = []
    class_path = None
    text = message.strip()
    while step := _STEP.match(text):
        if step["key"]:
            parts += step["key"].split(".")
            class_path = None
        else:
            parts.append("init_args")
            class_path = step["class_path"]
        text = _block_after(text[step.end() :])
    return _Unnested(tuple(parts), class_path, text)


def _block_after(rest: str) -> str:
    """The text after a level's colon: the rest of its line, then its indented block, dedented."""
    inline, _, block = rest.partition("\n")
    block = textwrap.dedent(block).strip("\n")
    return "\n".join(part for part in (inline.strip(), block) if part)


def _type_name(text: str) -> str:
    """A type as jsonargparse prints it, as a user reads it: ``<class 'int'>`` -> ``int``."""
    text = text.strip()
    if cls := re.fullmatch(r"<class '(.*)'>", text):
        return "None" if cls[1] == "NoneType" else cls[1]
    return text.replace("typing.", "")


def _alternatives(text: str) -> list[str]:
    """What a type as jsonargparse prints it accepts, as a user reads it: a Literal's values, else the type's name."""
    if literal := re.fullmatch(r"typing\.Literal\[(.*)\]", text.strip(), re.S):
        return _split_top_level(literal[1])
    return [_type_name(text)]


def _either(names: Sequence[str]) -> str:
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def _split_top_level(text: str) -> list[str]:
    """The comma-separated items of ``text``, not splitting inside brackets or quotes."""
    items, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    return [*items, text[start:].strip()] if text.strip() else items


def _quoted(value: str) -> str:
    return f"'{value}'"


def _literal(unnested: _Unnested) -> Refusal | None:
    literal = r"Expected a typing\.Literal\[(?P<values>.*)\]\. Got value: (?P<value>.*)"
    match = re.fullmatch(literal, unnested.text, re.S)
    if not match:
        return None
    return Refusal(unnested.path, f"{_quoted(match['value'])} is not one of {match['values']}")


def _expected(unnested: _Unnested) -> Refusal | None:
    match = re.fullmatch(r"Expected a (?P<type>.+?)\. Got value: (?P<value>.*)", unnested.text, re.S)
    if not match:
        return None
    return Refusal(unnested.path, f"expected {_type_name(match['type'])}, got {_quoted(match['value'])}")


def _union(unnested: _Unnested) -> Refusal | None:
    """A value that fits none of a Union's types; jsonargparse's list of them says no more when each is plain.

    When one of the types is a class that the given class_path names, its own problem is the problem.
    """
    text = unnested.text
    if block := _class_problem(text):
        inner = reshape(block)
        path = ".".join(part for part in (unnested.path, inner.path) if part)
        return Refusal(path, inner.problem, details=text)
    subtypes = re.search(r"^Subtypes: \[(.*)\]$", text, re.M)
    given = _GIVEN.search(text)
    if not (subtypes and given):
        return None
    items = _split_top_level(subtypes[1])
    accepted = [name for item in items for name in _alternatives(item)]
    value = _quoted(given["value"])
    if all(item.startswith("typing.Literal") or item == "<class 'NoneType'>" for item in items):
        problem = f"{value} is not one of {', '.join(accepted)}"
    else:
        problem = f"expected {_either(accepted)}, got {value}"
    errors = re.search(r"^Errors:\n(.*?)^Given value type:", text, re.M | re.S)
    plain = text.startswith("Does not validate against any of the Union subtypes") and errors is not None
    plain = plain and all(re.fullmatch(r"\s*- Expected a [^\n]*", line) for line in errors[1].splitlines())
    return Refusal(unnested.path, problem, details=None if plain else text)


def _class_problem(text: str) -> str | None:
    """The ``- Problem with given class_path '...':`` item of a Union's errors, with its indented lines, dedented."""
    lines = text.splitlines()
    item = (i for i, line in enumerate(lines) if line.lstrip().startswith("- Problem with given class_path"))
    start = next(item, None)
    if start is None:
        return None
    inside = (i for i in range(start + 1, len(lines)) if _indent(lines[i]) <= _indent(lines[start]))
    end = next(inside, len(lines))
    return textwrap.dedent("\n".join(lines[start:end])).removeprefix("- ")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _missing_file(unnested: _Unnested) -> Refusal | None:
    match = re.fullmatch(r"File does not exist: (?P<file>.*)", unnested.text)
    return Refusal(unnested.path, f"file does not exist: {match['file']}") if match else None


def _not_accepted(unnested: _Unnested) -> Refusal | None:
    """An unknown key, in a config file or a class's init_args, in any of jsonargparse's wordings."""
    text = unnested.text
    if match := re.fullmatch(r"Subcommand '(?P<sub>[^']+)' does not accept option '(?P<key>[^']+)'", text):
        group, _, name = match["key"].rpartition(".")
        owner = f"Group '{group}'" if group else f"Subcommand '{match['sub']}'"
        problem = f"{owner} does not accept option '{name}'"
        return Refusal(match["key"], problem, unknown=(match["key"],), subcommand=match["sub"])
    if match := re.fullmatch(r"Group '(?P<group>[^']+)' does not accept option '(?P<name>[^']+)'", text):
        key = f"{match['group']}.{match['name']}"
        return Refusal(key, text, unknown=(key,))
    if match := re.fullmatch(r"Option '(?P<name>[^']+)' is not accepted(?P<rest>.*)", text):
        key = ".".join((*unnested.parts, match["name"]))
        if unnested.class_path:
            return Refusal(key, f"{unnested.class_path} does not accept option '{match['name']}'")
        subcommand = re.search(r"subcommand '([^']+)'", match["rest"])
        problem = f"not accepted{match['rest']}" if match["rest"] else "no such option"
        return Refusal(key, problem, unknown=(key,), subcommand=subcommand[1] if subcommand else None)
    return None


def _unrecognized(unnested: _Unnested) -> Refusal | None:
    """Unknown command-line arguments; inside a class's options, spelled as the user typed them (full path)."""
    match = re.fullmatch(r"unrecognized arguments: (?P<args>.*)", unnested.text, re.S)
    if not match:
        return None
    prefix = f"--{unnested.path}." if unnested.parts else "--"
    args = [prefix + arg[2:] if arg.startswith("--") else arg for arg in match["args"].split()]
    unknown = tuple(arg.split("=")[0] for arg in args if arg.startswith("--"))
    return Refusal(None, f"unrecognized arguments: {' '.join(args)}", unknown=unknown)


def _argument(unnested: _Unnested) -> Refusal | None:
    match = re.fullmatch(r"argument (?P<name>[^:]+): (?P<problem>.*)", unnested.text, re.S)
    return Refusal(match["name"].lstrip("-"), match["problem"]) if match else None


def _yaml_syntax(unnested: _Unnested) -> Refusal | None:
    """A config file that is no YAML: its last problem and where it is (jsonargparse does not name the file)."""
    match = re.fullmatch(r"Problems parsing config: (?P<error>.*)", unnested.text, re.S)
    if not match:
        return None
    lines = match["error"].splitlines()
    marks = [(i, mark) for i, line in enumerate(lines) if (mark := _YAML_MARK.match(line))]
    if not marks or marks[-1][0] == 0:
        return Refusal("config", f"not valid YAML: {lines[0]}", details=match["error"] if len(lines) > 1 else None)
    at, mark = marks[-1]
    return Refusal("config", f"not valid YAML: {lines[at - 1]} (line {mark['line']}, column {mark['column']})")


def _not_a_mapping(unnested: _Unnested) -> Refusal | None:
    match = re.fullmatch(r"Unexpected config: (?P<content>.*)", unnested.text, re.S)
    if not match:
        return None
    return Refusal("config", f"not a YAML mapping of options: {match['content'].strip()!r}")


def _fallback(unnested: _Unnested, message: str) -> Refusal:
    """Any other message: its innermost first line; the innermost text as details when it says more."""
    lines = [line for line in unnested.text.splitlines() if line.strip()] or [message.strip()]
    problem = lines[0].strip().removeprefix("- ")
    if (given := _GIVEN.search(unnested.text)) and not given["value"].startswith("Namespace("):
        problem = f"{_quoted(given['value'])} is not accepted: {problem}"
    path = unnested.path or None
    if unnested.class_path:  # the class itself failed (an import, a required argument)
        path = ".".join(unnested.parts[:-1])
        problem = f"class_path '{unnested.class_path}': {problem}"
    return Refusal(path, problem, details=unnested.text if len(lines) > 1 else None)


_SHAPES: tuple[Callable[[_Unnested], Refusal | None], ...] = (
    _literal,
    _expected,
    _union,
    _missing_file,
    _not_accepted,
    _unrecognized,
    _argument,
    _yaml_syntax,
    _not_a_mapping,
)


def reshape(message: str) -> Refusal:
    """Reshape jsonargparse's error ``message`` into a :class:`Refusal`: the full option path, the problem in a line.

    A nested message (``Parser key "model.net":`` / ``Problem with given class_path '...':`` / ``Parser key
    "attention.kind":`` / ``Expected a typing.Literal[...]. Got value: rcp``) gives the path as a user types it
    (``model.net.init_args.attention.kind``) and its innermost problem in words (``'rcp' is not one of ...``).
    """
    unnested = _unnest(message)
    for shape in _SHAPES:
        if refusal := shape(unnested):
            return refusal
    return _fallback(unnested, message)


def _command_line_items(args: Sequence[str]) -> Iterator[tuple[str, str]]:
    """``("config", file)`` for each ``-c``/``--config`` file and ``("option", dotted name)`` for each other option."""
    args = list(args)
    for i, arg in enumerate(args):
        if arg in ("-c", "--config") and i + 1 < len(args):
            yield "config", args[i + 1]
        elif arg.startswith("--config="):
            yield "config", arg.removeprefix("--config=")
        elif arg.startswith("--"):
            yield "option", arg[2:].split("=")[0]


def config_files(args: Sequence[str]) -> list[str]:
    """The config files of command line ``args``, as typed, in order (the main command's and the subcommand's)."""
    return [item for kind, item in _command_line_items(args) if kind == "config"]


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


def _nested(key: str, group: str) -> bool:
    """Whether ``key`` is ``group`` or a key inside it."""
    return key == group or key.startswith(f"{group}.")


def _plain(name: str) -> str:
    return ".".join(part for part in name.split(".") if part != "init_args")


def origin(path: str, args: Sequence[str], subcommand: str | None = None) -> str | None:
    """Where the value of option ``path`` comes from on command line ``args``; None if nothing there sets it.

    That is the last config file or option that sets it, a key inside it or the group it is in (``(set in <file>)``
    or :data:`COMMAND_LINE`); for ``config``, the config file that cannot be read (``(in <file>)``), or the command
    line for a missing one.
    """
    if path == "config":
        broken = next((file for file in config_files(args) if not isinstance(_load(file), dict)), None)
        return None if broken is None else COMMAND_LINE if not Path(broken).is_file() else f"(in {broken})"
    parts = path.split(".")
    where = None
    for kind, item in _command_line_items(args):
        if kind == "config":
            tree = _load(item)
            scoped = tree.get(subcommand) if subcommand and isinstance(tree, dict) else None
            if _holds(tree, parts) or _holds(scoped, parts):
                where = f"(set in {item})"
        elif _nested(_plain(path), _plain(item)) or _nested(_plain(item), _plain(path)):
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


def _indented(text: str) -> str:
    lines = text.strip("\n").splitlines()
    if len(lines) > MAX_DETAIL_LINES:
        lines = [*lines[: MAX_DETAIL_LINES - 1], "..."]
    return "\n".join(f"  {line}" for line in lines)


def error_report(
    refusal: Refusal,
    args: Sequence[str],
    command: str,
    options: Iterable[str] = (),
    subcommand: str | None = None,
) -> str:
    """What a refused command prints on stderr, the error's one line first.

    Then where the value came from, a close option name, jsonargparse's message when it says more, and where to
    see the accepted options; no usage.

    Args:
        refusal: jsonargparse's error message, reshaped (:func:`reshape`).
        args: the command line (without the program's name).
        command: the command whose ``--help`` lists the options (``vision-cls fit``).
        options: the option strings of that command's parser (for a suggestion of a close one).
        subcommand: the subcommand that was parsing, if known.
    """
    subcommand = subcommand or refusal.subcommand
    lines = [refusal.first_line()]
    if refusal.path and (where := origin(refusal.path, args, subcommand)):
        lines.append(f"  {where}")
    lines += [f"did you mean {close}?" for close in suggestions(refusal.unknown, options)]
    if refusal.details:
        lines.append(_indented(refusal.details))
    lines.append(f"see: {command} --help")
    return "\n".join(lines) + "\n"


def _root(parser: Any) -> Any:
    while getattr(parser, "parent_parser", None) is not None:
        parser = parser.parent_parser
    return parser


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
        refusal = reshape(message)
        parser = getattr(ex, "subcommand_parser", None) or self
        args = getattr(_root(self), "args", None)
        args = sys.argv[1:] if args is None else args
        subcommand = getattr(parser, "subcommand", None)
        command = parser.prog.replace(" [options]", "")
        if subcommand is None and (subcommand := refusal.subcommand or self._subcommand_in(args)):
            # the main parser, refusing a subcommand's option (it validates the subcommand's values)
            command, parser = f"{command} {subcommand}", self._subcommand_parser(subcommand) or parser
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
