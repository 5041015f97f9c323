"""The SLURM executor (kpca.training.experiment.slurm) against stand-ins for SLURM's commands on PATH.

``sbatch`` records its arguments and the script it was given and prints a job id (``--parsable``), ``squeue``
answers from a file, ``srun`` runs its arguments (or only records them), ``scontrol requeue`` records its arguments
and ends every process of the job with SIGTERM, as SLURM does when it requeues a job. The submitted scripts are run
for real with bash and SLURM's array variables.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from kpca.training.experiment import cli as experiment_cli
from kpca.training.experiment.plan import PlanError, load_plan
from kpca.training.experiment.slurm import SlurmError, array_spec, slurm_states, submit_slurm
from kpca.training.experiment.status import status_markdown, step_states
from kpca.training.experiment.steps import marker
from kpca.vision_cls.builtin_data import write_digits_imagefolder
from tests.cli_support import CONFIGS, CPU
from tests.test_cluster import TAG, TIMEOUT, children, clean_env, kill_all, start, stderr_of, wait_until
from tests.training.test_plan_checked_first import assert_refused_before_anything_ran, kpca_experiment
from tests.training.test_plan_checked_first import write_plan as write_typo_plan

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
FIRST_JOB = 1000
RESTORED = re.compile(r"auto resume: restoring (\S+) \(step (\d+)\)")


@dataclass
class Slurm:
    """The stand-ins' folder and files: what sbatch / srun / scontrol recorded, what squeue answers."""

    bin: Path
    sbatch_log: Path
    squeue_log: Path
    squeue_answer: Path
    srun_log: Path
    scontrol_log: Path

    def submissions(self) -> list[dict]:
        """sbatch's calls: ``{"argv": [...], "script": <its text>}`` each, in order."""
        if not self.sbatch_log.exists():
            return []
        return [json.loads(line) for line in self.sbatch_log.read_text().splitlines()]

    def answer(self, *lines: str) -> None:
        """What squeue prints next (``%i|%T|%r`` lines); ``INVALID`` makes it fail as for jobs no longer known."""
        self.squeue_answer.write_text("".join(f"{line}\n" for line in lines))


def python_tool(path: Path, body: str) -> None:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Slurm:
    """Stand-ins for sbatch, squeue, srun (records, runs nothing) and scontrol on PATH; the test runs in tmp_path."""
    folder = tmp_path / "bin"
    folder.mkdir()
    tools = Slurm(
        bin=folder, sbatch_log=tmp_path / "sbatch.log", squeue_log=tmp_path / "squeue.log",
        squeue_answer=tmp_path / "squeue.out", srun_log=tmp_path / "srun.log", scontrol_log=tmp_path / "scontrol.log",
    )  # fmt: skip
    python_tool(
        folder / "sbatch",
        "import json, pathlib, sys\n"
        f"log = pathlib.Path({str(tools.sbatch_log)!r})\n"
        "count = len(log.read_text().splitlines()) if log.exists() else 0\n"
        "script = pathlib.Path(sys.argv[-1])\n"
        "if 'REFUSE' in script.read_text():\n"
        "    sys.exit('sbatch: error: Batch job submission failed: Invalid partition name specified')\n"
        "with log.open('a') as stream:\n"
        "    stream.write(json.dumps({'argv': sys.argv[1:], 'script': script.read_text()}) + '\\n')\n"
        f"print(f'{{{FIRST_JOB} + count}};cluster0')\n",
    )
    python_tool(
        folder / "squeue",
        "import pathlib, sys\n"
        f"pathlib.Path({str(tools.squeue_log)!r}).open('a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"answer = pathlib.Path({str(tools.squeue_answer)!r})\n"
        "text = answer.read_text() if answer.exists() else ''\n"
        "if text.strip() == 'INVALID':\n"
        "    sys.exit('slurm_load_jobs error: Invalid job id specified')\n"
        "print(text, end='')\n",
    )
    (folder / "srun").write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(tools.srun_log))}\n')
    (folder / "srun").chmod(0o755)
    python_tool(
        folder / "scontrol",
        "import contextlib, os, pathlib, signal, sys\n"
        f"pathlib.Path({str(tools.scontrol_log)!r}).open('a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1:2] == ['requeue']:  # SLURM ends every process of the job it requeues\n"
        f"    tag = ('{TAG}=' + os.environ['{TAG}']).encode()\n"
        "    for environ in pathlib.Path('/proc').glob('[0-9]*/environ'):\n"
        "        with contextlib.suppress(OSError, ValueError):\n"
        "            pid = int(environ.parent.name)\n"
        "            if pid != os.getpid() and tag in environ.read_bytes().split(b'\\0'):\n"
        "                os.kill(pid, signal.SIGTERM)\n",
    )
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    return tools


def write_plan(folder: Path, *, steps=("fit", "test", "analyze"), slurm=None, report=True, overrides=()) -> Path:
    """A plan of two runs x two seeds of the smoke model (a, b), written to ``folder/plan.yaml``."""
    plan = {
        "name": "tiny",
        "app": "vision_cls",
        "out": "runs/tiny",
        "seeds": [0, 1],
        "common": {"configs": [str(CPU)], "overrides": list(overrides)},
        "runs": [{"name": "a", "configs": [str(SMOKE)]}, {"name": "b", "configs": [str(SMOKE)]}],
        "steps": [{"name": step} for step in steps],
    }
    if report:
        plan["report"] = {"title": "tiny"}
    if slurm is not None:
        plan["slurm"] = slurm
    path = folder / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def sbatch_lines(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def task_runs(script: str) -> dict[int, str]:
    """The script's bash array: array task -> run id."""
    return {int(index): run for index, run in re.findall(r"^    \[(\d+)\]=(\S+)$", script, flags=re.MULTILINE)}


def mark_done(plan, *pairs: tuple[int, str]) -> None:
    """Write ``<step>.done`` for each (index of the run in plan.runs, step)."""
    for index, step in pairs:
        path = marker(plan.runs[index], step, "done")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")


def steps_and_dependencies(jobs) -> list[tuple[str, dict[int, str], str | None]]:
    return [(job.step, dict(job.tasks), job.dependency) for job in jobs]


RESOURCES = {
    "fit": {"nodes": 1, "ntasks_per_node": 8, "gpus_per_node": 8, "cpus_per_task": 10, "time": "72:00:00"},
    "test": {"nodes": 1, "ntasks_per_node": 1, "gpus_per_node": "a100:1", "time": "4:00:00", "partition": "gpu"},
    "report": {"cpus_per_task": 2, "time": "0:30:00", "exclusive": True},
}


def test_one_array_per_step_with_its_resources_and_dependencies(slurm: Slurm, tmp_path: Path):
    plan = load_plan(write_plan(tmp_path, slurm=RESOURCES), ["--trainer.max_epochs=1"])
    runs = {index: run.id for index, run in enumerate(plan.runs)}
    assert list(runs.values()) == ["a/seed0", "a/seed1", "b/seed0", "b/seed1"]

    jobs = submit_slurm(plan)

    assert [(job.step, job.job_id) for job in jobs] == [("fit", "1000"), ("test", "1001"), ("analyze", "1002"),
                                                         ("report", "1003")]  # fmt: skip
    assert steps_and_dependencies(jobs) == [
        ("fit", runs, None), ("test", runs, "aftercorr:1000"), ("analyze", runs, "aftercorr:1000"),
        ("report", {}, "afterany:1000:1001:1002"),
    ]  # fmt: skip
    calls = slurm.submissions()
    assert [call["argv"][:-1] for call in calls] == [
        ["--parsable"], ["--parsable", "--dependency=aftercorr:1000", "--kill-on-invalid-dep=yes"],
        ["--parsable", "--dependency=aftercorr:1000", "--kill-on-invalid-dep=yes"],
        ["--parsable", "--dependency=afterany:1000:1001:1002", "--kill-on-invalid-dep=yes"],
    ]  # fmt: skip
    assert [Path(call["argv"][-1]) for call in calls] == [job.script for job in jobs]
    assert all(job.script.parent == plan.out / ".slurm" for job in jobs)
    fit, test, analyze, report = (call["script"] for call in calls)
    output = f"--output={plan.out / '.slurm'}/%x-%A_%a.out"
    assert sbatch_lines(fit) == [
        "--job-name=tiny-fit", output, "--array=0-3", "--nodes=1", "--ntasks-per-node=8", "--gpus-per-node=8",
        "--cpus-per-task=10", "--time=72:00:00", "--signal=USR1@120", "--requeue", "--open-mode=append",
    ]  # fmt: skip
    assert sbatch_lines(test) == [
        "--job-name=tiny-test", output, "--array=0-3", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=a100:1",
        "--time=4:00:00", "--partition=gpu",
    ]  # fmt: skip
    assert sbatch_lines(analyze) == ["--job-name=tiny-analyze", output, "--array=0-3"]
    assert sbatch_lines(report) == [
        "--job-name=tiny-report", f"--output={plan.out / '.slurm'}/%x-%j.out", "--cpus-per-task=2", "--time=0:30:00",
        "--exclusive",
    ]  # fmt: skip
    for script, step in ((fit, "fit"), (test, "test"), (analyze, "analyze")):
        assert task_runs(script) == runs
        assert script.startswith("#!/bin/bash\n") and "\nset -euo pipefail\n" in script
        assert f"\ncd {tmp_path}\n" in script
        exec_line = f'exec {sys.executable} -m kpca.training.experiment exec {plan.path} --run "${{runs[$task]}}" '
        assert exec_line + f"--step {step} --override=--trainer.max_epochs=1 --launcher srun\n" in script
    assert report.endswith(
        f"exec {sys.executable} -m kpca.training.experiment report {plan.path} --override=--trainer.max_epochs=1\n"
    )
    recorded = json.loads((plan.out / ".slurm" / "jobs.json").read_text())["jobs"]
    assert [(job["step"], job["job_id"], job["dependency"]) for job in recorded] == [
        ("fit", "1000", None), ("test", "1001", "aftercorr:1000"), ("analyze", "1002", "aftercorr:1000"),
        ("report", "1003", "afterany:1000:1001:1002"),
    ]  # fmt: skip
    assert recorded[0]["tasks"] == {str(index): run_id for index, run_id in runs.items()}
    assert not slurm.squeue_log.exists()  # nothing was recorded before: nothing to ask


def test_an_array_task_runs_the_step_of_its_run(slurm: Slurm, tmp_path: Path):
    plan = load_plan(write_plan(tmp_path, steps=("fit",), report=False))
    [fit] = submit_slurm(plan)
    env = {**os.environ, "SLURM_ARRAY_JOB_ID": "1000", "SLURM_ARRAY_TASK_ID": "2", "SLURM_JOB_ID": "1003"}

    done = subprocess.run(["bash", fit.script], env=env, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-3000:]
    [launched] = slurm.srun_log.read_text().splitlines()  # the stand-in srun records the app command, runs nothing
    chosen = plan.runs[2]
    # through slurm_start, which holds SLURM's requeue signal while the app starts
    start = f"{sys.executable} -m kpca.training.slurm_start kpca.vision_cls"
    assert launched.startswith(f"{start} fit -c {CPU} -c {SMOKE} ")
    assert f"--trainer.default_root_dir={chosen.folder} --seed_everything=0" in launched
    assert launched.endswith("--ckpt_path auto")
    assert [run.id for run in plan.runs if marker(run, "fit", "done").is_file()] == [chosen.id] == ["b/seed0"]
    assert json.loads(marker(chosen, "fit", "done").read_text())["command"][0] == "srun"

    env["SLURM_ARRAY_TASK_ID"] = "7"
    wrong = subprocess.run(["bash", fit.script], env=env, capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2
    assert "no run for array task 7: this script has tasks 0 1 2 3" in wrong.stderr
    del env["SLURM_ARRAY_TASK_ID"]
    by_hand = subprocess.run(["bash", fit.script], env=env, capture_output=True, text=True, timeout=120)
    assert by_hand.returncode != 0
    assert "SLURM_ARRAY_TASK_ID: is not set: submit this script with sbatch" in by_hand.stderr


def test_rerun_submits_nothing_while_everything_is_queued(slurm: Slurm, tmp_path: Path):
    plan = load_plan(write_plan(tmp_path))
    first = submit_slurm(plan)
    queued = [f"{job}_{task}|PENDING|Dependency" for job in (1000, 1001, 1002) for task in range(4)]
    slurm.answer(*queued, "1003|PENDING|Dependency")

    assert submit_slurm(plan) == []

    assert len(slurm.submissions()) == len(first) == 4
    [asked] = slurm.squeue_log.read_text().splitlines()
    assert asked == "--noheader --array --jobs=1000,1001,1002,1003 --format=%i|%T|%r"


def test_rerun_after_some_steps_are_done_submits_only_the_rest(slurm: Slurm, tmp_path: Path):
    plan = load_plan(write_plan(tmp_path))
    submit_slurm(plan)
    ids = [run.id for run in plan.runs]
    mark_done(plan, (0, "fit"), (1, "fit"), (0, "test"))
    slurm.answer("INVALID")  # every earlier job has left the queue

    jobs = submit_slurm(plan)

    assert steps_and_dependencies(jobs) == [
        ("fit", {0: ids[2], 1: ids[3]}, None),
        ("test", {0: ids[1]}, None),  # its fit is done: no dependency, in an array of its own
        ("test", {0: ids[2], 1: ids[3]}, "aftercorr:1004"),  # task i after task i of the new fit array
        ("analyze", {0: ids[0], 1: ids[1]}, None),
        ("analyze", {0: ids[2], 1: ids[3]}, "aftercorr:1004"),
        ("report", {}, "afterany:1004:1005:1006:1007:1008"),
    ]
    assert [job.script.name for job in jobs] == [
        "2-fit.sbatch", "2-test.sbatch", "2-test-2.sbatch", "2-analyze.sbatch", "2-analyze-2.sbatch", "2-report.sbatch"
    ]  # fmt: skip
    scripts = [call["script"] for call in slurm.submissions()[4:]]
    assert [task_runs(script) for script in scripts[:-1]] == [dict(job.tasks) for job in jobs[:-1]]
    assert "--array=0-1" in sbatch_lines(scripts[0]) and "--array=0" in sbatch_lines(scripts[1])
    assert len(json.loads((plan.out / ".slurm" / "jobs.json").read_text())["jobs"]) == 4 + 6

    mark_done(plan, *((i, step) for i in range(4) for step in ("fit", "test", "analyze")))
    slurm.answer("INVALID")
    [report] = submit_slurm(plan)  # all done, nothing queued: the report alone
    assert (report.step, report.dependency) == ("report", None)


def test_rerun_waits_for_fits_still_queued_and_replaces_tasks_that_can_never_start(slurm: Slurm, tmp_path: Path):
    plan = load_plan(write_plan(tmp_path))
    submit_slurm(plan)  # fit 1000, test 1001, analyze 1002, report 1003, 4 runs each
    ids = [run.id for run in plan.runs]
    mark_done(plan, (0, "fit"), (1, "fit"), (0, "test"), (1, "test"), (0, "analyze"))
    # fit 1 is done but its task still ends; fit 2 runs; fit 3 failed: its test and analyze wait for ever; test 2
    # was cancelled by hand, analyze 1 failed
    slurm.answer(
        "1000_1|COMPLETING|None", "1000_2|RUNNING|None", "1001_3|PENDING|DependencyNeverSatisfied",
        "1002_2|PENDING|Dependency", "1002_3|PENDING|DependencyNeverSatisfied", "1003|PENDING|Dependency",
    )  # fmt: skip

    assert slurm_states(plan) == {
        (ids[1], "fit"): "running on SLURM (job 1000_1)",
        (ids[2], "fit"): "running on SLURM (job 1000_2)",
        (ids[3], "test"): "queued (job 1001_3) but its dependency failed: it will never start (scancel 1001_3)",
        (ids[2], "analyze"): "queued (job 1002_2)",
        (ids[3], "analyze"): "queued (job 1002_3) but its dependency failed: it will never start (scancel 1002_3)",
    }
    jobs = submit_slurm(plan)

    assert steps_and_dependencies(jobs) == [
        ("fit", {0: ids[3]}, None),
        ("test", {2: ids[2]}, "aftercorr:1000"),  # task 2 of the earlier fit array, still running
        ("test", {0: ids[3]}, "aftercorr:1004"),
        ("analyze", {0: ids[1]}, None),  # its fit is done: no waiting for the task that ends
        ("analyze", {0: ids[3]}, "aftercorr:1004"),  # analyze 2 is still queued
        ("report", {}, "afterany:1000:1002:1004:1005:1006:1007:1008"),  # not after the stuck ones
    ]
    assert "--array=2" in sbatch_lines(slurm.submissions()[5]["script"])


def test_status_shows_what_the_queue_says_of_each_step(slurm: Slurm, tmp_path: Path):
    plan = load_plan(write_plan(tmp_path))
    submit_slurm(plan)  # fit 1000, test 1001, analyze 1002, report 1003
    ids = [run.id for run in plan.runs]
    mark_done(plan, (0, "fit"))
    slurm.answer("1000_1|RUNNING|None", "1001_1|PENDING|Dependency", "1002_1|PENDING|Dependency")

    states = {(state.run_id, state.step): state for state in step_states(plan)}

    assert states[ids[0], "fit"].state == "done"
    assert (states[ids[1], "fit"].state, states[ids[1], "fit"].detail) == ("running", "running on SLURM (job 1000_1)")
    assert (states[ids[1], "test"].state, states[ids[1], "test"].detail) == ("queued", "queued (job 1001_1)")
    assert states[ids[2], "fit"].state == "not started"  # no longer in the queue, no marker
    assert "| queued | queued (job 1002_1) |" in status_markdown(plan)


def test_status_without_squeue_shows_the_markers_and_says_why(slurm: Slurm, tmp_path: Path, caplog, monkeypatch):
    plan = load_plan(write_plan(tmp_path))
    submit_slurm(plan)
    (slurm.bin / "squeue").unlink()
    monkeypatch.setenv("PATH", str(slurm.bin))  # nor a real squeue (CI installs slurm-wlm for the local Slurm tests)

    with caplog.at_level("WARNING"):
        states = step_states(plan)

    assert {state.state for state in states} == {"not started"}
    assert "the SLURM queue is not shown: squeue not found" in caplog.text


def test_slurm_states_of_a_plan_never_submitted_asks_nothing(slurm: Slurm, tmp_path: Path):
    plan = load_plan(write_plan(tmp_path))
    assert slurm_states(plan) == {}
    assert not slurm.squeue_log.exists()


def test_a_refused_submission_keeps_the_jobs_submitted_before(slurm: Slurm, tmp_path: Path):
    plan = load_plan(write_plan(tmp_path, steps=("fit", "test"), slurm={"test": {"partition": "REFUSE"}}))
    with pytest.raises(SlurmError, match="Invalid partition name specified") as refused:
        submit_slurm(plan)
    assert "--dependency=aftercorr:1000" in str(refused.value)
    recorded = json.loads((plan.out / ".slurm" / "jobs.json").read_text())["jobs"]
    assert [(job["step"], job["job_id"]) for job in recorded] == [("fit", "1000")]

    write_plan(tmp_path, steps=("fit", "test"), slurm={"test": {"partition": "gpu"}})
    slurm.answer(*(f"1000_{task}|PENDING|Priority" for task in range(4)))
    jobs = submit_slurm(load_plan(tmp_path / "plan.yaml"))
    assert steps_and_dependencies(jobs) == [
        ("test", {i: run.id for i, run in enumerate(plan.runs)}, "aftercorr:1000"), ("report", {}, "afterany:1000:1001")
    ]  # fmt: skip


def test_dry_run_writes_the_scripts_and_submits_nothing(slurm: Slurm, tmp_path: Path):
    plan = load_plan(write_plan(tmp_path, report=False))
    jobs = submit_slurm(plan, dry_run=True)
    assert [(job.step, job.job_id, job.dependency) for job in jobs] == [
        ("fit", None, None), ("test", None, "aftercorr:<1-fit>"), ("analyze", None, "aftercorr:<1-fit>")
    ]  # fmt: skip
    assert all(job.script.is_file() for job in jobs)
    assert str(jobs[1]).startswith("test: not submitted (dry run), array 0-3 (4 runs), aftercorr:<1-fit>, ")
    assert slurm.submissions() == []
    assert not (plan.out / ".slurm" / "jobs.json").exists()


@pytest.mark.slow
def test_run_refuses_a_plan_whose_second_run_has_a_typo_before_submitting_anything(
    slurm: Slurm, tmp_path: Path, capsys: pytest.CaptureFixture
):
    done = kpca_experiment(capsys, "run", str(write_typo_plan(tmp_path)), "--executor", "slurm", cwd=tmp_path)
    assert_refused_before_anything_ran(done, tmp_path / "runs" / "typo")
    assert slurm.submissions() == []


def test_run_of_a_plan_without_report_says_how_to_get_one(slurm: Slurm, tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(experiment_cli, "_parse_error", lambda *_args: None)  # every step's arguments accepted
    path = write_plan(tmp_path, steps=("fit",), report=False)
    with pytest.raises(SystemExit) as exit_info:
        experiment_cli.main(["run", str(path), "--executor", "slurm"])
    out = capsys.readouterr().out.splitlines()
    assert exit_info.value.code == 0 and [call["argv"][-1] for call in slurm.submissions()] == [
        str(tmp_path / "runs" / "tiny" / ".slurm" / "1-fit.sbatch")
    ]  # the fit array, no report job
    assert out[0].startswith("fit: job 1000, array 0-3 (4 runs), ")
    assert out[1].startswith("no report: plan.yaml has no report section, so runs/tiny/report.md is not written; ")
    assert len(out) == 2


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"fit": {"array": "0-3"}}, r"slurm\.fit\.array: the executor sets --array itself"),
        ({"test": {"dependency": "afterok:1"}}, r"slurm\.test\.dependency: the executor sets --dependency itself"),
        ({"fit": {"time": 259200}}, r"slurm\.fit\.time: 259200 is not a quoted time .* quote it"),
        ({"fit": {"time": "3 days"}}, r"slurm\.fit\.time: '3 days' is not an sbatch time"),
        ({"fit": {"nodes": 0}}, r"slurm\.fit\.nodes: 0 is not a positive integer"),
        ({"report": {"cpus_per_task": "two"}}, r"slurm\.report\.cpus_per_task: 'two' is not a positive integer"),
        ({"fit": {"gpus_per_node": "eight"}}, r"slurm\.fit\.gpus_per_node: 'eight' is not a GPU count"),
        ({"fit": {"Partition": "gpu"}}, r"slurm\.fit\.Partition: 'Partition' is not an sbatch option name"),
        ({"fit": {"exclusive": False}}, r"slurm\.fit\.exclusive: false is not an sbatch option value"),
        ({"fit": {"comment": "two words"}}, r"slurm\.fit\.comment: 'two words' cannot be written into an #SBATCH"),
    ],
)
def test_bad_slurm_resources_are_refused_naming_the_key(slurm: Slurm, tmp_path: Path, resources, message):
    plan = load_plan(write_plan(tmp_path, slurm=resources))
    with pytest.raises(PlanError, match=message) as refused:
        submit_slurm(plan)
    assert str(refused.value).startswith(f"{plan.path}: slurm.")
    assert slurm.submissions() == []


def test_array_spec_writes_ranges():
    assert array_spec([0, 1, 2, 3]) == "0-3"
    assert array_spec([5, 0, 2, 3, 4]) == "0,2-5"
    assert array_spec([7]) == "7"


@pytest.fixture(scope="module")
def digits_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("digits_cache")
    write_digits_imagefolder(cache / "digits-32px", image_size=32)
    return cache


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds and ends processes through /proc")
def test_a_requeued_fit_task_resumes_from_its_hpc_checkpoint(slurm: Slurm, tmp_path: Path, digits_cache: Path):
    epochs, batches = 4, 2
    budget = [f"--trainer.max_epochs={epochs}", f"--trainer.limit_train_batches={batches}"]
    budget += ["--trainer.limit_val_batches=1"]
    overrides = [f"--data.cache_dir={digits_cache}", "--trainer.enable_progress_bar=false", *budget]
    plan = load_plan(write_plan(tmp_path, steps=("fit",), report=False, overrides=overrides))
    [fit] = submit_slurm(plan)
    (slurm.bin / "srun").write_text('#!/bin/sh\nexec "$@"\n')  # SLURM's srun runs the task (one, here)
    env = clean_env(
        SLURM_JOB_NAME="tiny-fit", SLURM_ARRAY_JOB_ID="4242", SLURM_ARRAY_TASK_ID="1", SLURM_JOB_ID="4244",
        SLURM_NTASKS="1", SLURM_NTASKS_PER_NODE="1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
        SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1",
    )  # fmt: skip
    env["PATH"] = os.pathsep.join([str(slurm.bin), env["PATH"]])
    run = plan.runs[1]  # array task 1
    last = run.folder / "fit" / "checkpoints" / "last.ckpt"
    hpc = run.folder / "hpc_ckpt_1.ckpt"

    job = start(["bash", fit.script], env, tmp_path, "job")
    try:
        wait_until(last.exists, "the first checkpoint", {"job": job}, tmp_path)
        [task] = children(job.pid)  # the script execs `kpca-experiment exec`, whose child is the app (srun execs)
        os.kill(task, signal.SIGUSR1)  # --signal=USR1@120 (no B:): SLURM signals the tasks, not the batch shell
        job.wait(timeout=TIMEOUT)
    finally:
        kill_all([job], env)
    log = (run.folder / "fit.log").read_text()
    assert job.returncode == 128 + signal.SIGTERM, stderr_of(tmp_path, "job")[-3000:] + log[-3000:]
    assert slurm.scontrol_log.read_text().splitlines() == ["requeue 4242_1"]
    step = torch.load(hpc, map_location="cpu", weights_only=True)["global_step"]
    assert 0 < step < epochs * batches, log[-3000:]
    last_step = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
    assert last_step <= step  # it stopped there
    assert not marker(run, "fit", "done").exists() and not marker(run, "fit", "running").exists()

    rerun = subprocess.run(["bash", fit.script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    log = (run.folder / "fit.log").read_text()
    assert rerun.returncode == 0, rerun.stderr[-3000:] + log[-3000:]
    restored = [(Path(path).resolve(), int(n)) for path, n in RESTORED.findall(log)]
    # After SIGUSR1 the fit stops at its next step boundary; when that is the end of an epoch it writes last.ckpt at
    # the hpc checkpoint's step, after it, and the newest checkpoint (the same step) is the one to resume from.
    expected = [(hpc.resolve(), step)] + ([(last.resolve(), step)] if last_step == step else [])
    assert len(restored) == 1 and restored[0] in expected, log[-3000:]
    assert marker(run, "fit", "done").is_file()
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == epochs * batches
    assert slurm.scontrol_log.read_text().splitlines() == ["requeue 4242_1"]  # the rerun was not requeued
    assert [other.id for other in plan.runs if other.folder.exists()] == [run.id]
