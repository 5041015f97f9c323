"""Helpers of the tests against the local Slurm: its job records, the queue, waiting, what to print on failure."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCAL_SLURM = REPO / "docker" / "local_slurm.sh"
CONF = Path("/etc/slurm/slurm.conf")
MARK = "# Written by kpca docker/local_slurm.sh"
FIELD = re.compile(r"(\w+)=(\S*)")


def node_state() -> str:
    """sinfo's state of the local partition's node ("" when no Slurm answers)."""
    try:
        done = subprocess.run(
            ["sinfo", "--noheader", "--partition=local", "--format=%T"], capture_output=True, text=True, timeout=10
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""


def command_output(*command: str) -> str:
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        return f"$ {' '.join(command)}: {error}\n"
    return f"$ {' '.join(command)}\n{done.stdout}{done.stderr}"


@dataclass
class LocalSlurm:
    """The local Slurm of docker/local_slurm.sh; ``state`` holds its logs and jobcomp.txt (finished jobs)."""

    state: Path

    def finished(self) -> list[dict[str, str]]:
        """One dict per finished job (array task) from jobcomp.txt: JobId, JobState, StartTime, ArrayJobId, ..."""
        path = self.state / "jobcomp.txt"
        if not path.is_file():
            return []
        return [dict(FIELD.findall(line)) for line in path.read_text().splitlines() if line.strip()]

    def finished_tasks(self, array_job: str) -> dict[int, list[dict[str, str]]]:
        """The finished runs of each task of ``array_job`` (a requeued task has several), oldest first."""
        tasks: dict[int, list[dict[str, str]]] = {}
        for job in self.finished():
            if job.get("ArrayJobId") == array_job:
                tasks.setdefault(int(job["ArrayTaskId"]), []).append(job)
            elif job.get("JobId") == array_job and job.get("ArrayTaskId", "4294967294") == "4294967294":
                tasks.setdefault(-1, []).append(job)  # not an array
        return tasks

    def queue(self, jobs: Iterable[str]) -> dict[str, tuple[str, str]]:
        """squeue's ``job -> (state, reason)`` of these jobs (array tasks one by one); {} when all have left."""
        ids = ",".join(jobs)
        done = subprocess.run(
            ["squeue", "--noheader", "--array", f"--jobs={ids}", "--format=%i|%T|%r"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return {}
            raise AssertionError(f"squeue failed: {done.stderr}")
        entries = (line.split("|") for line in done.stdout.split())
        return {job: (state, reason) for job, state, reason in entries}

    def diagnostics(self, *folders: Path) -> str:
        """squeue, the finished jobs, the daemons' log tails and every job output / step log under ``folders``."""
        parts = [command_output("squeue", "--all"), command_output("sinfo")]
        parts.append("the last finished jobs (jobcomp.txt; no accounting database, so no sacct):\n")
        parts += [
            " ".join(f"{key}={job.get(key, '')}" for key in ("JobId", "ArrayJobId", "ArrayTaskId", "Name", "JobState",
                                                             "StartTime", "EndTime", "ExitCode")) + "\n"
            for job in self.finished()[-40:]
        ]  # fmt: skip
        for log in ("slurmctld.log", "slurmd.log"):
            path = self.state / log
            if path.is_file():
                parts.append(f"--- {path} (last lines)\n" + "\n".join(path.read_text().splitlines()[-15:]) + "\n")
        for folder in folders:
            for path in sorted([*folder.rglob("*.out"), *folder.rglob("*.log")]):
                parts.append(f"--- {path} (last lines)\n" + "\n".join(path.read_text().splitlines()[-25:]) + "\n")
        return "".join(parts)

    def wait(self, condition: Callable[[], bool], what: str, timeout_s: float, *folders: Path) -> None:
        """Poll ``condition`` every 0.5 s; fail with the diagnostics after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout_s:.0f} s: {what}\n{self.diagnostics(*folders)}")
            time.sleep(0.5)

    def release_requeued(self, job: str) -> bool:
        """Start a requeued job now: Slurm holds a requeued job back for 2 minutes (reason BeginTime).

        Returns whether ``job`` was waiting for its begin time (and is released).
        """
        if self.queue([job]).get(job, ("", ""))[1] != "BeginTime":
            return False
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=30)
        return True
