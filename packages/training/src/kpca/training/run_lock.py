"""One writer per run folder: a lock file that names the process holding it, taken over once that process is gone.

The lock file holds the holder's process id, host, start time, command line and SLURM job (JSON). It is created
with ``O_CREAT | O_EXCL``, so of two processes exactly one creates it, and removed when the holder releases it (at
the end of the run, or when it fails). A process killed with SIGKILL, or a node that died, leaves it behind; such a
*stale* lock is taken over with a warning. A lock is stale when:

- it was written by this SLURM job (``SLURM_JOB_ID``, or ``SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID``): the job was
  requeued, possibly onto another node, and its earlier incarnation is over;
- it was written on this host by a process that is no longer running (or whose id now belongs to a process that
  started after the lock was written: the id was reused);
- it was written on another host, whose liveness cannot be asked, and its holder has not refreshed it for
  :data:`STALE_AFTER_S` seconds: the holder touches the file every :data:`HEARTBEAT_S` seconds while it runs.

Taking over renames the stale file aside and checks that it moved the file it judged, so that of two processes
taking over the same stale lock at once exactly one wins.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shlex
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kpca.training.errors import UserError

logger = logging.getLogger(__name__)

HEARTBEAT_S = 60.0
"""How often a holder refreshes its lock file's modification time."""
STALE_AFTER_S = 600.0
"""A lock from another host whose file was not refreshed for this long is stale (its holder is gone)."""
_READ_ATTEMPTS = 10
_READ_PAUSE_S = 0.05
_TAKEOVER_ATTEMPTS = 5
_HELD_TOKENS: set[str] = set()
"""Tokens of the locks this process holds: such a lock is never stale to this process."""


class RunFolderLockedError(UserError, RuntimeError):
    """Another process holds the lock of a run folder; the message names it and the ways out."""

    exit_status = 4


def slurm_job_id() -> str | None:
    """This process's SLURM job (``<array job>_<task>`` for array jobs, as ``scontrol requeue`` takes it), or None."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job is not None and "SLURM_ARRAY_TASK_ID" in os.environ:
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


@dataclass(frozen=True)
class LockOwner:
    """Who holds a lock.

    Attributes:
        pid: the holder's process id.
        host: the holder's host name.
        started: when the lock was taken (seconds since the epoch).
        command: the holder's command line.
        slurm_job_id: the holder's SLURM job, or None outside SLURM.
        token: random characters that tell this lock from any other.
    """

    pid: int
    host: str
    started: float
    command: str
    slurm_job_id: str | None
    token: str

    @classmethod
    def this_process(cls) -> LockOwner:
        """This process as a lock holder, with a fresh token."""
        return cls(
            pid=os.getpid(),
            host=socket.gethostname(),
            started=time.time(),
            command=shlex.join(sys.argv),
            slurm_job_id=slurm_job_id(),
            token=secrets.token_hex(8),
        )

    def to_json(self) -> str:
        """The lock file's content."""
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> LockOwner:
        """Parse a lock file's content; ValueError (or TypeError, KeyError) when it is not one."""
        fields = json.loads(text)
        return cls(
            pid=int(fields["pid"]),
            host=str(fields["host"]),
            started=float(fields["started"]),
            command=str(fields["command"]),
            slurm_job_id=None if fields["slurm_job_id"] is None else str(fields["slurm_job_id"]),
            token=str(fields["token"]),
        )

    def describe(self) -> str:
        """``process 123 on node7, started 2026-12-03 10:00:01 (SLURM job 42): <command>``."""
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.started))
        job = f" (SLURM job {self.slurm_job_id})" if self.slurm_job_id else ""
        return f"process {self.pid} on {self.host}, started {started}{job}: {self.command}"


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, to about a second), from ``/proc``; None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
    except (OSError, StopIteration):
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (command)": field 3 (state) is fields[0]
    return int(boot.split()[1]) + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in clock ticks


def process_is_running(pid: int) -> bool:
    """Whether process ``pid`` exists on this host and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def stale_reason(owner: LockOwner, refreshed: float, now: float | None = None) -> str | None:
    """Why the lock of ``owner``, last refreshed at ``refreshed``, is stale; None while its holder may be running.

    See the module docstring for the rules.
    """
    if owner.token in _HELD_TOKENS:
        return None
    job = slurm_job_id()
    if job is not None and owner.slurm_job_id == job:
        return f"it was written by this SLURM job ({job}) before the job was requeued"
    if owner.host == socket.gethostname():
        if owner.pid == os.getpid():
            return f"its process id {owner.pid} is this process's: an earlier process with the same id left it"
        if not process_is_running(owner.pid):
            return f"process {owner.pid} is not running on {owner.host}"
        started = process_start_time(owner.pid)
        if started is not None and started > owner.started + 2:  # /proc start times are whole seconds of boot time
            return f"process {owner.pid} started after the lock was written (the process id was reused)"
        return None
    age = (time.time() if now is None else now) - refreshed
    if age > STALE_AFTER_S:
        return (
            f"its holder on another host ({owner.host}) has not refreshed it for {age:.0f} s (a running holder does "
            f"every {HEARTBEAT_S:.0f} s)"
        )
    return None


class RunLock:
    """The lock file ``path``, held from :meth:`acquire` (or ``with``) to :meth:`release`.

    Args:
        path: the lock file (its folder is created).
        what: what the lock protects, for messages (e.g. ``the run folder runs/exp/version_0``).
        ways_out: what the user can do instead of waiting, appended to the error (e.g. the options that start a
            new run folder).
    """

    def __init__(self, path: Path, what: str, ways_out: str = "") -> None:
        self.path = Path(path)
        self.what = what
        self.ways_out = ways_out
        self.owner: LockOwner | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, taking over a stale one with a warning.

        Raises:
            RunFolderLockedError: If a running process holds it; the message names that process and the ways out.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = LockOwner.this_process()
        for _ in range(_TAKEOVER_ATTEMPTS):
            if self._create(me):
                self.owner = me
                _HELD_TOKENS.add(me.token)
                self._start_heartbeat()
                return
            found = self._read()
            if found is None:  # released meanwhile
                continue
            raw, owner, refreshed = found
            reason = self._unreadable_reason(refreshed) if owner is None else stale_reason(owner, refreshed)
            if reason is None:
                raise RunFolderLockedError(self._held_message(owner))
            if self._remove_stale(raw):
                held_by = owner.describe() if owner is not None else "an unreadable lock"
                logger.warning("taking over the stale lock %s of %s: %s", self.path, held_by, reason)
        raise RunFolderLockedError(
            f"Could not take {self.path}: other processes kept replacing it. Is another run starting on {self.what}?"
        )

    def release(self) -> None:
        """Stop refreshing the lock and remove its file if it is still this lock's (nothing if not held)."""
        if self.owner is None:
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        found = self._read()
        if found is not None and found[1] is not None and found[1].token == self.owner.token:
            self.path.unlink(missing_ok=True)
        else:
            logger.warning("the lock %s is no longer this process's (another process replaced it): left", self.path)
        _HELD_TOKENS.discard(self.owner.token)
        self.owner = None

    def _create(self, me: LockOwner) -> bool:
        """Create the lock file holding ``me``; False when it exists."""
        try:
            handle = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(me.to_json())
            stream.flush()
            os.fsync(stream.fileno())
        return True

    def _read(self) -> tuple[bytes, LockOwner | None, float] | None:
        """``(content, owner or None if unreadable, modification time)`` of the lock file; None when it is gone.

        A file that does not parse is read again a few times: its creator may be writing it.
        """
        for _ in range(_READ_ATTEMPTS):
            try:
                raw, refreshed = self.path.read_bytes(), self.path.stat().st_mtime
            except FileNotFoundError:
                return None
            try:
                return raw, LockOwner.from_json(raw.decode("utf-8")), refreshed
            except (ValueError, TypeError, KeyError):
                time.sleep(_READ_PAUSE_S)
        return raw, None, refreshed

    def _unreadable_reason(self, refreshed: float) -> str | None:
        """A lock file that never parsed is stale once it is as old as a dead holder's (:data:`STALE_AFTER_S`)."""
        age = time.time() - refreshed
        return f"it is unreadable and {age:.0f} s old" if age > STALE_AFTER_S else None

    def _remove_stale(self, raw: bytes) -> bool:
        """Remove the lock file if it still holds ``raw``; False when another process changed it first.

        The file is renamed aside, then compared: a process that renamed a fresh lock (taken over meanwhile by
        another) puts it back.
        """
        aside = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.stale")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        if aside.read_bytes() == raw:
            aside.unlink()
            return True
        with contextlib.suppress(FileExistsError):  # a third process took the place meanwhile
            os.link(aside, self.path)  # put the other process's lock back
        aside.unlink()
        return False

    def _held_message(self, owner: LockOwner | None) -> str:
        if owner is None:
            holder = f"{self.path} exists but is unreadable (a process may be creating it)"
            stop = f"If no process uses {self.what}, delete {self.path}."
        else:
            holder = f"{self.path} is held by {owner.describe()}"
            stop = (
                f"Wait for it to end, or stop it (kill {owner.pid} on {owner.host}). If that process is gone but the "
                f"lock stayed, delete {self.path}."
            )
        return f"Another process is writing into {self.what}: {holder}. {stop} {self.ways_out}".rstrip()

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, name=f"heartbeat of {self.path}", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        """Refresh the lock file's modification time every :data:`HEARTBEAT_S` seconds until released."""
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError as error:
                logger.warning("could not refresh the lock %s: %s", self.path, error)
