"""Where a plan stands: the state of every run x step, and how far a fit has come and how long it has left.

A step's state comes from its markers (:mod:`kpca.training.experiment.steps`): ``done``; ``running`` while its
``.running`` heartbeat is fresh; ``interrupted`` when that heartbeat is older than :data:`STALE_AFTER_S` or its
process, on this host, is gone (killed), or when the step has a log but no marker (stopped by a signal); ``failed``;
``not started``; ``queued`` while SLURM holds the step's job (for a plan submitted with ``--executor slurm``, asked
of ``squeue``: :func:`kpca.training.experiment.slurm.slurm_states`). A fit's progress is read from its newest
checkpoint (epoch and global step, memory-mapped), its saved ``config.yaml`` (``max_epochs`` / ``max_steps``) and
the wall times of its logged ``train/*`` scalars (TensorBoard): e.g. ``epoch 3/300, step 1200, ~2h10m left``.
What cannot be known is left out.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import torch
import yaml

from kpca.training.checkpointing.resume import checkpoint_problem
from kpca.training.experiment.plan import Plan, PlannedRun, step_folder
from kpca.training.experiment.steps import log_path, marker, read_marker
from kpca.training.results.tables import markdown_table
from kpca.training.run_lock import process_is_running, process_start_time

logger = logging.getLogger(__name__)

STALE_AFTER_S = 300.0
"""A ``.running`` marker not touched for this long belongs to a step whose process is gone."""
RATE_INTERVALS = 50
"""How many of the last logged training steps the throughput is measured over."""
STATES = ("done", "running", "queued", "failed", "interrupted", "not started")


@dataclass(frozen=True)
class StepState:
    """The state of one step of one run and seed.

    Attributes:
        run_id: ``<run>/seed<k>``.
        step: the step name.
        state: one of :data:`STATES`.
        detail: e.g. the log of a failed step, or ``pid 123 on host x``.
        progress: for a fit, e.g. ``epoch 3/300, step 1200, ~2h10m left`` ("" when nothing is known).
    """

    run_id: str
    step: str
    state: str
    detail: str = ""
    progress: str = ""


@dataclass(frozen=True)
class FitProgress:
    """How far a fit has come: what its newest checkpoint, saved config and TensorBoard events say (None: unknown).

    Attributes:
        epochs_done: epochs completed.
        global_step: optimizer steps taken.
        steps_per_epoch: optimizer steps per epoch, from the checkpoint's loop counters.
        max_epochs: the fit's ``trainer.max_epochs``.
        max_steps: the fit's ``trainer.max_steps`` (None when unlimited).
        steps_per_second: the recent training speed logged to TensorBoard.
    """

    epochs_done: int | None = None
    global_step: int | None = None
    steps_per_epoch: float | None = None
    max_epochs: int | None = None
    max_steps: int | None = None
    steps_per_second: float | None = None

    def steps_left(self) -> int | None:
        """Training steps until ``max_steps`` or ``max_epochs``, whichever comes first; None when unknown."""
        if self.global_step is None:
            return None
        limits = []
        if self.max_steps is not None:
            limits.append(self.max_steps)
        if self.max_epochs is not None and self.max_epochs >= 0 and self.steps_per_epoch is not None:
            limits.append(round(self.max_epochs * self.steps_per_epoch))
        return max(min(limits) - self.global_step, 0) if limits else None

    def describe(self, estimate: bool) -> str:
        """``epoch 3/300, step 1200, ~2h10m left``; with ``estimate`` false, or unknown parts, less of it."""
        parts = []
        if self.epochs_done is not None:
            parts.append(f"epoch {self.epochs_done}" + (f"/{self.max_epochs}" if self.max_epochs is not None else ""))
        if self.global_step is not None:
            parts.append(f"step {self.global_step}" + (f"/{self.max_steps}" if self.max_steps is not None else ""))
        left = self.steps_left()
        if estimate and left is not None and self.steps_per_second:
            parts.append(f"~{format_duration(left / self.steps_per_second)} left")
        return ", ".join(parts)


def format_duration(seconds: float) -> str:
    """``2h10m``, ``5m``, ``1d3h``, ``<1m``: a coarse duration."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return "<1m"
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    if days:
        return f"{days}d{hours}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"


def newest_checkpoint_position(folder: Path) -> tuple[int | None, int | None, float | None]:
    """``(epochs completed, global step, steps per epoch)`` of the newest readable ``*.ckpt`` in ``folder``.

    The checkpoint is memory-mapped (its tensors are not read). Epochs completed and steps per epoch come from
    Lightning's loop counters: a checkpoint saved at the end of an epoch (its last batch done) has completed
    ``epoch + 1`` epochs of ``global_step / (epoch + 1)`` steps; one saved within an epoch has completed ``epoch``
    epochs, whose steps are the global step less this epoch's. None where unknown (no checkpoint, no counters).
    """
    candidates = sorted(folder.glob("*.ckpt"), key=lambda path: path.stat().st_mtime_ns, reverse=True)
    for path in candidates:
        if checkpoint_problem(path) is not None:
            continue
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        step, epoch = int(checkpoint["global_step"]), checkpoint.get("epoch")
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        last_batch = fit_loop.get("epoch_loop.batch_progress", {}).get("is_last_batch")
        if not isinstance(epoch, int) or last_batch is None:
            return None, step, None
        if last_batch:
            return epoch + 1, step, step / (epoch + 1)
        this_epoch = _nested(fit_loop, "epoch_loop.automatic_optimization.optim_progress", "optimizer", "step")
        manual = _nested(fit_loop, "epoch_loop.manual_optimization.optim_step_progress", "total", "completed")
        if epoch == 0 or manual or not isinstance(this_epoch, dict):
            return epoch, step, None
        return epoch, step, (step - this_epoch["current"]["completed"]) / epoch
    return None, None, None


def _nested(mapping: dict, *keys: str) -> object:
    """``mapping[k1][k2]...``, or None where a key is missing."""
    for key in keys:
        if not isinstance(mapping, dict) or key not in mapping:
            return None
        mapping = mapping[key]
    return mapping


def saved_limits(config_path: Path) -> tuple[int | None, int | None]:
    """``(trainer.max_epochs, trainer.max_steps)`` of a run's saved ``config.yaml``; None where unset or unreadable."""
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None, None
    trainer = config.get("trainer") if isinstance(config, dict) else None
    if not isinstance(trainer, dict):
        return None, None
    max_epochs, max_steps = trainer.get("max_epochs"), trainer.get("max_steps")
    return (
        max_epochs if isinstance(max_epochs, int) and max_epochs >= 0 else None,
        max_steps if isinstance(max_steps, int) and max_steps >= 0 else None,
    )


def logged_steps_per_second(folder: Path) -> float | None:
    """Training steps per second from the wall times of the last logged ``train/*`` scalars in ``folder``.

    The median over the last :data:`RATE_INTERVALS` intervals of the most often logged ``train/`` scalar, so that
    the pause of a resumed run does not count; None without two such events.
    """
    if not any(folder.glob("events.out.tfevents.*")):
        return None
    from tensorboard.backend.event_processing import event_accumulator

    guidance = {event_accumulator.SCALARS: 1000, event_accumulator.TENSORS: 1, event_accumulator.IMAGES: 1}
    guidance |= {event_accumulator.HISTOGRAMS: 1, event_accumulator.AUDIO: 1}
    events = event_accumulator.EventAccumulator(str(folder), size_guidance=guidance)
    with quiet_loggers(["tensorboard"]):  # its INFO lines on reaching the end of a file
        events.Reload()
    tags = [tag for tag in events.Tags().get("scalars", []) if tag.startswith("train/")]
    if not tags:
        return None
    scalars = max((events.Scalars(tag) for tag in tags), key=len)[-(RATE_INTERVALS + 1) :]
    rates = [
        (after.step - before.step) / (after.wall_time - before.wall_time)
        for before, after in zip(scalars, scalars[1:], strict=False)
        if after.step > before.step and after.wall_time > before.wall_time
    ]
    return statistics.median(rates) if rates else None


@contextlib.contextmanager
def quiet_loggers(names: Sequence[str]) -> Iterator[None]:
    """Hide the messages below WARNING of the ``names`` loggers while the block runs."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def fit_progress(folder: Path) -> FitProgress:
    """What is known of the progress of the fit that logs into ``folder``."""
    epochs, step, steps_per_epoch = newest_checkpoint_position(folder / "checkpoints")
    max_epochs, max_steps = saved_limits(folder / "config.yaml")
    return FitProgress(epochs, step, steps_per_epoch, max_epochs, max_steps, logged_steps_per_second(folder))


def step_state(plan: Plan, run: PlannedRun, step_name: str, now: float | None = None) -> StepState:
    """The state of one step of one run (``now``: the time the heartbeat is judged at, default the current time)."""
    now = time.time() if now is None else now
    running = marker(run, step_name, "running")
    log = log_path(run, step_name)
    if marker(run, step_name, "done").is_file():
        state, detail = "done", f"finished {(read_marker(marker(run, step_name, 'done')) or {}).get('finished', '')}"
    elif running.is_file():
        info = read_marker(running) or {}
        holder = f"pid {info.get('pid', '?')} on {info.get('host', '?')}"
        job = info.get("SLURM_JOB_ID")
        holder += f" (SLURM job {job})" if job else ""
        age = now - running.stat().st_mtime
        if age > STALE_AFTER_S:
            state, detail = "interrupted", f"no heartbeat for {format_duration(age)} from {holder}; log {log}"
        elif _ended_here(info):
            state, detail = "interrupted", f"{holder} has ended without a word (killed); log {log}"
        else:
            state, detail = "running", holder
    elif marker(run, step_name, "failed").is_file():
        info = read_marker(marker(run, step_name, "failed")) or {}
        state, detail = "failed", f"exit status {info.get('rc', '?')}, log {info.get('log', log)}"
    elif log.is_file():
        state, detail = "interrupted", f"stopped before it finished; log {log}"
    else:
        state, detail = "not started", ""
    progress = ""
    if step_name == "fit" and state != "not started":
        progress = fit_progress(step_folder(plan, run, "fit")).describe(estimate=state in ("running", "interrupted"))
    return StepState(run.id, step_name, state, detail, progress)


def _ended_here(info: dict) -> bool:
    """Whether a ``.running`` marker names a process of this host that no longer runs.

    That is: gone, a zombie, or its id now belongs to a process that started after the marker was written.
    """
    pid = info.get("pid")
    if info.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    if not process_is_running(pid):
        return True
    started, marked = process_start_time(pid), info.get("started")
    if started is None or not isinstance(marked, str):
        return False
    try:
        return started > datetime.fromisoformat(marked).timestamp() + 2  # /proc start times: whole seconds
    except ValueError:
        return False


def step_states(plan: Plan) -> list[StepState]:
    """The state of every step of every run and seed, in plan order, with what SLURM's queue says of it."""
    now = time.time()
    queue = slurm_queue(plan)
    states = [step_state(plan, run, step.name, now) for run in plan.runs for step in plan.steps]
    return [with_queue(state, queue.get((state.run_id, state.step))) for state in states]


def slurm_queue(plan: Plan) -> dict[tuple[str, str], str]:
    """``(run id, step) -> what squeue says`` for a plan submitted to SLURM; {} for one that never was.

    When squeue cannot be asked (e.g. ``status`` runs where SLURM's commands are missing) the table shows the
    markers alone, and a warning says why.
    """
    from kpca.training.experiment.slurm import SlurmError, read_jobs, slurm_states

    try:
        return slurm_states(plan) if read_jobs(plan) else {}
    except SlurmError as error:
        logger.warning("kpca-experiment status: the SLURM queue is not shown: %s", error)
        return {}


def with_queue(state: StepState, queued: str | None) -> StepState:
    """``state`` with the queue's word on it: a step not started (or interrupted) whose job waits is ``queued``."""
    if queued is None or state.state in ("done", "failed"):
        return state
    if state.state == "running":
        return replace(state, detail=f"{state.detail}; {queued}")
    if queued.startswith("running on SLURM"):
        return replace(state, state="running", detail=queued)
    detail = queued if state.state == "not started" else f"{queued}; {state.detail}"
    return replace(state, state="queued", detail=detail)


def status_markdown(plan: Plan) -> str:
    """One Markdown table: run, step, state, detail, progress, for every run x step of the plan."""
    rows = [
        {"run": s.run_id, "step": s.step, "state": s.state, "detail": s.detail, "progress": s.progress}
        for s in step_states(plan)
    ]
    return markdown_table(rows)
