"""Warm starts (kpca.training.experiment.warm_start): a step forked from the local executor's warm interpreter trains
the same weights as one in a new interpreter, takes SIGTERM the same way (tests/training/test_experiment_steps.py),
and a step it cannot serve as a new interpreter would starts in one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kpca.training.experiment import warm_start
from kpca.training.experiment.plan import load_plan
from kpca.training.experiment.steps import marker
from tests.training.test_experiment_steps import EXPERIMENT, tiny_plan

WARM = "forked from the warm interpreter"
NEW = "new interpreter"


@pytest.fixture(scope="module")
def digits_cache(digits_cache_dir: Path) -> Path:
    """The session's digits tree (tests/conftest.py): read only."""
    return digits_cache_dir


def require_warm_starts() -> None:
    """Skip the test where this machine cannot fork warm (not Linux, a GPU device present, or switched off)."""
    if (reason := warm_start.available()) is not None:
        pytest.skip(f"no warm starts on this machine: {reason}")


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux's /proc/<pid>/task/<pid>/children)."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_available_names_why_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(warm_start.SWITCH_VARIABLE, "0")
    assert warm_start.available() == "KPCA_WARM_START=0"
    monkeypatch.delenv(warm_start.SWITCH_VARIABLE)
    device = tmp_path / "nvidia0"
    device.touch()
    monkeypatch.setattr(warm_start, "GPU_DEVICES", (str(tmp_path / "nvidia[0-9]*"),))
    assert warm_start.available() == f"a GPU device ({device}) is present: no GPU runtime may start before a fork"
    monkeypatch.setattr(warm_start.sys, "platform", "darwin")
    assert warm_start.available() == "forking an interpreter is only used on Linux, not darwin"


def exec_fit(folder: Path) -> subprocess.CompletedProcess:
    """``kpca-experiment exec`` of the tiny plan's fit in ``folder``, with this process's environment as the runner
    passes its own (a library may have set variables in the process's C environment that ``os.environ`` misses)."""
    command = [*EXPERIMENT, "exec", str(folder / "plan.yaml"), "--run", "rpc/seed0", "--step", "fit"]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_a_warm_step_trains_the_weights_of_a_new_interpreter_and_a_changed_environment_starts_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digits_cache: Path
):
    require_warm_starts()
    runs = {}
    for name in ("new", "warm", "changed"):
        (tmp_path / name).mkdir()
        tiny_plan(tmp_path / name, digits_cache, "--trainer.max_epochs=2")
        runs[name] = load_plan(tmp_path / name / "plan.yaml").runs[0]
    exec_fit(tmp_path / "new")
    monkeypatch.chdir(tmp_path / "warm")
    with warm_start.warm_interpreter("vision_cls"):
        exec_fit(tmp_path / "warm")
        changed = exec_fit(tmp_path / "changed")  # the warm interpreter runs in warm/: this step starts anew
    assert f"the step runs in {tmp_path / 'changed'}, the warm interpreter in {tmp_path / 'warm'}" in changed.stderr
    started = {name: json.loads(marker(run, "fit", "done").read_text())["started"] for name, run in runs.items()}
    assert started == {"new": NEW, "warm": WARM, "changed": NEW}
    weights = {
        name: torch.load(run.folder / "fit" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        for name, run in runs.items()
    }
    assert weights["new"].keys() == weights["warm"].keys()
    assert all(torch.equal(value, weights["warm"][key]) for key, value in weights["new"].items())


@pytest.mark.slow
def test_sigterm_reaches_a_warm_app_and_leaves_the_step_unfinished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digits_cache: Path
):
    require_warm_starts()
    monkeypatch.chdir(tmp_path)
    path = tiny_plan(tmp_path, digits_cache, "--trainer.max_epochs=100")
    run = load_plan(path).runs[0]
    last = run.folder / "fit" / "checkpoints" / "last.ckpt"
    with warm_start.warm_interpreter("vision_cls"):
        process = subprocess.Popen([*EXPERIMENT, "exec", str(path), "--run", "rpc/seed0", "--step", "fit"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 300
        while not last.is_file() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children(process.pid) == []  # the app is the warm interpreter's child
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted by signal 15; rerun the plan to continue it" in stderr
    assert not marker(run, "fit", "done").exists() and not marker(run, "fit", "running").exists()
    assert "exit status" in (run.folder / "fit.log").read_text()  # the app ended, and its end is in the log


def test_the_warm_interpreter_ends_with_its_runner(tmp_path: Path):
    require_warm_starts()
    script = (
        "import os, sys, time\n"
        "from kpca.training.experiment.warm_start import SOCKET_VARIABLE, warm_interpreter\n"
        "with warm_interpreter('language_model'):\n"
        "    print(os.environ[SOCKET_VARIABLE], flush=True)\n"
        "    time.sleep(600)\n"
    )
    runner = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        path = runner.stdout.readline().strip()
        (warm,) = children(runner.pid)
        assert path and path in Path(f"/proc/{warm}/cmdline").read_text()
    finally:
        runner.kill()  # SIGKILL: no clean-up runs in the runner
        runner.communicate()
    deadline = time.monotonic() + 120
    while Path(f"/proc/{warm}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{warm}").exists() or "Z" in Path(f"/proc/{warm}/stat").read_text().split()[2]
