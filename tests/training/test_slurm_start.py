"""``python -m kpca.training.slurm_start <module> [args...]``: the module runs as ``python -m`` would run it, in
the same process, with SIGUSR1 held from before its first line: a signal sent then stays pending instead of ending
the process."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

PROBE = textwrap.dedent(
    """
    import signal, sys
    print("held" if signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, []) else "free", *sys.argv[1:],
          flush=True)
    sys.stdin.readline()  # the test has sent SIGUSR1
    print("pending" if signal.SIGUSR1 in signal.sigpending() else "not pending", flush=True)
    """
)


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "kpca.training.slurm_start", *args], cwd=tmp_path, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_the_module_runs_in_the_same_process_with_sigusr1_held_and_a_signal_stays_pending(tmp_path: Path):
    (tmp_path / "probe.py").write_text(PROBE)
    process = start(tmp_path, "probe", "fit", "--trainer.max_epochs=2")
    try:
        assert process.stdout.readline().split() == ["held", "fit", "--trainer.max_epochs=2"]
        process.send_signal(signal.SIGUSR1)  # the pid is the module's: the start execs it
        process.stdin.write("sent\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "pending"
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        process.kill()
        process.communicate()


def test_without_a_module_it_says_how_to_call_it(tmp_path: Path):
    process = start(tmp_path)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert stderr.splitlines() == [
        "error: no module to run; usage: python -m kpca.training.slurm_start <module> [args...]  "
        "(e.g. kpca.vision_cls fit -c config.yaml)"
    ]
