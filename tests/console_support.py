"""An app's console script run in this process: ``console(capsys, "language-model", cwd, "fit", ...)``.

The function that the console script's entry point names (``kpca.<app>.cli:console_main``, i.e.
:func:`kpca.training.errors.run_command` around the app's ``main``), with ``sys.argv``, the environment, the working
folder and logging as in a new process, restored afterwards: what ``<program> args`` typed in a shell runs, without
the seconds a new interpreter spends importing Lightning and torch.

What it cannot stand in for: a test whose subject is the process itself (what a whole process prints once, the
environment that libraries read as they are imported, such as ``HF_HOME`` and the offline switches of HF datasets,
or the status of the real executable) runs the command as a process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from unittest import mock

import lightning.pytorch  # noqa: F401 (at collection: its log handler keeps the sys.stderr of its import, not a test's)
import pytest

from kpca.training.errors import TRACEBACK_ENV_VAR


@dataclass
class Done:
    """How a command ended: its exit status and what it printed (``subprocess.CompletedProcess``'s names)."""

    returncode: int
    stdout: str
    stderr: str


@contextmanager
def logging_of_a_new_process() -> Iterator[None]:
    """Logging as a new process has it: no handler, so the app's ``console_logging()`` adds its stderr handler.

    Under pytest the root logger holds pytest's capture handlers, and the app then adds none (it takes them for the
    user's logging): its INFO lines would never reach stderr. Everything is put back afterwards.
    """
    root, app = logging.getLogger(), logging.getLogger("kpca")
    saved = root.handlers[:], app.handlers[:], app.level, app.propagate
    root.handlers.clear()
    app.handlers.clear()
    try:
        yield
    finally:
        root.handlers[:], app.handlers[:] = saved[0], saved[1]
        app.setLevel(saved[2])  # setLevel, not the attribute: it clears the loggers' cached levels
        app.propagate = saved[3]


def console(capture: pytest.CaptureFixture, program: str, cwd: Path, *args: object, **env: str) -> Done:
    """``program args`` (a console script: ``vision-cls``, ``language-model``, ...) as typed in a shell in ``cwd``.

    Runs the function the installed ``program`` entry point names, in this process. ``sys.argv``, the environment
    (without ``KPCA_TRACEBACK``, with the hubs offline, plus ``env``), the working folder and logging are those of a
    new process and are restored afterwards. A ``SystemExit`` gives the status as the interpreter reads it; an
    exception that gets out is printed with its traceback and gives status 1, as the interpreter does.

    ``capture`` is ``capsys``, or ``capfd`` where DataLoader worker processes (forked from this one) print too, or
    where a library needs ``sys.stderr.fileno()`` (sentencepiece training the language model's tokenizer).
    """
    (entry_point,) = entry_points(group="console_scripts", name=program)
    script_main = entry_point.load()
    capture.readouterr()  # only what this command prints
    with (
        mock.patch.object(sys, "argv", [program, *map(str, args)]),
        mock.patch.dict(os.environ),
        pytest.MonkeyPatch.context() as patch,
        logging_of_a_new_process(),
    ):
        os.environ.pop(TRACEBACK_ENV_VAR, None)
        os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **env)
        patch.chdir(cwd)
        try:
            script_main()
            status = 0
        except SystemExit as exit_info:
            code = exit_info.code  # as the interpreter reads it: None is 0, a message is 1
            status = 0 if code is None else code if isinstance(code, int) else 1
        except Exception:
            traceback.print_exc()
            status = 1
    printed = capture.readouterr()
    return Done(status, printed.out, printed.err)


def vision_cls(capture: pytest.CaptureFixture, cwd: Path, *args: object, **env: str) -> Done:
    """``vision-cls args`` typed in a shell in ``cwd``, run in this process (:func:`console`)."""
    return console(capture, "vision-cls", cwd, *args, **env)


def vision_cls_process(cwd: Path, *args: object, **env: str) -> subprocess.CompletedProcess:
    """``python -m kpca.vision_cls args`` as typed in a shell in ``cwd``, as a process: for a test whose subject is
    the process (its exit status and last line, DDP ranks it starts). Tracebacks off unless ``env`` turns them on."""
    command = [sys.executable, "-m", "kpca.vision_cls", *map(str, args)]
    environment = {key: value for key, value in os.environ.items() if key != TRACEBACK_ENV_VAR}
    environment.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **env)
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=600)
