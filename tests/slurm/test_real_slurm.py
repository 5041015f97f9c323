"""Experiment plans and docker/launch_slurm.sh against a real Slurm: the one-node Slurm on localhost of
docker/local_slurm.sh (started by the ``local_slurm`` fixture, see conftest.py), on the smoke model and the built-in
digits. What a real scheduler cannot show quickly (resources of a multi-GPU cluster, reruns that replace stuck
tasks, damaged records) stays with the stand-ins of tests/training/test_experiment_slurm.py and tests/test_cluster.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from kpca.training.experiment.plan import load_plan
from kpca.training.experiment.slurm import read_jobs
from kpca.training.experiment.status import step_states
from kpca.vision_cls.builtin_data import write_digits_imagefolder
from tests.cli_support import CONFIGS, CPU, fit_command, smoke_options
from tests.slurm.support import REPO, LocalSlurm
from tests.test_cluster import clean_env

# One xdist group: the worker that starts the local Slurm stops it when its session ends (tests/test_xdist_groups.py).
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
LAUNCH_SLURM = REPO / "docker" / "launch_slurm.sh"
RESTORED = re.compile(r"auto resume: restoring (\S+) \(step (\d+)\)")
TINY_FIT = ("--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1")
PLAN_TIMEOUT_S = 240
REQUEUE_TIMEOUT_S = 420
PACE_S = 0.4  # seconds of sleep after each training step of the requeued fit
TASK = "4294967294"  # jobcomp's ArrayTaskId of a job that is not an array task


@pytest.fixture(scope="module")
def digits_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("digits_cache")
    write_digits_imagefolder(cache / "digits-32px", image_size=32)
    return cache


def write_plan(folder: Path, name: str, runs: dict[str, list[str]], overrides: list[str]) -> Path:
    """A plan of ``runs`` (name -> overrides) x seed 0 of the smoke model: fit, test (last checkpoint), report."""
    plan = {
        "name": name,
        "app": "vision_cls",
        "out": f"runs/{name}",
        "seeds": [0],
        "common": {"configs": [str(CPU), str(SMOKE)], "overrides": overrides},
        "runs": [{"name": run, "overrides": extra} for run, extra in runs.items()],
        "steps": [{"name": "fit"}, {"name": "test", "ckpt": "last"}],
        "report": {"title": name},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def submit_plan(path: Path, cwd: Path) -> dict[str, str]:
    """``kpca-experiment run PLAN --executor slurm`` as a user runs it; the submitted job ids by step."""
    command = [sys.executable, "-m", "kpca.training.experiment", "run", str(path), "--executor", "slurm"]
    done = subprocess.run(command, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return {job["step"]: job["job_id"] for job in read_jobs(load_plan(path))}


def cancel(jobs: dict[str, str]) -> None:
    if jobs:
        subprocess.run(["scancel", *jobs.values()], capture_output=True, timeout=30)


def one(local_slurm: LocalSlurm, job: str) -> dict[str, str]:
    [record] = local_slurm.finished_tasks(job)[-1]
    return record


def test_a_plan_runs_through_the_slurm_executor_to_its_report(
    local_slurm: LocalSlurm, tmp_path: Path, digits_cache: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)  # the plan's paths are relative to the folder it is submitted from
    overrides = [f"--data.cache_dir={digits_cache}", "--trainer.enable_progress_bar=false", *TINY_FIT]
    path = write_plan(tmp_path, "real", {"a": [], "b": ["--model.net.init_args.attention.kind=symmetric"]}, overrides)
    plan = load_plan(path)
    jobs = {}
    try:
        jobs = submit_plan(path, tmp_path)
        assert sorted(jobs) == ["fit", "report", "test"]
        local_slurm.wait(lambda: not local_slurm.queue(jobs.values()), "every job of the plan ended", PLAN_TIMEOUT_S,
                         plan.out)  # fmt: skip
        diagnostics = local_slurm.diagnostics(plan.out)
        assert [(state.run_id, state.step, state.state) for state in step_states(plan)] == [
            ("a/seed0", "fit", "done"), ("a/seed0", "test", "done"), ("b/seed0", "fit", "done"),
            ("b/seed0", "test", "done"),
        ], diagnostics  # fmt: skip
        fits, tests = local_slurm.finished_tasks(jobs["fit"]), local_slurm.finished_tasks(jobs["test"])
        assert sorted(fits) == sorted(tests) == [0, 1], diagnostics
        for task in (0, 1):
            [fit], [test] = fits[task], tests[task]
            assert fit["JobState"] == test["JobState"] == "COMPLETED", diagnostics
            assert test["EligibleTime"] >= fit["EndTime"], diagnostics  # aftercorr: after its own fit ended
        report = one(local_slurm, jobs["report"])
        assert report["JobState"] == "COMPLETED", diagnostics
        assert report["StartTime"] >= max(test["EndTime"] for [test] in tests.values()), diagnostics  # afterany
        text = (plan.out / "report.md").read_text()
        assert "a/seed0" in text and "b/seed0" in text, text
        status = subprocess.run(
            [sys.executable, "-m", "kpca.training.experiment", "status", str(path)],
            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        rows = [line for line in status.stdout.splitlines() if line.startswith("| ") and "/seed0" in line]
        assert len(rows) == 4 and all("| done |" in row for row in rows), status.stdout
    finally:
        cancel(jobs)


def test_the_report_runs_after_a_failed_fit(
    local_slurm: LocalSlurm, tmp_path: Path, digits_cache: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    overrides = [f"--data.cache_dir={digits_cache}", "--trainer.enable_progress_bar=false", *TINY_FIT]
    # a data root that is not there: the plan is valid (a plan with a bad option is refused before submitting), the
    # fit fails when it looks
    missing = ["--data.builtin=null", f"--data.root={tmp_path / 'no_imagenet'}"]
    path = write_plan(tmp_path, "broken", {"good": [], "bad": missing}, overrides)
    plan = load_plan(path)
    good, bad = plan.runs
    jobs = {}
    try:
        jobs = submit_plan(path, tmp_path)
        stuck = {}

        def report_ran_or_stuck() -> bool:
            queued = local_slurm.queue(jobs.values())
            if not queued:
                return True
            others = {job: entry for job, entry in queued.items() if job != jobs["report"]}
            if others and all(reason == "DependencyNeverSatisfied" for _, reason in others.values()):
                stuck.update(queued)
                return True
            return False

        local_slurm.wait(report_ran_or_stuck, "the report ran", PLAN_TIMEOUT_S, plan.out)
        diagnostics = local_slurm.diagnostics(plan.out)
        assert not stuck, f"the report waits for ever behind a test that can never start: {stuck}\n{diagnostics}"
        fits, tests = local_slurm.finished_tasks(jobs["fit"]), local_slurm.finished_tasks(jobs["test"])
        assert fits[0][-1]["JobState"] == "COMPLETED" and fits[1][-1]["JobState"] == "FAILED", diagnostics
        assert tests[0][-1]["JobState"] == "COMPLETED", diagnostics
        assert tests[0][-1]["EligibleTime"] >= fits[0][-1]["EndTime"], diagnostics
        assert tests[1][-1]["JobState"] == "CANCELLED", diagnostics  # never started: its fit failed
        assert one(local_slurm, jobs["report"])["JobState"] == "COMPLETED", diagnostics
        text = (plan.out / "report.md").read_text()
        assert f"| {bad.id} | fit | failed |" in text and f"| {good.id} | test | done |" in text, text
    finally:
        cancel(jobs)


def test_launch_slurm_requeue_cycle_ends_with_the_weights_of_an_uninterrupted_run(
    local_slurm: LocalSlurm, tmp_path: Path, digits_cache: Path
):
    """docker/launch_slurm.sh under sbatch with a 1-minute limit and SIGUSR1 10 s before it (Slurm sends it up to
    30 s earlier, at its next time-limit check): Lightning saves hpc_ckpt_<n>.ckpt and requeues the job, the
    requeued job runs the same command and resumes from it, until the fit ends; its weights are those of the same
    command run without SLURM. The Slurm fit is paced (tests/slurm/pace.py): 160 steps of at least 0.4 s outlast
    the 50 s by which SIGUSR1 has arrived on the fastest machine, so the first run is signalled mid-fit. A later run
    may be signalled while it starts or after its fit has ended: the app starts with the signal held
    (kpca.training.slurm_start), so it requeues after the next batch, or is discarded as the process exits 0."""
    epochs, batches = 4, 40
    budget = [f"--trainer.max_epochs={epochs}", f"--trainer.limit_train_batches={batches}",
              "--trainer.limit_val_batches=1"]  # fmt: skip
    paced = ["--trainer.callbacks+=tests.slurm.pace.Pace", f"--trainer.callbacks.seconds_per_step={PACE_S}"]
    root, straight = tmp_path / "slurm", tmp_path / "straight"
    reference = subprocess.Popen(
        fit_command("vision_cls", [*smoke_options(SMOKE, straight, digits_cache), *budget]),
        cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    sbatch = ["sbatch", "--parsable", "--time=1", "--signal=USR1@10", "--nodes=1", "--ntasks-per-node=1",
              "--gpus-per-node=0", "--cpus-per-task=2", str(LAUNCH_SLURM), "vision_cls", "fit",
              *map(str, smoke_options(SMOKE, root, digits_cache)), *budget, *paced]  # fmt: skip
    job = ""
    try:
        env = clean_env(PYTHONPATH=str(REPO))  # the job imports the pacing callback from tests/
        done = subprocess.run(sbatch, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        job = done.stdout.strip().split(";")[0]
        released = []

        def ended() -> bool:
            if local_slurm.release_requeued(job):  # requeued: Slurm would hold it 2 minutes
                released.append(time.monotonic())
            return not local_slurm.queue([job])

        local_slurm.wait(ended, f"job {job} ended", REQUEUE_TIMEOUT_S, tmp_path)
        diagnostics = local_slurm.diagnostics(tmp_path)
        log = (tmp_path / f"kpca-{job}.out").read_text()
        runs = local_slurm.finished_tasks(job)[-1]
        assert [run["JobState"] for run in runs][-1] == "COMPLETED", diagnostics
        # jobcomp records a requeued run as PENDING (its state once requeued)
        assert len(runs) >= 2 and all(run["JobState"] in ("PENDING", "REQUEUED") for run in runs[:-1]), diagnostics
        hpc = sorted(root.glob("hpc_ckpt_*.ckpt"), key=lambda path: int(path.stem.rpartition("_")[2]))
        assert [path.name for path in hpc] == [f"hpc_ckpt_{n}.ckpt" for n in range(1, len(runs))], diagnostics
        hpc_steps = [torch.load(path, map_location="cpu", weights_only=True)["global_step"] for path in hpc]
        restored = [(Path(path).name, int(step)) for path, step in RESTORED.findall(log)]
        # Each requeued run resumed from the newest checkpoint of the run before: its hpc checkpoint (saved at
        # SIGUSR1), or the last.ckpt that run wrote after it, at the same step or at the epoch's end the deferred
        # requeue let it reach.
        assert len(restored) == len(hpc) and all(
            (name, step) == (path.name, hpc_step) or (name == "last.ckpt" and step >= hpc_step)
            for (name, step), path, hpc_step in zip(restored, hpc, hpc_steps, strict=True)
        ), (restored, hpc_steps, diagnostics)
        steps = [step for _, step in restored]
        # A requeue in a run's last steps can let it reach the end before Slurm ends it: its successor then restores
        # the final last.ckpt and finishes at once (so the last step may be the fit's end; seen once in CI).
        assert steps == sorted(set(steps)) and steps[0] > 0 and steps[-1] <= epochs * batches, diagnostics
        run = root / "runs" / "lightning_logs"
        assert sorted(path.name for path in run.iterdir()) == ["version_0"], diagnostics  # one run folder
        _, stderr = reference.communicate(timeout=REQUEUE_TIMEOUT_S)
        assert reference.returncode == 0, stderr[-3000:]
        last = run / "version_0" / "checkpoints" / "last.ckpt"
        expected = straight / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
        a, b = (torch.load(path, map_location="cpu", weights_only=True) for path in (last, expected))
        assert a["global_step"] == b["global_step"] == epochs * batches
        differences = {
            name: (value.float() - b["state_dict"][name].float()).abs().max().item()
            for name, value in a["state_dict"].items()
            if not torch.equal(value, b["state_dict"][name])
        }
        assert a["state_dict"].keys() == b["state_dict"].keys()
        assert not differences, f"{len(differences)} tensors differ, at most {max(differences.values())}: {differences}"
    finally:
        if reference.poll() is None:
            reference.kill()
        reference.communicate()
        if job:
            subprocess.run(["scancel", job], capture_output=True, timeout=30)
