"""An app's console script run in this process: ``console(capsys, "language-model", cwd, "fit", ...)``.

The function that the console script's entry point names (``kpca.<app>.cli:console_main``, i.e.
:func:`kpca.training.errors.run_command` around the app's ``main``), with ``sys.argv``, the environment, the working
folder and logging as in a new process, restored afterwards: what ``<program> args`` typed in a shell runs, without
the seconds a new interpreter spends importing Lightning and torch. The generalisation of ``vision_cls`` of
tests/training/test_error_lines.py to every app.

What it cannot stand in for: a test whose subject is the process itself (what a whole process prints once, the
environment that libraries read as they are imported, such as ``HF_HOME`` and the offline switches of HF datasets,
or the status of the real executable) runs the command as a process.
"""

from __future__ import annotations

import os
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from unittest import mock

import pytest

from kpca.training.errors import TRACEBACK_ENV_VAR
from tests.training.test_error_lines import Done, _logging_of_a_new_process


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
        _logging_of_a_new_process(),
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
