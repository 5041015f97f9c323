"""The cluster launch scripts on CPU, as real processes: torchrun across two "nodes" on localhost (c10d rendezvous,
worker-group restarts resuming with ``--ckpt_path auto``) and a SLURM job requeued by Lightning and rerun.

SLURM is stood in for by its environment variables, an ``srun`` that runs its arguments and an ``scontrol`` that
records its arguments and then ends the task as ``scontrol requeue`` does (SIGTERM).
"""

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from tests.cli_support import CONFIGS, free_port, smoke_options

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds and ends processes through /proc"),
]

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = REPO / "docker" / "launch_torchrun.sh"
SLURM = REPO / "docker" / "launch_slurm.sh"
SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
TIMEOUT = 300.0
TAG = "KPCA_TEST_CLUSTER_RUN"
"""Environment variable marking the processes of one test, so that cleanup finds them all."""
RESTORED = re.compile(r"auto resume: restoring (\S+) \(step (\d+)\)")
# What a launcher or scheduler around pytest may have set: the runs here must see only their own.
LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK")
LAUNCH_VARIABLES += ("GROUP_RANK", "NNODES", "NPROC_PER_NODE", "RDZV_ID", "MAX_RESTARTS")


@pytest.fixture(scope="module")
def digits_cache(digits_cache_dir: Path) -> Path:
    """The session's digits tree (tests/conftest.py): read only."""
    return digits_cache_dir


def clean_env(**variables: str) -> dict[str, str]:
    """This environment without launcher / SLURM variables, the venv's bin first on PATH, hubs offline, tagged."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in LAUNCH_VARIABLES and not key.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1", **{TAG: uuid.uuid4().hex})
    env.update(variables)
    return env


def start(command: list[object], env: dict[str, str], cwd: Path, log: str) -> subprocess.Popen:
    """Start ``command`` in its own process group, stdout and stderr into ``cwd/<log>.out`` / ``.err``."""
    with open(cwd / f"{log}.out", "w") as out, open(cwd / f"{log}.err", "w") as err:
        return subprocess.Popen(
            [str(part) for part in command], cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True
        )


def stderr_of(cwd: Path, log: str) -> str:
    return (cwd / f"{log}.err").read_text(errors="replace")


def kill_all(processes: list[subprocess.Popen], env: dict[str, str]) -> None:
    """SIGKILL what is left of a test's processes: their process groups, and every process that carries the test's
    tag in its environment (torchrun starts its workers in sessions of their own; they outlive a killed torchrun)."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    tag = f"{TAG}={env[TAG]}".encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):
            if tag in environ.read_bytes().split(b"\0"):
                os.kill(int(environ.parent.name), signal.SIGKILL)
    for process in processes:
        process.wait()


def wait_until(condition: Callable[[], bool], what: str, watched: dict[str, subprocess.Popen], cwd: Path) -> None:
    """Poll ``condition``; fail naming ``what`` (with the logs' tails) on timeout or when a watched process exits."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        ended = {log: process.returncode for log, process in watched.items() if process.poll() is not None}
        if (ended or time.monotonic() > deadline) and not condition():  # it may have happened just before the exit
            tails = "\n".join(f"--- {log}.err:\n{stderr_of(cwd, log)[-3000:]}" for log in watched)
            reason = f"exited with {ended}" if ended else f"did not happen within {TIMEOUT:.0f} s"
            pytest.fail(f"waiting for {what}: {reason}\n{tails}")
        time.sleep(0.02)


def wait_all(processes: dict[str, subprocess.Popen], cwd: Path) -> None:
    """Wait for every process to end (within TIMEOUT in all); fail with the logs' tails if any exit is not 0."""
    deadline = time.monotonic() + TIMEOUT
    for process in processes.values():
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            break
    codes = {log: process.poll() for log, process in processes.items()}
    if any(code != 0 for code in codes.values()):
        tails = "\n".join(f"--- {log}.err:\n{stderr_of(cwd, log)[-3000:]}" for log in processes)
        pytest.fail(f"exit codes {codes} (None: still running after {TIMEOUT:.0f} s)\n{tails}")


def children(pid: int) -> list[int]:
    """The process ids whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found.append(int(stat.parent.name))
    return found


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def run_folders(root: Path) -> list[str]:
    return sorted(folder.name for folder in (root / "runs" / "lightning_logs").iterdir())


def torchrun_nodes(tmp_path: Path, cache: Path, *extra: object) -> tuple[list[list[object]], dict[str, str], Path]:
    """Two torchrun commands (one process per "node") of a CPU DDP vision fit, their environment and root."""
    root = tmp_path / "root"
    fit = [
        "bash", TORCHRUN, "vision_cls", "fit", *smoke_options(SMOKE, root, cache),
        "--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.limit_val_batches=1", *extra,
    ]  # fmt: skip
    port = free_port()
    env = clean_env(NNODES="2", NPROC_PER_NODE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env["RDZV_ID"] = f"kpca-test-{os.getpid()}-{port}"
    return [fit, fit], env, root


def test_torchrun_two_nodes_on_localhost(tmp_path: Path, digits_cache: Path):
    commands, env, root = torchrun_nodes(
        tmp_path, digits_cache, "--trainer.limit_train_batches=2", "--trainer.max_epochs=1"
    )
    nodes = {f"node{i}": start(command, env, tmp_path, f"node{i}") for i, command in enumerate(commands)}
    try:
        wait_all(nodes, tmp_path)
    finally:
        kill_all(list(nodes.values()), env)
    assert run_folders(root) == ["version_0"]  # the two processes agreed on one run folder
    run = root / "runs" / "lightning_logs" / "version_0"
    trainer = yaml.safe_load((run / "config.yaml").read_text())["trainer"]
    assert (trainer["num_nodes"], str(trainer["devices"])) == (2, "1")
    last = load(run / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 2
    assert len(last["rng_states"]) == 2  # gathered from every rank: the world had 2 processes
    assert "auto resume: no readable checkpoint" in stderr_of(tmp_path, "node0")  # fit got auto


def test_torchrun_restarts_worker_group_and_resumes(tmp_path: Path, digits_cache: Path):
    epochs, batches = 3, 4
    commands, env, root = torchrun_nodes(
        tmp_path, digits_cache, f"--trainer.limit_train_batches={batches}", f"--trainer.max_epochs={epochs}"
    )
    env["MAX_RESTARTS"] = "1"
    last = root / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    nodes = {f"node{i}": start(command, env, tmp_path, f"node{i}") for i, command in enumerate(commands)}
    try:
        wait_until(last.exists, "the first checkpoint", nodes, tmp_path)
        workers = children(nodes["node1"].pid)  # the script execs torchrun, whose child is the worker
        assert len(workers) == 1, workers
        os.kill(workers[0], signal.SIGKILL)
        wait_all(nodes, tmp_path)
    finally:
        kill_all(list(nodes.values()), env)
    logs = {log: stderr_of(tmp_path, log) for log in nodes}
    restored = [(Path(path), int(step)) for log in logs.values() for path, step in RESTORED.findall(log)]
    assert restored, logs["node0"][-3000:] + logs["node1"][-3000:]  # the restarted group's rank 0 tells
    assert all(path.resolve() == last.resolve() and 0 < step < epochs * batches for path, step in restored), restored
    assert run_folders(root) == ["version_0"]
    assert load(last)["global_step"] == epochs * batches


def slurm_bin(folder: Path, record: Path) -> Path:
    """``srun`` and ``scontrol`` stand-ins in ``folder``; ``scontrol`` appends its arguments to ``record``."""
    folder.mkdir()
    (folder / "srun").write_text('#!/bin/sh\nexec "$@"\n')
    (folder / "scontrol").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {shlex.quote(str(record))}\n'
        '[ "$1" = requeue ] && kill -TERM "$PPID"  # SLURM ends the job it requeues\n'
        "exit 0\n"
    )
    for tool in ("srun", "scontrol"):
        (folder / tool).chmod(0o755)
    return folder


def holds(pid: int, signum: int) -> bool:
    """Whether process ``pid`` holds (blocks) ``signum``, from its /proc status (False once it has ended)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigBlk:"):
                return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    return False


def test_slurm_requeue_resumes_from_hpc_checkpoint(tmp_path: Path, digits_cache: Path):
    """docker/launch_slurm.sh: SIGUSR1 while the app still imports (its default action would end the job) is held
    by kpca.training.slurm_start and requeues after the first batch; the requeued job, the same command, resumes
    from that hpc checkpoint, and a SIGUSR1 after its fit has ended leaves it to exit 0."""
    epochs, batches = 6, 8
    root, record = tmp_path / "root", tmp_path / "scontrol.log"
    fit = [
        "bash", SLURM, "vision_cls", "fit", *smoke_options(SMOKE, root, digits_cache),
        f"--trainer.max_epochs={epochs}", f"--trainer.limit_train_batches={batches}", "--trainer.limit_val_batches=1",
        "--trainer.callbacks+=tests.slurm.signal_after_fit.SignalAfterFit",  # a fit that ends is signalled again
    ]  # fmt: skip
    env = clean_env(
        SLURM_JOB_NAME="kpca-test", SLURM_JOB_ID="4242", SLURM_NTASKS="1", SLURM_NTASKS_PER_NODE="1",
        SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1",
        PYTHONPATH=str(REPO),  # the app imports the callback from tests/
    )  # fmt: skip
    env["PATH"] = os.pathsep.join([str(slurm_bin(tmp_path / "bin", record)), env["PATH"]])
    run = root / "runs" / "lightning_logs" / "version_0"
    hpc = root / "hpc_ckpt_1.ckpt"

    job = start(fit, env, tmp_path, "job")  # srun execs: the pid is the task's, which SLURM signals
    try:
        wait_until(lambda: holds(job.pid, signal.SIGUSR1), "the task holding SIGUSR1", {"job": job}, tmp_path)
        assert "SLURM auto-requeueing enabled" not in stderr_of(tmp_path, "job")  # Lightning's handler is not in
        os.kill(job.pid, signal.SIGUSR1)  # --signal=USR1@120 while the app starts: the time limit is near
        wait_until(lambda: record.is_file() and hpc.is_file(), "hpc_ckpt_1.ckpt and scontrol", {"job": job}, tmp_path)
        job.wait(timeout=TIMEOUT)
    finally:
        kill_all([job], env)
    first = stderr_of(tmp_path, "job")
    assert record.read_text().splitlines() == ["requeue 4242"], first[-3000:]
    assert "SLURM auto-requeueing enabled" in first  # printed once Lightning's handler is in: after the signal
    saved = load(hpc)
    step = saved["global_step"]
    assert step == 1, first[-3000:]  # taken after the first batch
    assert Path(saved["kpca_run_folder"]) == run.resolve()
    assert not (run / "checkpoints" / "last.ckpt").exists()  # nothing was saved after it

    assert "SignalAfterFit" not in first  # requeued: its fit did not end

    rerun = subprocess.run(
        [str(part) for part in fit], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )  # the requeued job: the same command
    assert rerun.returncode == 0, rerun.stderr[-3000:]  # SIGUSR1's default action: 138
    assert "SignalAfterFit: SIGUSR1 sent" in rerun.stderr
    restored = RESTORED.findall(rerun.stderr)
    assert [(Path(path).resolve(), int(n)) for path, n in restored] == [(hpc.resolve(), step)], rerun.stderr[-3000:]
    assert run_folders(root) == ["version_0"]  # continued in the run folder of the first job
    assert load(run / "checkpoints" / "last.ckpt")["global_step"] == epochs * batches
    assert record.read_text().splitlines() == ["requeue 4242"]  # the rerun was not requeued
    assert sorted(path.name for path in root.glob("hpc_ckpt_*.ckpt")) == ["hpc_ckpt_1.ckpt"]
