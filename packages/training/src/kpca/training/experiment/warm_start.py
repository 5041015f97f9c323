"""Warm starts for the local executor: a plan's steps fork from one interpreter that has imported the app.

A step ran ``python -m kpca.<app> ...`` in a new interpreter, which spends seconds of CPU importing torch,
Lightning, timm and the app before it reads an option. ``kpca-experiment run`` (local) starts one warm interpreter
per plan (``python -m kpca.training.experiment.warm_start <app> <socket>``), which imports ``kpca.<app>.cli`` and
waits. A step (``kpca-experiment exec``) asks it for a process: it forks, and the child takes the step's log as its
output and runs ``kpca.<app>`` as ``python -m`` does (``runpy``, as ``__main__``) to a normal interpreter exit. The
step forwards its signals to the child's pid and gets the exit status from the warm interpreter.

A fork is used only where it is as good as a new interpreter: on Linux, on a machine without a GPU device
(``/dev/nvidia*``, ``/dev/kfd``: no CUDA or ROCm runtime may start before a fork), when no Python thread runs after
the imports, and when the step's working directory and environment are those the warm interpreter started with
(what a library reads as it is imported stays right). Anything else, and ``KPCA_WARM_START=0``, starts the step
in a new interpreter, as the Slurm executor always does.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import json
import logging
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

SOCKET_VARIABLE = "KPCA_WARM_START_SOCKET"
"""Where the runner tells its steps the warm interpreter listens (set only while it runs)."""
SWITCH_VARIABLE = "KPCA_WARM_START"
"""``0`` starts every step in a new interpreter."""
GPU_DEVICES = ("/dev/nvidia[0-9]*", "/dev/kfd")
READY = "ready"


def available() -> str | None:
    """Why warm starts cannot be used on this machine, or None when they can."""
    if os.environ.get(SWITCH_VARIABLE) == "0":
        return f"{SWITCH_VARIABLE}=0"
    if not sys.platform.startswith("linux"):
        return f"forking an interpreter is only used on Linux, not {sys.platform}"
    devices = [path for pattern in GPU_DEVICES for path in glob.glob(pattern)]
    if devices:
        return f"a GPU device ({devices[0]}) is present: no GPU runtime may start before a fork"
    return None


@contextlib.contextmanager
def warm_interpreter(app: str) -> Iterator[None]:
    """Run the warm interpreter of ``app`` while the block runs, its socket named in this process's environment.

    Where it cannot run (:func:`available`) or fails to start, the block runs without one (an INFO line says why).
    """
    reason = available()
    if reason is not None:
        logger.info("steps start in new interpreters: %s", reason)
        yield
        return
    with tempfile.TemporaryDirectory(prefix="kpca-warm-") as folder, open(Path(folder) / "stderr", "w+") as errors:
        path = str(Path(folder) / "socket")
        server = subprocess.Popen(
            [sys.executable, "-m", __name__, app, path],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, text=True,
        )  # fmt: skip
        first = server.stdout.readline().strip()
        if first != READY:
            server.kill()
            server.communicate()
            errors.seek(0)
            why = (errors.read().strip().splitlines() or [first or "no output"])[-1]
            logger.info("steps start in new interpreters: the warm interpreter did not start (%s)", why)
            yield
            return
        os.environ[SOCKET_VARIABLE] = path
        try:
            yield
        finally:
            del os.environ[SOCKET_VARIABLE]
            server.terminate()
            server.communicate()


class WarmChild:
    """A step's app forked by the warm interpreter: the part of :class:`subprocess.Popen` a step uses."""

    def __init__(self, connection: socket.socket, pid: int) -> None:
        self.pid, self.returncode = pid, None
        self._connection = connection

    def poll(self) -> int | None:
        """The exit status once :meth:`wait` has read it, else None."""
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the app."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def wait(self) -> int:
        """Wait for the app's exit status (negative: the signal that ended it), as ``Popen.wait`` gives it."""
        if self.returncode is None:
            message = _receive(self._connection)
            self._connection.close()
            if "status" not in message:
                raise RuntimeError(f"the warm interpreter ended before the step's app (pid {self.pid})")
            self.returncode = os.waitstatus_to_exitcode(message["status"])
        return self.returncode


def start(command: Sequence[str], output: IO) -> WarmChild | None:
    """Fork ``command`` (``python -m kpca.<app> ...``) from the warm interpreter, its output into ``output``.

    None when no warm interpreter runs for this app, or it answers that this step needs a new interpreter.
    """
    path = os.environ.get(SOCKET_VARIABLE)
    if path is None or list(command[:2]) != [sys.executable, "-m"]:
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        request = {"module": command[2], "argv": list(command[3:]), "cwd": os.getcwd(), "env": _step_environment()}
        _send(connection, request, fds=[output.fileno()])
        answer = _receive(connection)
    except OSError as error:
        connection.close()
        logger.info("the step starts in a new interpreter: the warm one did not answer (%s)", error)
        return None
    if "pid" not in answer:
        connection.close()
        logger.info("the step starts in a new interpreter: %s", answer.get("fresh", answer))
        return None
    return WarmChild(connection, answer["pid"])


def _step_environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != SOCKET_VARIABLE}


def _send(connection: socket.socket, message: dict, fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    socket.send_fds(connection, [struct.pack("!I", len(data)) + data], list(fds))


def _receive(connection: socket.socket) -> dict:
    """One length-prefixed JSON message ({} at the end of the stream)."""
    return _receive_with_fds(connection)[0]


def _receive_with_fds(connection: socket.socket) -> tuple[dict, list[int]]:
    """One length-prefixed JSON message ({} at the end of the stream) and the descriptors sent with it."""
    header, fds, _, _ = socket.recv_fds(connection, 4, 1)
    if len(header) < 4:
        return {}, fds
    (size,) = struct.unpack("!I", header)
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return (json.loads(data) if len(data) == size else {}), fds


@dataclass
class _Request:
    module: str
    argv: list[str]


def _serve(app: str, path: str, started_env: dict[str, str], started_cwd: str) -> _Request:
    """Answer steps until the runner goes; returns only in a forked child, with what it is to run.

    A step is forked only when its working directory and environment are ``started_cwd`` and ``started_env``, those
    this interpreter imported the app with (imports may change the environment: ``COLUMNS`` and ``LINES``).
    """
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    print(READY, flush=True)
    while os.getppid() == parent:
        if not select.select([server], [], [], 1.0)[0]:
            continue
        connection, _ = server.accept()
        message, fds = _receive_with_fds(connection)
        if not message or len(fds) != 1:
            connection.close()
            continue
        reason = _why_not_warm(message, app, started_env, started_cwd)
        if reason is not None:
            _send(connection, {"fresh": reason})
            connection.close()
            os.close(fds[0])
            continue
        pid = os.fork()
        if pid == 0:
            server.close()
            connection.close()
            os.dup2(fds[0], 1)
            os.dup2(fds[0], 2)
            os.close(fds[0])
            return _Request(message["module"], message["argv"])
        os.close(fds[0])
        with contextlib.suppress(OSError):
            _send(connection, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            _send(connection, {"status": status})
        connection.close()
    sys.exit(0)


def _why_not_warm(message: dict, app: str, env: dict[str, str], cwd: str) -> str | None:
    if message["module"] != f"kpca.{app}":
        return f"the warm interpreter imported kpca.{app}, not {message['module']}"
    if message["cwd"] != cwd:
        return f"the step runs in {message['cwd']}, the warm interpreter in {cwd}"
    step_env = message["env"]
    changed = sorted(key for key in {*env, *step_env} if env.get(key) != step_env.get(key))
    if changed:
        how = [
            f"{key} " + ("set in the step only" if key not in env else "unset in the step" if key not in step_env
                         else "set to another value")
            for key in changed[:5]
        ]  # fmt: skip
        return f"the step's environment differs from the warm interpreter's: {', '.join(how)}"
    return None


def main(argv: Sequence[str]) -> _Request:
    """Import ``kpca.<app>.cli`` and serve steps; returns only in a forked child."""
    app, path = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the step's app and the runner, which stop it
    started_env, started_cwd = _step_environment(), os.getcwd()
    importlib.import_module(f"kpca.{app}.cli")
    if threading.active_count() != 1:
        print(f"{threading.active_count()} threads run after importing kpca.{app}.cli: no fork", flush=True)
        sys.exit(1)
    return _serve(app, path, started_env, started_cwd)


if __name__ == "__main__":
    _request = main(sys.argv[1:])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [sys.argv[0], *_request.argv]
    runpy.run_module(_request.module, run_name="__main__", alter_sys=True)
