"""``kpca-experiment run`` with the local executor, as a user types it: two attention kinds x two seeds on the smoke
config, killed with SIGKILL during the second run's fit, then run again: it finishes only what was missing (no
finished step reruns, the interrupted fit resumes) and writes the comparison, mean ± std over the seeds."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kpca.training.experiment.plan import load_plan
from kpca.training.experiment.status import step_states
from kpca.training.experiment.steps import log_path, marker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(os, "killpg"), reason="kills the runner's process group"),
]

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "configs" / "trainer" / "cpu.yaml"
SMOKE = REPO / "configs" / "vision_cls" / "smoke.yaml"
KPCA_EXPERIMENT = Path(sys.executable).parent / "kpca-experiment"
TIMEOUT = 600.0
TINY_TEST = [
    "--data.eval.subset=16", "--data.eval.severities=[1]",
    '--model.evaluator.attacks=[{"name": "fgsm", "eps": [0.0078]}]',
]  # fmt: skip
"""The test step cut down: 16 images, one corruption at one severity, one FGSM radius."""


@pytest.fixture(scope="module")
def digits_cache(digits_cache_dir: Path) -> Path:
    """The session's digits tree (tests/conftest.py): read only."""
    return digits_cache_dir


def write_plan(folder: Path, runs: list[dict], seeds: list[int]) -> Path:
    """A plan on the smoke config: fit 4 short epochs (a checkpoint each), test the last checkpoint, the report."""
    plan = {
        "name": "two-kinds",
        "app": "vision_cls",
        "out": "runs/two-kinds",
        "seeds": seeds,
        "common": {
            "configs": [str(CPU), str(SMOKE)],
            "overrides": [
                "--trainer.enable_progress_bar=false",
                "--trainer.limit_train_batches=2",
                "--trainer.limit_val_batches=1",
                "--trainer.log_every_n_steps=1",
            ],
        },  # fmt: skip
        "runs": runs,
        "steps": [
            {"name": "fit", "overrides": ["--trainer.max_epochs=4"]},
            {"name": "test", "ckpt": "last", "overrides": TINY_TEST},
        ],
        "report": {"task": "vision_cls", "title": "symmetric vs rpc", "headlines": {"clean": ["clean/acc1"]}},
    }
    path = folder / "two_kinds.yaml"
    path.write_text(yaml.safe_dump(plan), encoding="utf-8")
    return path


def start_runner(plan: Path, cache: Path, cwd: Path, log: str) -> subprocess.Popen:
    """``kpca-experiment run PLAN --override=...`` from a shell, in its own process group (output to ``cwd/<log>``)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    command = [str(KPCA_EXPERIMENT), "run", str(plan), f"--override=--data.cache_dir={cache}"]
    with open(cwd / log, "w") as output:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )


def files_and_times(folder: Path) -> dict[Path, tuple[int, bytes]]:
    """Every file under ``folder`` with its modification time and contents."""
    return {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in sorted(folder.rglob("*")) if path.is_file()}


def test_killed_plan_reruns_only_what_is_missing_and_reports_mean_and_std(tmp_path, monkeypatch, digits_cache):
    monkeypatch.chdir(tmp_path)  # where the runner runs: the plan's relative out lies here
    runs = [{"name": "symmetric", "overrides": ["--model.net.init_args.attention.kind=symmetric"]}, {"name": "rpc"}]
    path = write_plan(tmp_path, runs, seeds=[0, 1])
    plan = load_plan(path)
    first, second = plan.runs[0], plan.runs[1]  # symmetric/seed0, symmetric/seed1
    runner = start_runner(path, digits_cache, tmp_path, "first.log")
    killed_checkpoint = second.folder / "fit" / "checkpoints" / "last.ckpt"
    try:
        deadline = time.monotonic() + TIMEOUT
        while not killed_checkpoint.is_file() and runner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)  # the runner, its step process and the app
        runner.wait()
    output = (tmp_path / "first.log").read_text()
    assert runner.returncode == -signal.SIGKILL, output[-3000:]
    assert marker(first, "test", "done").is_file() and not marker(second, "fit", "done").is_file(), output[-3000:]
    states = {(s.run_id, s.step): s for s in step_states(plan)}
    assert states["symmetric/seed1", "fit"].state == "interrupted"
    assert states["symmetric/seed1", "fit"].progress.startswith("epoch ")  # read from the real checkpoint
    assert states["rpc/seed0", "fit"].state == "not started"
    finished = files_and_times(first.folder)  # markers, logs, checkpoints, events, reports of the finished run
    assert first.folder / "fit" / "checkpoints" / "last.ckpt" in finished and first.folder / "fit.done" in finished

    rerun = start_runner(path, digits_cache, tmp_path, "rerun.log")
    assert rerun.wait(timeout=TIMEOUT) == 0, (tmp_path / "rerun.log").read_text()[-4000:]
    assert files_and_times(first.folder) == finished  # no finished step ran again
    resumed = log_path(second, "fit").read_text()
    assert f"auto resume: restoring {second.folder / 'fit' / 'checkpoints'}" in resumed
    assert resumed.count("\n=== ") == 3  # the killed attempt's start line, the rerun's start and end lines
    assert all(state.state == "done" for state in step_states(plan))

    tested = {run.id: _robustness(run.folder / "test") for run in plan.runs}
    with (plan.out / "comparison.csv").open() as stream:
        rows = {row["kind"]: row for row in csv.DictReader(stream)}
    assert sorted(rows) == ["rpc", "symmetric"]
    for kind in rows:
        values = [tested[f"{kind}/seed{seed}"]["clean/acc1"] for seed in (0, 1)]
        assert (rows[kind]["seeds"], rows[kind]["runs"], rows[kind]["status"]) == ("0 1", "2", "complete")
        assert float(rows[kind]["clean/acc1"]) == pytest.approx(statistics.fmean(values), abs=1e-12)
        assert float(rows[kind]["clean/acc1_std"]) == pytest.approx(statistics.stdev(values), abs=1e-12)
    report = (plan.out / "report.md").read_text()
    assert report.startswith("# symmetric vs rpc") and " ± " in report


def test_a_failed_step_stops_its_run_names_its_log_and_fails_the_plan(tmp_path, monkeypatch, digits_cache):
    monkeypatch.chdir(tmp_path)
    # a data root that is not there: the plan is valid, the fit fails when it looks (a DataError, exit status 3)
    missing = ["--data.builtin=null", f"--data.root={tmp_path / 'no_imagenet'}"]
    path = write_plan(tmp_path, [{"name": "broken", "overrides": missing}], seeds=[0])
    runner = start_runner(path, digits_cache, tmp_path, "run.log")
    assert runner.wait(timeout=TIMEOUT) == 1
    output = (tmp_path / "run.log").read_text()
    plan = load_plan(path)
    run = plan.runs[0]
    assert "broken/seed0 fit FAILED (exit status 3); its later steps are skipped" in output
    assert f"1 step(s) failed; their logs:\n  broken/seed0 fit: {log_path(run, 'fit')}" in output
    assert [s.state for s in step_states(plan)] == ["failed", "not started"]
    assert "## Status: 2 of 2 steps not done" in (plan.out / "report.md").read_text()


def _robustness(folder: Path) -> dict[str, float]:
    with (folder / "robustness.csv").open() as stream:
        return {row["metric"]: float(row["value"]) for row in csv.DictReader(stream)}
