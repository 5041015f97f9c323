"""Removed ``data`` options of an app's command, and the new spelling a parser error about one of them adds.

jsonargparse refuses a removed option on the command line (``unrecognized arguments: --data.eval_subset=16``) and in
a config file (``Group 'data' does not accept option 'eval_subset'``). An app lists its removed options in
:attr:`kpca.training.cli.ProjectCLI.replaced_data_options` (option name under ``data`` -> the text that gives its
new spelling); the parser of its command (:mod:`kpca.training.parser`) then adds that text to its error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping


def replaced_option_hint(message: str, replaced: Mapping[str, str]) -> str | None:
    """The new spelling of the first removed ``data`` option that a parser error ``message`` names, else None.

    Args:
        message: jsonargparse's error message.
        replaced: removed option name under ``data`` -> the text that gives its new spelling.
    """
    if not replaced:
        return None
    names = "|".join(map(re.escape, replaced))
    match = re.search(rf"\bdata\.({names})\b|'data' does not accept option '({names})'", message)
    return replaced[match.group(1) or match.group(2)] if match else None


def moved_into_group(group: str, moves: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The replaced-options table of ``data`` options that moved into the group ``data.<group>``.

    Args:
        group: the group's name under ``data`` (``eval`` for ``data.eval``).
        moves: ``(old name under data, new name in the group)`` pairs, e.g. ``("eval_subset", "subset")``.

    Returns:
        old name -> the text that gives the new spelling, on the command line and in a config file.
    """
    return {
        old: f"data.{old} moved into the data.{group} group: write data.{group}.{new} (--data.{group}.{new}=..., or "
        f"{new}: under {group}: under data: in a config file)."
        for old, new in moves
    }
