"""Errors that a user's input causes, as opposed to a bug: each message names the value and the fix.

Every distribution of the project depends on this one, so the error types live here, beside the first checks that
raise them (an attention option out of range). From Python they are the standard exceptions they subclass
(``OptionError`` is a ``ValueError``, ``MissingPathError`` a ``FileNotFoundError``); the commands (``vision-cls``,
``kpca-experiment``, ...) end on any :class:`UserError` with one ``error: <message>`` line on stderr and the error's
:attr:`UserError.exit_status`, without a traceback (:mod:`kpca.training.errors`).
"""

from __future__ import annotations

from typing import ClassVar


class UserError(Exception):
    """An error in what the user asked for or gave; its message says what is wrong and how to fix it."""

    exit_status: ClassVar[int] = 2
    """The status a command exits with: 2 options, configs and plans; 3 data; 4 the machine or the disk."""


class OptionError(UserError, ValueError):
    """An option's value cannot be used: out of range, not one of the choices, or not going with another option."""


class MissingPathError(UserError, FileNotFoundError):
    """A configured file or folder does not exist or lacks the expected layout (the message names both)."""

    exit_status = 3
