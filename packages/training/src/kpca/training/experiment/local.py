"""The local executor: every pending step of every run of a plan, one after another on this machine.

Each step runs as its own process, ``kpca-experiment exec`` (:func:`kpca.training.experiment.plan.exec_command`),
so a step killed midway leaves the markers that the next run of the plan reads: done steps are skipped, an
interrupted fit resumes from its newest checkpoint. A failed step stops the rest of its run (they need its
checkpoint); the other runs go on. The plan's report is written at the end; a plan without a ``report`` section gets
a line saying how to get one.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

from kpca.training.experiment.plan import Plan, exec_command
from kpca.training.experiment.report import missing_report_note, write_plan_report
from kpca.training.experiment.status import status_markdown
from kpca.training.experiment.steps import ENDING_SIGNALS, SignalForwarder, log_path, marker
from kpca.training.experiment.warm_start import warm_interpreter

INTERRUPTED = tuple(128 + signum for signum in ENDING_SIGNALS)
"""Exit statuses of a step ended by SIGTERM or SIGINT: the plan stops there."""


def run_local(plan: Plan) -> int:
    """Run every step of ``plan`` that is not done, run by run, then write its report (or say how to get one).

    Returns:
        0 when every step is done, 1 when a step failed (the failed steps' logs are named on stderr), or the
        status of a step ended by SIGTERM / SIGINT (143 / 130), which stops the plan before its report.
    """
    pending = [
        (run, step.name) for run in plan.runs for step in plan.steps if not marker(run, step.name, "done").is_file()
    ]
    failed = []
    with warm_interpreter(plan.app) if pending else contextlib.nullcontext():
        for index, (run, step_name) in enumerate(pending, start=1):
            if any(run is failed_run for failed_run, _ in failed):
                continue
            _say(f"[{index}/{len(pending)}] {run.id} {step_name} (log: {log_path(run, step_name)})")
            returncode = _run_step(exec_command(plan, run, step_name))
            if returncode in INTERRUPTED:
                _say(f"{run.id} {step_name} was interrupted; run the same command again to continue")
                return returncode
            if returncode != 0:
                _say(f"{run.id} {step_name} FAILED (exit status {returncode}); its later steps are skipped")
                failed.append((run, step_name))
    _say(status_markdown(plan))
    _say(f"report: {write_plan_report(plan)}" if plan.report is not None else missing_report_note(plan))
    if failed:
        logs = "\n".join(f"  {run.id} {step_name}: {log_path(run, step_name)}" for run, step_name in failed)
        _say(f"{len(failed)} step(s) failed; their logs:\n{logs}")
        return 1
    return 0


def _run_step(command: list[str]) -> int:
    """Run one step's process; SIGTERM to this process reaches it (and the app), which ends it as interrupted."""
    child = subprocess.Popen(command)
    with SignalForwarder(child) as forwarder:
        returncode = child.wait()
    return 128 + forwarder.ending if forwarder.ending is not None else returncode


def _say(text: str) -> None:
    """Print a progress line of the runner (stderr, flushed: the steps' own output goes to their logs)."""
    print(text, file=sys.stderr, flush=True)
