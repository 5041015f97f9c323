"""Run one step of one run of a plan (``kpca-experiment exec``), leaving markers that say how it ended.

In the run folder ``<out>/<run>/seed<k>``, a step ``<step>`` keeps:

- ``<step>.running`` while it runs (JSON: host, pid, start, SLURM job), its modification time touched every
  :data:`HEARTBEAT_S` seconds, so that a step whose process died without a word is recognised (stale heartbeat);
- ``<step>.done`` once the app exited with status 0 (JSON: the finish time, the command, how its process started
  (``started``: a new interpreter or forked warm), the checkpoint it used and, for ``fit``, the best and last
  checkpoints from the fit's ``fit_summary.json``);
- ``<step>.failed`` when the app exited with another status (JSON: the status, the log, the time);
- ``<step>.log``: the app's output, appended to by every attempt.

A step already done is skipped, so rerunning a plan only runs what is missing; a ``fit`` always runs with
``--ckpt_path auto``, so an interrupted one continues from its newest checkpoint. All markers are written atomically.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType

from kpca.training.errors import UserError
from kpca.training.experiment import warm_start
from kpca.training.experiment.plan import Plan, PlannedRun, step_argv, step_folder
from kpca.training.files import write_atomic

logger = logging.getLogger(__name__)

HEARTBEAT_S = 30.0
"""How often a running step touches its ``.running`` marker."""
FIT_SUMMARY = "fit_summary.json"
"""The file ``ProjectCLI.after_fit`` writes into the fit's log folder: its best and last checkpoints."""
SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""Signals passed on to the child process (SLURM's requeue and ``scancel`` send SIGTERM; SIGUSR1 asks for a requeue)."""
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that end the step as interrupted (no ``.done``). SIGINT is not passed on: Ctrl-C in a terminal reaches
every process of the foreground group, the app included, and a second one would cut its shutdown short."""


class StepError(UserError, RuntimeError):
    """A step that cannot start (e.g. its checkpoint's fit is not done): the message names the file and the fix."""


def marker(run: PlannedRun, step_name: str, kind: str) -> Path:
    """``<run folder>/<step>.<kind>``, ``kind`` one of ``done``, ``failed``, ``running``."""
    return run.folder / f"{step_name}.{kind}"


def log_path(run: PlannedRun, step_name: str) -> Path:
    """``<run folder>/<step>.log``: the output of every attempt of the step, appended."""
    return run.folder / f"{step_name}.log"


def read_marker(path: Path) -> dict | None:
    """The JSON of a marker file, or None when it does not exist; an unreadable one reads as ``{}``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` atomically."""
    write_atomic(path, lambda stream: json.dump(data, stream, indent=2, sort_keys=True), mode="w", encoding="utf-8")


def fit_checkpoint(plan: Plan, run: PlannedRun, which: str) -> Path:
    """The ``best`` or ``last`` checkpoint of the run's fit, as its ``fit.done`` records it.

    Raises:
        StepError: when the fit is not done, or recorded no such checkpoint.
    """
    done_path = marker(run, "fit", "done")
    done = read_marker(done_path)
    if done is None:
        raise StepError(
            f"{run.id}: the fit is not done ({done_path} does not exist), so it has no {which} checkpoint to "
            f"evaluate; run the fit first: kpca-experiment run {plan.path}"
        )
    checkpoint = done.get(f"{which}_model_path")
    if not checkpoint:
        summary = step_folder(plan, run, "fit") / FIT_SUMMARY
        raise StepError(
            f"{run.id}: {done_path} names no {which} checkpoint (the fit's {summary} has none: with best, the fit "
            "never validated, so nothing was monitored); use ckpt: last in the plan's step, or let the fit validate"
        )
    return Path(checkpoint)


def running_info() -> dict:
    """What the ``.running`` marker says about this process: host, pid, start and the SLURM job variables."""
    info: dict[str, object] = {"host": socket.gethostname(), "pid": os.getpid(), "started": now()}
    info.update({name: os.environ[name] for name in SLURM_VARIABLES if name in os.environ})
    return info


class Heartbeat:
    """Touch a file every ``interval`` seconds from a daemon thread, until :meth:`stop`."""

    def __init__(self, path: Path, interval: float = HEARTBEAT_S) -> None:
        self.path, self.interval = path, interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="step-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        """Start touching the file."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop touching the file (it is not removed)."""
        self._stopped.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                os.utime(self.path)
            except FileNotFoundError:
                return


class SignalForwarder:
    """While installed, pass :data:`FORWARDED_SIGNALS` to ``child`` and remember the last of :data:`ENDING_SIGNALS`.

    Use as a context manager around waiting for the child; the previous handlers are restored on exit.
    """

    def __init__(self, child: subprocess.Popen | warm_start.WarmChild) -> None:
        self.child = child
        self.ending: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalForwarder:
        for sig in {*FORWARDED_SIGNALS, *ENDING_SIGNALS}:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum in ENDING_SIGNALS:
            self.ending = signum
        if signum in FORWARDED_SIGNALS and self.child.poll() is None:
            self.child.send_signal(signum)


def app_command(plan: Plan, run: PlannedRun, step_name: str, launcher: Sequence[str] = ()) -> list[str]:
    """``[python, -m, kpca.<app>, *step_argv]``, the checkpoint read from ``fit.done`` when needed.

    With a ``launcher`` (the Slurm executor's ``srun``) it is ``[*launcher, python, -m, kpca.training.slurm_start,
    kpca.<app>, *step_argv]``: the app starts with SLURM's requeue signal held (see :mod:`kpca.training.slurm_start`).
    """
    step = plan.step(step_name)
    checkpoint = fit_checkpoint(plan, run, step.ckpt) if step.ckpt is not None else None
    start = [*launcher, sys.executable, "-m", "kpca.training.slurm_start"] if launcher else [sys.executable, "-m"]
    return [*start, f"kpca.{plan.app}", *step_argv(plan, run, step_name, checkpoint)]


def execute_step(plan: Plan, run: PlannedRun, step_name: str, launcher: Sequence[str] = ()) -> int:
    """Run one step of one run unless it is done; return its exit status (0 when skipped).

    The app's output is appended to the step's log. Exit status 0 writes ``<step>.done`` (and removes
    ``<step>.failed``); another writes ``<step>.failed``. SIGTERM is passed on to the app and ends the step as
    interrupted: no marker but the log, exit status 143; so does SIGINT (130), which is not passed on (Ctrl-C in a
    terminal reaches the app itself). ``.running`` is removed in every case.

    Raises:
        StepError: when the step needs the checkpoint of a fit that is not done.
    """
    plan.step(step_name)
    done_path = marker(run, step_name, "done")
    if done_path.is_file():
        logger.info("%s %s: already done (%s)", run.id, step_name, done_path)
        return 0
    command = app_command(plan, run, step_name, launcher)
    log = log_path(run, step_name)
    running = marker(run, step_name, "running")
    write_json(running, running_info())
    heartbeat = Heartbeat(running).start()
    try:
        returncode, ending, warm = _run_logged(command, log)
    finally:
        heartbeat.stop()
        running.unlink(missing_ok=True)
    if ending is not None:
        logger.warning("%s %s: interrupted by signal %d; rerun the plan to continue it", run.id, step_name, ending)
        return 128 + ending
    if returncode == 0:
        write_json(done_path, _done_record(plan, run, step_name, command, warm))
        marker(run, step_name, "failed").unlink(missing_ok=True)
        return 0
    write_json(marker(run, step_name, "failed"), {"rc": returncode, "log": str(log), "time": now()})
    logger.error("%s %s: failed with exit status %d; see %s", run.id, step_name, returncode, log)
    return 128 - returncode if returncode < 0 else returncode


def _run_logged(command: list[str], log: Path) -> tuple[int, int | None, bool]:
    """Run ``command`` with its output appended to ``log``; ``(exit status, ending signal or None, warm)``.

    ``warm``: forked from the local executor's warm interpreter (:mod:`kpca.training.experiment.warm_start`).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as stream:
        stream.write(f"\n=== {now()} on {socket.gethostname()}: {shlex.join(command)}\n")
        stream.flush()
        warm = warm_start.start(command, stream)
        child = warm or subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT)
        with SignalForwarder(child) as forwarder:
            returncode = child.wait()
        stream.write(f"=== {now()}: exit status {returncode}\n")
    return returncode, forwarder.ending, warm is not None


def _done_record(plan: Plan, run: PlannedRun, step_name: str, command: list[str], warm: bool) -> dict:
    """The ``.done`` JSON: finish time, command, how it started, the checkpoint used; ``fit``'s best and last."""
    record: dict[str, object] = {"finished": now(), "command": command}
    record["started"] = "forked from the warm interpreter" if warm else "new interpreter"
    step = plan.step(step_name)
    if step.ckpt is not None:
        record["checkpoint"] = str(fit_checkpoint(plan, run, step.ckpt))
    if step_name == "fit":
        summary = read_marker(step_folder(plan, run, "fit") / FIT_SUMMARY) or {}
        record["best_model_path"] = summary.get("best_model_path") or None
        record["last_model_path"] = summary.get("last_model_path") or None
    return record
