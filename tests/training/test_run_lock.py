"""RunLock: one holder per lock file, named when refused; stale locks taken over with a warning; one winner per race."""

import logging
import multiprocessing
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kpca.training import run_lock
from kpca.training.run_lock import (
    STALE_AFTER_S,
    LockOwner,
    RunFolderLockedError,
    RunLock,
    process_start_time,
    slurm_job_id,
)

WAYS_OUT = "Or pass --ckpt_path null."
SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")


@pytest.fixture(autouse=True)
def outside_slurm(monkeypatch):
    for name in SLURM_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "exp" / "version_0" / "fit.lock"


@pytest.fixture
def dead_pid() -> int:
    """The id of a process that has ended (and was reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


@pytest.fixture
def running_pid():
    """The id of a process that runs during the test."""
    process = subprocess.Popen(["sleep", "60"])
    yield process.pid
    process.kill()
    process.wait()


def write_lock(path: Path, pid: int, host: str | None = None, started: float | None = None, job: str | None = None):
    """A lock file as another process writes it (that process is ``pid`` on ``host``)."""
    owner = LockOwner(
        pid=pid, host=host or socket.gethostname(), started=time.time() if started is None else started,
        command="vision-cls fit -c run.yaml --ckpt_path auto", slurm_job_id=job, token="0123456789abcdef",
    )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(owner.to_json(), encoding="utf-8")
    return owner


def age(path: Path, seconds: float) -> None:
    """Make the lock file look last refreshed ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def take(path: Path) -> RunLock:
    lock = RunLock(path, "the run folder", WAYS_OUT)
    lock.acquire()
    return lock


def assert_refused(path: Path, owner: LockOwner) -> str:
    before = path.read_bytes()
    with pytest.raises(RunFolderLockedError) as error:
        take(path)
    message = str(error.value)
    for part in (str(path), str(owner.pid), owner.host, owner.command, f"kill {owner.pid}", WAYS_OUT):
        assert part in message
    assert path.read_bytes() == before  # the holder's lock is untouched
    return message


def test_acquire_writes_the_holder_and_release_removes_the_file(lock_path: Path):
    lock = take(lock_path)
    owner = LockOwner.from_json(lock_path.read_text(encoding="utf-8"))
    assert (owner.pid, owner.host, owner.slurm_job_id) == (os.getpid(), socket.gethostname(), None)
    assert owner.command == shlex.join(sys.argv)
    assert abs(owner.started - time.time()) < 60
    lock.release()
    assert not lock_path.exists()
    with RunLock(lock_path, "the run folder"):  # taken again once released
        assert lock_path.is_file()
    assert not lock_path.exists()


def test_release_on_an_exception(lock_path: Path):
    with pytest.raises(KeyError), RunLock(lock_path, "the run folder"):
        raise KeyError("the fit failed")
    assert not lock_path.exists()


def test_a_lock_of_a_running_process_on_this_host_is_refused_naming_it(lock_path: Path, running_pid: int):
    owner = write_lock(lock_path, running_pid, started=time.time() + 5)  # written after the process started
    assert "started" in assert_refused(lock_path, owner)


def test_a_lock_held_in_this_process_is_refused(lock_path: Path):
    first = take(lock_path)
    try:
        assert_refused(lock_path, first.owner)
    finally:
        first.release()


def test_a_lock_of_a_dead_process_is_taken_over_with_a_warning(lock_path: Path, dead_pid: int, caplog):
    write_lock(lock_path, dead_pid)
    with caplog.at_level(logging.WARNING, logger="kpca.training.run_lock"):
        lock = take(lock_path)
    assert LockOwner.from_json(lock_path.read_text(encoding="utf-8")).pid == os.getpid()
    (record,) = [r for r in caplog.records if "stale" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert str(lock_path) in record.getMessage() and f"process {dead_pid} is not running" in record.getMessage()
    lock.release()
    assert sorted(p.name for p in lock_path.parent.iterdir()) == []  # nothing left aside


def test_a_reused_process_id_is_stale(lock_path: Path, running_pid: int, caplog):
    assert process_start_time(running_pid) is not None
    write_lock(lock_path, running_pid, started=time.time() - 3600)  # its process died; the id went to a new one
    with caplog.at_level(logging.WARNING, logger="kpca.training.run_lock"):
        take(lock_path).release()
    assert "the process id was reused" in caplog.text


def test_a_lock_with_this_process_id_from_an_earlier_process_is_stale(lock_path: Path, caplog):
    write_lock(lock_path, os.getpid())  # e.g. a restarted container: the new process got the same id
    with caplog.at_level(logging.WARNING, logger="kpca.training.run_lock"):
        take(lock_path).release()
    assert "an earlier process with the same id" in caplog.text


def test_a_lock_from_another_host_is_held_while_refreshed(lock_path: Path, caplog):
    owner = write_lock(lock_path, 4242, host="node-b")
    age(lock_path, STALE_AFTER_S - 60)
    assert_refused(lock_path, owner)
    age(lock_path, STALE_AFTER_S + 60)
    with caplog.at_level(logging.WARNING, logger="kpca.training.run_lock"):
        take(lock_path).release()
    assert "another host (node-b) has not refreshed it" in caplog.text


def test_a_lock_of_this_slurm_job_is_taken_over_after_a_requeue(lock_path: Path, monkeypatch, caplog):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    other_job = write_lock(lock_path, 77, host="node-b", job="4243")
    assert "SLURM job 4243" in assert_refused(lock_path, other_job)
    write_lock(lock_path, 77, host="node-b", job="4242")  # this job, before its requeue onto another node
    with caplog.at_level(logging.WARNING, logger="kpca.training.run_lock"):
        lock = take(lock_path)
    assert "this SLURM job (4242)" in caplog.text
    assert LockOwner.from_json(lock_path.read_text(encoding="utf-8")).slurm_job_id == "4242"
    lock.release()


def test_slurm_array_jobs_are_named_as_scontrol_takes_them(monkeypatch):
    assert slurm_job_id() is None
    monkeypatch.setenv("SLURM_JOB_ID", "4250")
    assert slurm_job_id() == "4250"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    assert slurm_job_id() == "4242_7"


def test_an_unreadable_lock_is_held_while_young_and_stale_when_old(lock_path: Path, caplog):
    lock_path.parent.mkdir(parents=True)
    lock_path.write_bytes(b"")
    with pytest.raises(RunFolderLockedError, match="unreadable"):
        take(lock_path)
    age(lock_path, STALE_AFTER_S + 60)
    with caplog.at_level(logging.WARNING, logger="kpca.training.run_lock"):
        take(lock_path).release()
    assert "unreadable lock" in caplog.text


def test_the_holder_refreshes_its_lock(lock_path: Path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    lock = take(lock_path)
    age(lock_path, 3600)
    deadline = time.monotonic() + 10
    while time.time() - lock_path.stat().st_mtime > 60 and time.monotonic() < deadline:
        time.sleep(0.05)
    lock.release()
    assert time.monotonic() < deadline, "the lock file was not refreshed"


def test_release_leaves_a_lock_that_another_process_took(lock_path: Path, caplog):
    lock = take(lock_path)
    write_lock(lock_path, 4242, host="node-b")
    with caplog.at_level(logging.WARNING, logger="kpca.training.run_lock"):
        lock.release()
    assert lock_path.is_file() and "no longer this process's" in caplog.text


def _race(path: str, start, tried, results) -> None:
    """One contender: take the lock at the same time as the others; the winner holds it until all have tried."""
    lock = RunLock(Path(path), "the run folder")
    start.wait()
    try:
        lock.acquire()
    except RunFolderLockedError:
        results.put("refused")
        tried.wait()
        return
    results.put("won")
    tried.wait()
    lock.release()


@pytest.mark.parametrize("round_", range(2))
def test_of_processes_taking_over_one_stale_lock_at_once_exactly_one_wins(lock_path: Path, dead_pid: int, round_):
    write_lock(lock_path, dead_pid)
    context = multiprocessing.get_context("fork")
    start, tried, results = context.Barrier(4), context.Barrier(4), context.Queue()
    contenders = [context.Process(target=_race, args=(str(lock_path), start, tried, results)) for _ in range(4)]
    for process in contenders:
        process.start()
    outcomes = sorted(results.get(timeout=60) for _ in contenders)
    for process in contenders:
        process.join(timeout=60)
    assert outcomes == ["refused", "refused", "refused", "won"]
    assert not lock_path.exists()  # the winner released it
    assert list(lock_path.parent.iterdir()) == []  # no file left aside
