"""The SLURM executor: a plan's pending steps as sbatch job arrays, each later step after its run's fit.

:func:`submit_slurm` writes one sbatch script per step kind (and per group of runs, see below) under
``<plan.out>/.slurm/`` and submits it with plain ``sbatch --parsable``:

- the ``fit`` array holds the runs x seeds whose fit is pending (no ``fit.done``, and not queued or running in a job
  this executor submitted before); it carries ``--signal=USR1@120 --requeue --open-mode=append``, so Lightning's
  SLURM auto-requeue saves an hpc checkpoint and requeues the task, which reruns the same script with the same
  ``SLURM_ARRAY_TASK_ID`` and resumes (the fit runs with ``--ckpt_path auto``);
- every later step (``test``, ``analyze``, ...) is an array over its pending runs. Runs whose fit is submitted now
  (or still queued from an earlier submission) use the fit array's task indices and ``--dependency=aftercorr:<fit
  array>``: task i starts once fit task i has ended with status 0. Runs whose fit is already done form a separate
  array without a dependency;
- the report job (``python -m kpca.training.experiment report PLAN``) waits with ``afterany`` on every step job of
  the plan still in the queue.

Every job with a dependency is submitted with ``--kill-on-invalid-dep=yes``: without it (Slurm's default unless a
cluster sets ``DependencyParameters=kill_invalid_depend``) the test of a failed fit stays pending for ever
(``DependencyNeverSatisfied``), and the report, waiting on it with ``afterany``, never runs. With it Slurm cancels
that test, the report runs and names the failure, and the next submission submits the test again.

Each array task runs :func:`~kpca.training.experiment.plan.exec_command` for its run with ``launcher=["srun"]``,
chosen by ``$SLURM_ARRAY_TASK_ID`` from a bash array in the script. The scripts ``cd`` to the folder the plan was
submitted from (relative paths in a plan are relative to it) and call this process's Python interpreter by its
absolute path (they activate nothing). Submitted jobs are recorded in ``<plan.out>/.slurm/jobs.json``;
:func:`slurm_states` reads it with ``squeue`` to tell which steps are queued or running on SLURM.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kpca.training.errors import UserError
from kpca.training.experiment.plan import REPORT_JOB, Plan, PlanError, PlannedRun, exec_command
from kpca.training.experiment.steps import marker
from kpca.training.files import write_atomic

SLURM_FOLDER = ".slurm"
"""The folder under ``plan.out`` that holds the sbatch scripts, their output files and :data:`JOBS_FILE`."""
JOBS_FILE = "jobs.json"
"""The record of every job submitted for the plan (job id, step, array task -> run)."""
LAUNCHER = ("srun",)
"""What launches the app's processes inside a job: one task per process (per GPU), as Lightning expects."""
FIT_OPTIONS = ("--signal=USR1@120", "--requeue", "--open-mode=append")
"""The fit's extra sbatch options: SIGUSR1 to the tasks 120 s before the time limit (Lightning saves an hpc
checkpoint and runs ``scontrol requeue``), requeueing allowed, the output file appended to across requeues."""
RUN_WORD = '"${runs[$task]}"'
"""How the script's exec line names its run: the bash array entry of the array task."""
EXECUTOR_OPTIONS = {
    "job_name": "<plan>-<step>",
    "output": "<plan.out>/.slurm/%x-%A_%a.out",
    "array": "one task per pending run",
    "dependency": "aftercorr on the fit, afterany for the report",
    "signal": "USR1@120 for fit",
    "requeue": "on for fit",
    "no_requeue": "requeue is on for fit",
    "open_mode": "append for fit",
    "parsable": "the job id is read from sbatch's output",
    "chdir": "the scripts cd to the folder the plan was submitted from",
    "wrap": "the executor writes the script",
}
"""sbatch options the executor sets itself (a plan's ``slurm`` entry may not), with what it sets."""
POSITIVE_INTEGER_OPTIONS = ("nodes", "ntasks_per_node", "cpus_per_task", "ntasks")
SLURM_TIME = re.compile(r"(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2}|UNLIMITED|INFINITE)")
"""sbatch ``--time`` formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
GPUS = re.compile(r"([A-Za-z0-9_.-]+:)?\d+")
"""sbatch ``--gpus-per-node``: ``[type:]count``."""
OPTION_NAME = re.compile(r"[a-z][a-z0-9]*([_-][a-z0-9]+)*")
JOB_ID = re.compile(r"\d+")
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT"})
RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"})
COMMAND_TIMEOUT_S = 300.0
"""How long sbatch or squeue may take to answer (a busy controller is slow, not dead)."""
NEVER_SATISFIED = "DependencyNeverSatisfied"
"""squeue's reason for a job whose dependency failed (e.g. a test whose fit failed): it would wait forever."""


class SlurmError(UserError, RuntimeError):
    """sbatch or squeue failed, or the executor's record cannot be read: the message names the command or file."""

    exit_status = 4


@dataclass(frozen=True)
class SubmittedJob:
    """One sbatch job written (and, unless a dry run, submitted) by :func:`submit_slurm`.

    Attributes:
        step: the step name, or ``report``.
        script: the sbatch script.
        tasks: array task index -> run id (empty for the report job).
        dependency: the ``--dependency`` given to sbatch, or None.
        job_id: SLURM's job id (of the whole array); None in a dry run.
    """

    step: str
    script: Path
    tasks: Mapping[int, str]
    dependency: str | None
    job_id: str | None

    def __str__(self) -> str:
        """``test: job 124, array 0-3 (4 runs), aftercorr:123, <script>`` (no dependency: none shown)."""
        job = f"job {self.job_id}" if self.job_id is not None else "not submitted (dry run)"
        runs = f", array {array_spec(self.tasks)} ({len(self.tasks)} runs)" if self.tasks else ""
        after = f", {self.dependency}" if self.dependency else ""
        return f"{self.step}: {job}{runs}{after}, {self.script}"


@dataclass(frozen=True)
class QueuedTask:
    """A job (or array task) of the plan that squeue still lists.

    Attributes:
        job: the job as SLURM names it (``<array job>_<task>`` for array tasks).
        array_job: the job id of the whole array (the job itself when not an array).
        task: the array task index, or None.
        state: squeue's state (``PENDING``, ``RUNNING``, ...).
        reason: squeue's reason (e.g. ``Dependency``), "" when none.
    """

    job: str
    array_job: str
    task: int | None
    state: str
    reason: str

    @property
    def active(self) -> bool:
        """Whether it will still run (or runs): not a job whose dependency can never be satisfied."""
        return self.reason != NEVER_SATISFIED

    def describe(self) -> str:
        """``queued (job 123_4)``, ``running on SLURM (job 123_4)``, or another state in words."""
        if not self.active:
            return f"queued (job {self.job}) but its dependency failed: it will never start (scancel {self.job})"
        if self.state in QUEUED_STATES:
            return f"queued (job {self.job})"
        if self.state in RUNNING_STATES:
            return f"running on SLURM (job {self.job})"
        return f"{self.state.lower()} on SLURM (job {self.job})"


def slurm_folder(plan: Plan) -> Path:
    """``<plan.out>/.slurm``: the executor's scripts, job output files and record."""
    return plan.out / SLURM_FOLDER


def array_spec(indices: Iterable[int]) -> str:
    """The sbatch ``--array`` value of these task indices: ``0-3``, ``0,2-4``."""
    ordered = sorted(set(indices))
    ranges: list[list[int]] = []
    for index in ordered:
        if ranges and index == ranges[-1][1] + 1:
            ranges[-1][1] = index
        else:
            ranges.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def sbatch_options(plan: Plan, job: str) -> list[str]:
    """The ``--key=value`` sbatch options of the plan's ``slurm.<job>`` entry (``job``: a step name or ``report``).

    Keys are written with dashes (``ntasks_per_node`` -> ``--ntasks-per-node``); ``true`` writes a bare flag (e.g.
    ``exclusive: true`` -> ``--exclusive``). ``nodes``, ``ntasks``, ``ntasks_per_node`` and ``cpus_per_task`` must
    be positive integers, ``gpus_per_node`` ``[type:]count``, ``time`` a quoted sbatch time (``"72:00:00"``).

    Raises:
        PlanError: for an option the executor sets itself, a key or value sbatch would not read, naming the plan
            file, the key and the fix.
    """
    options = []
    for key, value in plan.slurm.get(job, {}).items():
        options.append(_sbatch_option(plan, f"slurm.{job}.{key}", key, value))
    return options


def _sbatch_option(plan: Plan, where: str, key: str, value: object) -> str:
    def error(problem: str, fix: str) -> PlanError:
        return PlanError(f"{plan.path}: {where}: {problem}; {fix}")

    if not OPTION_NAME.fullmatch(key):
        raise error(f"{key!r} is not an sbatch option name", "write the long option without dashes, e.g. cpus_per_task")
    name = key.replace("-", "_")
    if name in EXECUTOR_OPTIONS:
        raise error(f"the executor sets --{key.replace('_', '-')} itself ({EXECUTOR_OPTIONS[name]})", "remove this key")
    flag = "--" + key.replace("_", "-")
    if value is True:
        return flag
    if value is False:
        raise error("false is not an sbatch option value", f"leave the key out to leave {flag} unset")
    if name in POSITIVE_INTEGER_OPTIONS and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise error(f"{value!r} is not a positive integer", f"e.g. {key}: 1")
    if name == "time":
        if not isinstance(value, str):
            raise error(
                f"{value!r} is not a quoted time (YAML reads an unquoted 72:00:00 as the number 259200)",
                'quote it, e.g. time: "72:00:00" (or "1-00:00:00", or "30" for minutes)',
            )
        if not SLURM_TIME.fullmatch(value):
            raise error(
                f"{value!r} is not an sbatch time", 'use minutes, MM:SS, HH:MM:SS or D-HH:MM:SS, e.g. "4:00:00"'
            )
    if name == "gpus_per_node" and not GPUS.fullmatch(str(value)):
        raise error(f"{value!r} is not a GPU count", "e.g. gpus_per_node: 8 or gpus_per_node: a100:8")
    text = str(value)
    if not text or any(character.isspace() for character in text) or "'" in text or '"' in text:
        raise error(f"{text!r} cannot be written into an #SBATCH line (empty, blanks or quotes)", "give a plain value")
    return f"{flag}={text}"


def read_jobs(plan: Plan) -> list[dict]:
    """The jobs recorded in ``<plan.out>/.slurm/jobs.json`` (oldest first); [] when none were submitted.

    Raises:
        SlurmError: when the file is not the executor's record (naming it).
    """
    path = slurm_folder(plan) / JOBS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    try:
        jobs = json.loads(text)["jobs"]
        for job in jobs:
            job["job_id"], job["step"], job["tasks"] = str(job["job_id"]), str(job["step"]), dict(job["tasks"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise SlurmError(
            f"{path} is not a record of submitted jobs ({type(error).__name__}: {error}); if it was damaged, check "
            f"the queue (squeue --me) for this plan's jobs, cancel them, delete {path} and submit again"
        ) from error
    return jobs


def _record_job(plan: Plan, entry: dict) -> None:
    """Append ``entry`` to the jobs file (rewritten atomically)."""
    jobs = [*read_jobs(plan), entry]
    text = json.dumps({"plan": str(plan.path), "jobs": jobs}, indent=1) + "\n"
    write_atomic(slurm_folder(plan) / JOBS_FILE, lambda stream: stream.write(text), mode="w", encoding="utf-8")


def queued_jobs(plan: Plan, squeue: str = "squeue") -> dict[str, QueuedTask]:
    """What squeue lists of the plan's recorded jobs, by SLURM job name (``123_4`` for array tasks, ``125``).

    Nothing is asked when no job was recorded.

    Raises:
        SlurmError: when squeue is missing or fails for another reason than the jobs having left the queue.
    """
    ids = sorted({job["job_id"] for job in read_jobs(plan)}, key=int)
    if not ids:
        return {}
    command = [squeue, "--noheader", "--array", f"--jobs={','.join(ids)}", "--format=%i|%T|%r"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError as error:
        raise SlurmError(
            f"{squeue} not found: the SLURM executor asks squeue which of the plan's jobs are still queued; run on a "
            "machine with SLURM's commands (a login node)"
        ) from error
    except subprocess.TimeoutExpired as error:
        raise SlurmError(f"{shlex.join(command)} did not answer within {COMMAND_TIMEOUT_S:.0f} s") from error
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:  # none of them is known any more: all have left the queue
            return {}
        raise SlurmError(f"{shlex.join(command)} failed with status {done.returncode}: {done.stderr.strip()}")
    queued = {}
    for line in done.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3:
            continue
        job, state, reason = fields
        array_job, _, task = job.partition("_")
        queued[job] = QueuedTask(job, array_job, int(task) if task.isdigit() else None, state, reason)
    return queued


def _queued_steps(plan: Plan, queued: Mapping[str, QueuedTask]) -> dict[tuple[str, str], QueuedTask]:
    """``(run id, step) -> its queued array task``; the newest submission wins, an active task over a stuck one."""
    steps: dict[tuple[str, str], QueuedTask] = {}
    for job in read_jobs(plan):
        for task, run_id in job["tasks"].items():
            entry = queued.get(f"{job['job_id']}_{task}")
            if entry is None:
                continue
            key = (run_id, job["step"])
            if key not in steps or entry.active or not steps[key].active:
                steps[key] = entry
    return steps


def slurm_states(plan: Plan) -> dict[tuple[str, str], str]:
    """``(run id, step) -> "queued (job 123_4)"`` / ``"running on SLURM (job 123_4)"``: the plan's steps in the queue.

    Read from the jobs :func:`submit_slurm` recorded and ``squeue``; steps not in the queue are left out. A task
    whose dependency failed (its fit failed) says so: it never starts, and the next submission replaces it.

    Raises:
        SlurmError: when squeue is missing or fails.
    """
    return {key: task.describe() for key, task in _queued_steps(plan, queued_jobs(plan)).items()}


@dataclass
class _Array:
    """One array job to submit: a step over some runs by task index.

    ``after_fit`` is the fit array job whose task i its task i waits for (:data:`_NEW_FIT`: the fit submitted now;
    None: no dependency).
    """

    step: str
    tasks: dict[int, PlannedRun]
    after_fit: str | None = None


_NEW_FIT = "new"


def _plan_arrays(plan: Plan, queued_steps: Mapping[tuple[str, str], QueuedTask]) -> list[_Array]:
    """The arrays to submit for the steps that are neither done nor queued / running; the fit's first."""

    def pending(run: PlannedRun, step: str) -> bool:
        task = queued_steps.get((run.id, step))
        return not marker(run, step, "done").is_file() and (task is None or not task.active)

    step_names = [step.name for step in plan.steps]
    arrays = []
    fit_task: dict[str, tuple[str, int | None]] = {}  # run id -> (fit array job, task) of a fit that is not done
    if "fit" in step_names:
        fits = [run for run in plan.runs if pending(run, "fit")]
        if fits:
            arrays.append(_Array("fit", dict(enumerate(fits))))
        fit_task.update({run.id: (_NEW_FIT, index) for index, run in enumerate(fits)})
        for run in plan.runs:
            if run.id not in fit_task and not marker(run, "fit", "done").is_file():  # queued by an earlier submission
                queued = queued_steps[(run.id, "fit")]
                fit_task[run.id] = (queued.array_job, queued.task)
    for step in step_names:
        if step == "fit":
            continue
        groups: dict[str | None, dict[int, PlannedRun]] = {}
        for run in plan.runs:
            if not pending(run, step):
                continue
            if run.id in fit_task:
                fit_job, index = fit_task[run.id]
                groups.setdefault(fit_job, {})[index] = run
            else:  # its fit is done (or the plan has none)
                ready = groups.setdefault(None, {})
                ready[len(ready)] = run
        arrays.extend(_Array(step, tasks, after_fit) for after_fit, tasks in groups.items())
    return arrays


def _exec_line(plan: Plan, step: str, runs: Sequence[PlannedRun]) -> str:
    """The script's ``exec`` line: :func:`exec_command` of the array task's run, its run id read from ``runs``."""
    lines = set()
    for run in runs:
        words = [RUN_WORD if word == run.id else shlex.quote(word) for word in exec_command(plan, run, step, LAUNCHER)]
        lines.add(" ".join(words))
    if len(lines) != 1 or RUN_WORD not in next(iter(lines)):
        raise SlurmError(f"the exec commands of the {step} step do not differ in the run id alone: {sorted(lines)}")
    return "exec " + lines.pop()


def render_array_script(plan: Plan, array_tasks: Mapping[int, PlannedRun], step: str, cwd: Path) -> str:
    """The sbatch script of one array: #SBATCH lines, the task -> run bash array, the ``exec`` of that run's step."""
    folder = slurm_folder(plan)
    options = [
        f"--job-name={plan.name}-{step}",
        f"--output={folder}/%x-%A_%a.out",
        f"--array={array_spec(array_tasks)}",
        *sbatch_options(plan, step),
        *(FIT_OPTIONS if step == "fit" else ()),
    ]
    runs = "\n".join(f"    [{index}]={shlex.quote(run.id)}" for index, run in sorted(array_tasks.items()))
    ordered = [run for _, run in sorted(array_tasks.items())]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# Plan {plan.name} ({plan.path}), step {step}: array task i runs the step of runs[i] below through",
            "# `kpca-experiment exec` (a step already done exits at once). Written by kpca.training.experiment.slurm",
            f"# and submitted with `sbatch --parsable` and the dependency recorded in {folder / JOBS_FILE};",
            "# `kpca-experiment run <plan> --executor slurm` submits what is left; `sbatch --array=<i> <this file>`",
            "# resubmits one task.",
            *(f"#SBATCH {option}" for option in options),
            "set -euo pipefail",
            f"cd {shlex.quote(str(cwd))}",
            "# srun does not take --cpus-per-task from sbatch since SLURM 22.05: pass it on",
            'if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]]; then export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"; fi',
            "runs=(",
            runs,
            ")",
            'task="${SLURM_ARRAY_TASK_ID:?is not set: submit this script with sbatch, or set it to an index of runs}"',
            'if [[ -z "${runs[$task]+set}" ]]; then',
            '    echo "no run for array task $task: this script has tasks ${!runs[*]}" >&2',
            "    exit 2",
            "fi",
            _exec_line(plan, step, ordered),
            "",
        ]
    )


def render_report_script(plan: Plan, cwd: Path) -> str:
    """The sbatch script of the report job: ``python -m kpca.training.experiment report PLAN``."""
    options = [f"--job-name={plan.name}-{REPORT_JOB}", f"--output={slurm_folder(plan)}/%x-%j.out"]
    command = [sys.executable, "-m", "kpca.training.experiment", "report", str(plan.path)]
    command += [f"--override={override}" for override in plan.overrides]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# {plan.name}: the report of {plan.path} (kpca.training.experiment.slurm), after the plan's jobs.",
            *(f"#SBATCH {option}" for option in (*options, *sbatch_options(plan, REPORT_JOB))),
            "set -euo pipefail",
            f"cd {shlex.quote(str(cwd))}",
            "exec " + shlex.join(command),
            "",
        ]
    )


def _sbatch(sbatch: str, dependency: str | None, script: Path) -> str:
    """Submit ``script`` with ``sbatch --parsable`` (a dependency cancels the job if it can never be met); its id."""
    after = [f"--dependency={dependency}", "--kill-on-invalid-dep=yes"] if dependency else []
    command = [sbatch, "--parsable", *after, str(script)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError as error:
        raise SlurmError(f"{sbatch} not found: submit from a machine with SLURM's commands (a login node)") from error
    except subprocess.TimeoutExpired as error:
        raise SlurmError(f"{shlex.join(command)} did not answer within {COMMAND_TIMEOUT_S:.0f} s") from error
    lines = done.stdout.strip().splitlines()
    job_id = lines[-1].split(";")[0].strip() if lines else ""  # --parsable prints <job id>[;<cluster>]
    if done.returncode != 0 or not JOB_ID.fullmatch(job_id):
        raise SlurmError(
            f"{shlex.join(command)} failed (status {done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
        )
    return job_id


def submit_slurm(plan: Plan, *, sbatch: str = "sbatch", dry_run: bool = False) -> list[SubmittedJob]:
    """Submit every pending step of ``plan`` as sbatch job arrays, then its report job; return what was submitted.

    A step is pending when it has no ``.done`` marker and is not queued or running in a job submitted earlier
    (``jobs.json`` + ``squeue``), so running this again submits only what is left. See the module docstring for
    the arrays and their dependencies. The report job is submitted when the plan has a report, unless nothing else
    was submitted and an earlier report job is still queued. Each job is recorded in ``jobs.json`` as soon as
    sbatch accepts it.

    Args:
        plan: the plan.
        sbatch: the sbatch command.
        dry_run: write the scripts but submit nothing (no job ids; dependencies name the scripts they would wait
            for, e.g. ``aftercorr:<1-fit>``); squeue is still asked about the jobs submitted before.

    Raises:
        PlanError: for a plan's ``slurm`` entry sbatch would not take.
        SlurmError: when sbatch or squeue fails (jobs submitted before the failure stay recorded).
    """
    for job in plan.slurm:
        sbatch_options(plan, job)
    queued = queued_jobs(plan)
    arrays = _plan_arrays(plan, _queued_steps(plan, queued))
    earlier = read_jobs(plan)
    submission = 1 + max((int(job.get("submission", 0)) for job in earlier), default=0)
    active_jobs = {task.array_job for task in queued.values() if task.active}
    active_earlier = [job["job_id"] for job in earlier if job["job_id"] in active_jobs and job["step"] != REPORT_JOB]
    report_queued = any(job["step"] == REPORT_JOB and job["job_id"] in active_jobs for job in earlier)
    cwd = Path.cwd()
    folder = slurm_folder(plan)
    folder.mkdir(parents=True, exist_ok=True)
    submitted: list[SubmittedJob] = []
    fit_job: str | None = None
    names: dict[str, int] = {}

    def submit(step: str, text: str, tasks: Mapping[int, PlannedRun], dependency: str | None) -> str:
        names[step] = names.get(step, 0) + 1
        suffix = "" if names[step] == 1 else f"-{names[step]}"
        script = folder / f"{submission}-{step}{suffix}.sbatch"
        write_atomic(script, lambda stream: stream.write(text), mode="w", encoding="utf-8")
        job_id = None if dry_run else _sbatch(sbatch, dependency, script)
        run_ids = {index: run.id for index, run in sorted(tasks.items())}
        submitted.append(SubmittedJob(step, script, run_ids, dependency, job_id))
        if job_id is None:
            return f"<{script.stem}>"
        _record_job(
            plan,
            {
                "submission": submission, "submitted": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "step": step, "job_id": job_id, "script": str(script), "cwd": str(cwd),
                "tasks": {str(index): run_id for index, run_id in run_ids.items()}, "dependency": dependency,
            },
        )  # fmt: skip
        return job_id

    for array in arrays:
        dependency = None
        if array.after_fit is not None:
            dependency = f"aftercorr:{fit_job if array.after_fit == _NEW_FIT else array.after_fit}"
        job_id = submit(array.step, render_array_script(plan, array.tasks, array.step, cwd), array.tasks, dependency)
        if array.step == "fit":
            fit_job = job_id
    if plan.report is not None and (submitted or not report_queued):
        waits = [*active_earlier, *(job.job_id or f"<{job.script.stem}>" for job in submitted)]
        submit(REPORT_JOB, render_report_script(plan, cwd), {}, "afterany:" + ":".join(waits) if waits else None)
    return submitted
