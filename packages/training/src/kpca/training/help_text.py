"""Help text without reStructuredText: what ``--help`` prints of docstrings written for Sphinx.

jsonargparse takes each option's help from the docstring of the class it configures, Lightning's and ours, which spell
code as ``value`` and cross-references as :class:`~package.Name`. :class:`PlainHelpFormatter` prints them as a terminal
reader expects: ``value`` as 'value' (a quoted string as it is), a cross-reference as its last name (a module as its
full name), in group titles, descriptions and option help alike. :func:`whole_summary` keeps a subcommand's one-line
description from ending mid-sentence.
"""

from __future__ import annotations

import argparse
import inspect
import re

from jsonargparse import DefaultHelpFormatter

_ROLE = re.compile(r":(class|func|meth|mod|attr|data|obj|exc|ref):`(~?)([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``")


def plain_text(text: str) -> str:
    """``text`` with reStructuredText roles and inline literals made plain (see the module docstring)."""
    text = _ROLE.sub(_role_text, text)
    return _LITERAL.sub(_quoted, text)


def whole_summary(docstring: str) -> str:
    """``docstring`` with its first paragraph on one line.

    LightningCLI describes a subcommand (in ``--help``'s list, as the subcommand's description and as its options'
    title) by the first line of the docstring of the Trainer method it runs, docstring_parser's short description;
    where the first paragraph wraps, as in Lightning's ``test`` and ``predict``, that line ends mid-sentence.
    """
    summary, _, rest = inspect.cleandoc(docstring).partition("\n\n")
    return f"{' '.join(summary.split())}\n\n{rest}"


def _role_text(match: re.Match) -> str:
    """A cross-reference as Sphinx shows it: a module by its full name, anything else by its last name."""
    role, _, target = match.groups()
    return target if role == "mod" else target.rpartition(".")[2]


def _quoted(match: re.Match) -> str:
    """An inline literal in single quotes, unless it is a quoted string already (``"auto"``)."""
    literal = match.group(1)
    return literal if literal[0] == literal[-1] and literal[0] in "'\"" else f"'{literal}'"


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter, printing descriptions and option help as plain text (:func:`plain_text`)."""

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_text(super()._expand_help(action))

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def start_section(self, heading: str | None) -> None:
        super().start_section(None if heading is None else plain_text(heading))
