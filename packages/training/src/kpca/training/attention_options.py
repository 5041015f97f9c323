"""Choosing an attention kind by one word: which settings of a parsed config the chosen kind reads.

Each attention group of a command's config (``model.net.init_args.attention``, Segmenter's ``decoder_attention``)
is an :class:`~kpca.attention.AttentionSpec`, and each kind reads only its own settings. A command that types
``--model.net.init_args.attention.kind=twicing`` over an RPC config file therefore finds ``n_iter: 2`` that twicing
does not read. The rule (:func:`settle_attention_groups`), by where each setting came from (:func:`sources`):

- a setting from a config file given before the one that chose the kind (or the command line that typed it), or
  left by the checkpoint or the defaults, is dropped, with one INFO line naming it and its file
  (``attention.n_iter=2 from configs/vision_cls/smoke.yaml does not apply to twicing: dropped``);
- a setting typed on the command line, or set in the same config file as the kind (or a later one), is a mistake:
  refused, naming the setting, where it came from and the kinds that read it.

Configs saved before each kind owned its settings hold the former defaults for every kind (``n_iter: 4``); those
are dropped wherever they come from (:data:`kpca.attention.spec.SAVED_DEFAULTS`), so saved runs still load.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from kpca.attention import AttentionSpec
from kpca.attention.spec import (
    KIND_SETTINGS,
    READ_SINCE,
    SAVED_DEFAULTS,
    TASKS,
    kinds,
    kinds_reading,
    registered_kind,
    unread_settings_text,
    upgrade_saved_attention,
)
from kpca.training.errors import OptionError

logger = logging.getLogger(__name__)

SPEC_FIELDS = frozenset(field.name for field in fields(AttentionSpec))
"""The keys of an attention group: AttentionSpec's fields."""
COMMAND_LINE = "the command line"


@dataclass(frozen=True)
class Source:
    """One argument of a command that sets options: a config file, or an option typed on the command line.

    Attributes:
        position: its place among the command's arguments (later ones override earlier ones).
        file: the config file as typed, or None for an option typed on the command line.
        path: the option's dotted key parts (``()`` for a config file: its keys start at the subcommand's root).
        value: the file's content, or the option's value as typed (a string, or None for a bare flag).
    """

    position: int
    file: str | None
    path: tuple[str, ...]
    value: Any

    @property
    def where(self) -> str:
        """``<file>`` or ``the command line``."""
        return self.file if self.file is not None else COMMAND_LINE

    def sets(self, group: Sequence[str], key: str) -> bool:
        """Whether this argument sets ``key`` of the attention group at ``group`` (its dotted parts)."""
        target = _plain((*group, key))
        mine = _plain(self.path)
        if mine == target:
            return True
        if target[: len(mine)] != mine:
            return False
        tree = self.value if self.file is not None else _yaml_value(self.value)
        return _holds(tree, target[len(mine) :])


GIVEN_ARGUMENTS = "the given arguments"
"""Where a value comes from when the command was given a dict or Namespace of arguments instead of a command line."""


def sources(args: Sequence[str] | Mapping | Namespace, subcommand: str) -> list[Source]:
    """The config files and options of command line ``args``, in order, as they apply to ``subcommand``.

    A config file given before the subcommand is read at its ``<subcommand>:`` key (LightningCLI's layout for the
    main command's ``--config``); options are ``--key=value`` or ``--key value``. Arguments given as a dict (or
    Namespace) are one source, like one config file.
    """
    if isinstance(args, (Mapping, Namespace)):
        tree = args.as_dict() if isinstance(args, Namespace) else args
        return [Source(0, GIVEN_ARGUMENTS, (), tree.get(subcommand, tree))]
    args = list(args)
    found: list[Source] = []
    before = subcommand in args  # the main command's arguments come before the subcommand's name
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == subcommand and before:
            before = False
        elif arg in ("-c", "--config") and i + 1 < len(args):
            found.append(_config_source(len(found), args[i + 1], subcommand if before else None))
            i += 1
        elif arg.startswith("--config="):
            found.append(_config_source(len(found), arg.removeprefix("--config="), subcommand if before else None))
        elif arg.startswith("--"):
            name, equals, value = arg[2:].partition("=")
            if not equals and i + 1 < len(args) and not args[i + 1].startswith("-"):
                value, i = args[i + 1], i + 1
            found.append(Source(len(found), None, tuple(name.split(".")), value if equals or value else None))
        i += 1
    return found


def _config_source(position: int, typed: str, scope: str | None) -> Source:
    tree = _yaml_value(typed)
    if scope is not None and isinstance(tree, Mapping):
        tree = tree.get(scope)
    return Source(position, typed, (), tree)


def _yaml_value(value: Any) -> Any:
    """A typed value as YAML: the content of the file it names, else the value itself parsed as YAML."""
    if not isinstance(value, str):
        return value
    try:
        if Path(value).is_file():
            return yaml.safe_load(Path(value).read_text(encoding="utf-8"))
        return yaml.safe_load(value)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def _plain(parts: Sequence[str]) -> tuple[str, ...]:
    """Dotted key parts without ``init_args`` (LightningCLI accepts a class's arguments with or without it)."""
    return tuple(part for name in parts for part in name.split(".") if part != "init_args")


def _holds(tree: Any, parts: Sequence[str]) -> bool:
    """Whether a YAML ``tree`` sets the key ``parts`` (plain parts), nested or dotted, with or without ``init_args``."""
    if not parts:
        return True
    if not isinstance(tree, Mapping):
        return False
    for key, value in tree.items():
        key_parts = _plain(str(key).split("."))
        if not key_parts and _holds(value, parts):  # an ``init_args:`` level
            return True
        if key_parts and tuple(parts[: len(key_parts)]) == key_parts and _holds(value, parts[len(key_parts) :]):
            return True
    return False


def attention_groups(config: Namespace, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Namespace]]:
    """Each attention group of a parsed config, depth first: its dotted key parts and its namespace."""
    for key, value in vars(config).items():
        if isinstance(value, Namespace):
            if set(vars(value)) == SPEC_FIELDS:
                yield (*prefix, key), value
            else:
                yield from attention_groups(value, (*prefix, key))


@dataclass(frozen=True)
class DroppedSetting:
    """A setting of an attention group that its kind does not read, dropped (set to None).

    Attributes:
        group: the group's dotted key parts (``("model", "net", "init_args", "attention")``).
        name: the setting (``n_iter``).
        value: its value before it was dropped.
        where: where it came from (a config file, ``the checkpoint``, ``the defaults``).
        kind: the kind that does not read it.
    """

    group: tuple[str, ...]
    name: str
    value: Any
    where: str
    kind: str
    saved_before: bool = False
    """A setting the kind reads now, at the former default of a config saved before it did (it chose nothing)."""

    @property
    def text(self) -> str:
        """``attention.n_iter=2 from <file> does not apply to twicing: dropped``."""
        setting = f"{self.group[-1]}.{self.name}={self.value!r} from {self.where}"
        if self.saved_before:
            return f"{setting} is the former default of a config saved before {self.kind} read {self.name}: dropped"
        return f"{setting} does not apply to {self.kind}: dropped"


def settle_attention_groups(
    config: Namespace, args: Sequence[str] | Mapping | Namespace, subcommand: str, trained: Mapping | None = None
) -> list[DroppedSetting]:
    """Drop, in place, the attention settings a kind does not read that came before it; refuse those typed for it.

    A setting of one of ``config``'s attention groups that its kind does not read is dropped when it came from a
    config file given before the one that chose the kind (or from the defaults), and refused when it was typed.
    With ``trained``, the checkpoint's model options that were the parse's defaults, a group whose kind differs from
    the checkpoint's drops every setting that nothing typed: the checkpoint's were another kind's.

    Args:
        config: the subcommand's parsed config.
        args: the command line it was parsed from (without the program's name), or the arguments given as a dict.
        subcommand: the subcommand (``fit``, ``test``, ...).
        trained: the ``--ckpt_path``'s model options, where they stood in for the defaults (None: they did not).

    Returns:
        The dropped settings, in order (the caller logs them: :attr:`DroppedSetting.text`).

    Raises:
        OptionError: for a setting typed on the command line, or set in the config file that chose the kind (or a
            later one), that the kind does not read: it names the option, where it came from and the kinds that
            read it.
    """
    given = sources(args, subcommand)
    fallback = "the defaults" if trained is None else "the checkpoint"
    dropped = []
    for group, values in attention_groups(config):
        kind = values.kind
        if not isinstance(kind, str) or kind not in kinds():
            continue  # the parser names an unknown kind
        kind_source = _last_setting(given, group, "kind")
        switched = trained is not None and _trained_kind(trained, group) not in (None, kind)
        dropped += _formerly_unread(group, values, given)
        for name in KIND_SETTINGS:
            value = getattr(values, name)
            if value is None or (name in registered_kind(kind).settings and not switched):
                continue
            source = _last_setting(given, group, name)
            if name in registered_kind(kind).settings and source is not None:
                continue  # typed for the kind the checkpoint is switched to
            if source is not None and source.file is None:
                raise OptionError(_refusal(group, name, value, kind, f"--{'.'.join(group)}.{name}", COMMAND_LINE))
            earlier = source is None or (kind_source is not None and source.position < kind_source.position)
            if not earlier and value not in SAVED_DEFAULTS[name]:
                raise OptionError(_refusal(group, name, value, kind, f"{name} from {source.where}", source.where))
            setattr(values, name, None)
            dropped.append(DroppedSetting(group, name, value, fallback if source is None else source.where, kind))
    return dropped


def _formerly_unread(group: tuple[str, ...], values: Namespace, given: Sequence[Source]) -> list[DroppedSetting]:
    """Drop, in place, the :data:`~kpca.attention.spec.READ_SINCE` settings of a group saved before its kind read them.

    Such a group holds a setting its kind does not read (every setting was saved then), and the newer setting at its
    former default, which chose nothing; one typed on the command line stays.
    """
    kind = values.kind
    unread = [name for name in KIND_SETTINGS if name not in registered_kind(kind).settings]
    if not any(getattr(values, name) is not None for name in unread):
        return []
    dropped = []
    for name in READ_SINCE.get(kind, ()):
        value, source = getattr(values, name), _last_setting(given, group, name)
        if value in SAVED_DEFAULTS[name] and (source is None or source.file is not None):
            setattr(values, name, None)
            where = "the defaults" if source is None else source.where
            dropped.append(DroppedSetting(group, name, value, where, kind, saved_before=True))
    return dropped


def _trained_kind(trained: Mapping, group: Sequence[str]) -> str | None:
    """The kind of the checkpoint's attention group at ``group`` (``("model", ...)``), if it has one."""
    node: Any = {"model": trained}
    for part in group:
        node = node.get(part) if isinstance(node, Mapping) else None
    return node.get("kind") if is_attention_group(node) else None


def _last_setting(given: Sequence[Source], group: Sequence[str], key: str) -> Source | None:
    return next((source for source in reversed(given) if source.sets(group, key)), None)


def _refusal(group: Sequence[str], name: str, value: Any, kind: str, fix: str, where: str) -> str:
    readers = ", ".join(kinds_reading(name))
    return (
        f"{'.'.join(group)}.{name}={value!r} (from {where}): {unread_settings_text(kind, name)}. Remove {fix}, or "
        f"choose a kind that reads it ({readers})"
    )


def drop_settings(config: Namespace, dropped: Sequence[DroppedSetting]) -> None:
    """Set the ``dropped`` settings to None in another parse of the same command (e.g. its typed options only)."""
    for setting in dropped:
        node: Any = config
        for part in setting.group:
            node = getattr(node, part, None) if isinstance(node, Namespace) else None
        if isinstance(node, Namespace) and getattr(node, setting.name, None) is not None:
            setattr(node, setting.name, None)


def is_attention_group(value: object) -> bool:
    """Whether a plain config value is an attention group (a mapping of AttentionSpec's fields, ``kind`` among them)."""
    return isinstance(value, Mapping) and "kind" in value and set(value) <= SPEC_FIELDS


def comparable_attention(config: object) -> object:
    """``config`` with each attention group in the form two runs of the same model share, whenever they were saved.

    A group saved before each kind owned its settings holds the former defaults of the settings its kind does not
    read, and the resolved defaults of those it reads (an RPC config held ``lambd: 4.0`` where one saved now holds
    ``null``). Here both become one form: unread former defaults dropped, and each setting left None filled with the
    kind's default where that default is the same for every task (a task's own default, NeuTRENO's ``lambd``, stays
    None: the task is not known here, and the two values make different models).
    """
    if is_attention_group(config):
        group = upgrade_saved_attention(config)
        entry = registered_kind(group["kind"]) if group.get("kind") in kinds() else None
        if entry is not None:
            for name, default in entry.settings.items():
                same_for_every_task = all(entry.defaults(task)[name] == default for task in TASKS)
                if group.get(name) is None and same_for_every_task:
                    group[name] = default
        return group
    if isinstance(config, Mapping):
        return {key: comparable_attention(value) for key, value in config.items()}
    return config
