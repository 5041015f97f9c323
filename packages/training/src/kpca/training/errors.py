"""How every command ends on a user's mistake: ``error: <message>`` on stderr and a status that tells its kind.

The user-error types live here, with their exit statuses (:class:`UserError` and its kinds): the project's own
checks raise them with the value and the fix in the message. From Python they are the standard exceptions they
subclass (``OptionError`` is a ``ValueError``, ``MissingPathError`` a ``FileNotFoundError``). :func:`run_command`
runs a console script's main function and turns such an error, an attention option the attention library refuses
(``kpca.attention.errors.AttentionOptionError``: an option typed on the command line reaches its checks), and an
operating-system error about the disk (a read-only or full file system, a folder without permission), into one line
without a traceback:

- exit status 2: an option, a config file, a checkpoint that cannot take the options given, a plan;
- 3: the data (a missing folder, a damaged file);
- 4: the machine or the disk (no GPU for a GPU trainer file, a read-only or full disk, a run folder another
  command holds).

Anything else is a bug and keeps Python's traceback (exit status 1). Set ``KPCA_TRACEBACK=1`` to get the traceback of
a user error too (for a bug report).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from kpca.training.cache_folder import CACHE_FIX, inside_default_cache

__all__ = [
    "MachineError",
    "MissingPathError",
    "OptionError",
    "TRACEBACK_ENV_VAR",
    "UserError",
    "error_line",
    "run_command",
]

TRACEBACK_ENV_VAR = "KPCA_TRACEBACK"
"""Set to 1 to see the traceback of a user error as well as its message."""

DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT}
"""Operating-system errors about where a run writes: the disk, not the project's code."""

_WORKER_TRACEBACK = re.compile(r"^Caught \w+ in DataLoader worker process \d+\.\nOriginal Traceback")


class UserError(Exception):
    """An error in what the user asked for or gave; its message says what is wrong and how to fix it."""

    exit_status: ClassVar[int] = 2
    """The status a command exits with: 2 options, configs and plans; 3 data; 4 the machine or the disk."""


class OptionError(UserError, ValueError):
    """An option's value cannot be used: out of range, not one of the choices, or not going with another option."""


class MissingPathError(UserError, FileNotFoundError):
    """A configured file or folder does not exist or lacks the expected layout (the message names both)."""

    exit_status = 3


class MachineError(UserError, RuntimeError):
    """The machine cannot run what was asked (no GPU for a GPU trainer file, an unwritable run folder)."""

    exit_status = 4


def user_message(error: BaseException) -> str:
    """The message of a user error, without the traceback a DataLoader worker's re-raise puts in front of it."""
    message = str(error)
    if _WORKER_TRACEBACK.match(message):
        # "...\n<module>.<Class>: <message, maybe on several lines>": the text after the last such header
        headers = list(re.finditer(rf"^(?:[\w.]+\.)?{re.escape(type(error).__name__)}: ", message, re.M))
        if headers:
            message = message[headers[-1].end() :]
    return message.strip()


def disk_message(error: OSError) -> str:
    """An operating-system error about the disk as a sentence with the file and the fix (the cache's or the run's)."""
    where = f" {error.filename}" if error.filename else ""
    if inside_default_cache(error.filename):
        return f"cannot write{where} (the cache folder): {error.strerror or error}. Free space, or {CACHE_FIX}."
    return (
        f"cannot write{where}: {error.strerror or error}. Free space or choose a writable folder for the run: "
        "--trainer.logger.init_args.save_dir=<folder> (and --trainer.default_root_dir=<folder>)."
    )


def error_line(error: BaseException) -> tuple[str, int] | None:
    """``(message, exit status)`` for an error the user can fix; None for any other (a bug: keep its traceback)."""
    if isinstance(error, UserError):
        return user_message(error), error.exit_status
    if _is_attention_option_error(error):
        return user_message(error), OptionError.exit_status
    if isinstance(error, OSError) and error.errno in DISK_ERRNOS:
        return disk_message(error), MachineError.exit_status
    if error.__cause__ is not None and _raised_by_jsonargparse(error):  # a class it built refused its options
        return error_line(error.__cause__)
    return None


def _is_attention_option_error(error: BaseException) -> bool:
    """Whether kpca.attention refused an option (:class:`kpca.attention.errors.AttentionOptionError`).

    Looked up among the loaded modules: an error can only be one once kpca.attention is imported, and importing it
    here would import torch into the commands that need neither (``kpca-experiment exec``, ``status``).
    """
    errors = sys.modules.get("kpca.attention.errors")
    return errors is not None and isinstance(error, errors.AttentionOptionError)


def _raised_by_jsonargparse(error: BaseException) -> bool:
    """Whether ``error`` was raised inside jsonargparse (which wraps what a class it instantiates raises)."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and f"{os.sep}jsonargparse{os.sep}" in frame.tb_frame.f_code.co_filename


def run_command(main: Callable[[], Any]) -> None:
    """Run a console script's ``main``; end on a user error with ``error: <message>`` and its exit status.

    Any other exception propagates (a bug keeps its traceback); so does a user error when ``KPCA_TRACEBACK=1``.
    Under DDP every rank parses the same options, so an option error (status 2) is printed by rank 0 alone; a data or
    machine error (3, 4), which may be one rank's, by every rank that meets it.

    Args:
        main: the command's main function (it parses ``sys.argv`` itself).
    """
    try:
        main()
    except Exception as error:
        found = error_line(error)
        if found is None or os.environ.get(TRACEBACK_ENV_VAR, "") not in ("", "0"):
            raise
        message, status = found
        logging.shutdown()
        if status != OptionError.exit_status or not _another_rank():
            sys.stderr.write(f"error: {message}\n")
        sys.exit(status)


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")
"""Environment variables by which torchrun, Lightning's launcher and Slurm number a process: all 0 on rank 0."""


def _another_rank() -> bool:
    """Whether this process is a DDP rank other than the global rank 0 (a launcher numbered it above 0)."""
    return any(os.environ.get(name, "0").strip() not in ("", "0") for name in RANK_VARIABLES)
