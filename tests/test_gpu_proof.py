"""tools/gpu_proof.py (``make test-gpu``) on the CPU: its step runner, its report, and real fits through the apps'
console scripts with ``--device cpu``."""

import datetime
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_support import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_proof.py"
gpu_proof = load_script(SCRIPT, "gpu_proof")
Step = gpu_proof.Step


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def test_the_steps_at_their_limits_end_within_eight_minutes_on_one_gpu(tmp_path: Path):
    steps = gpu_proof.build_steps(gpu_proof.ProofConfig("cuda", tmp_path))
    assert [s.name for s in steps] == list(gpu_proof.TIME_LIMITS)
    gpu_proof.check_budget(gpu_proof.TIME_LIMITS)
    gpu_proof.check_budget({"tests": 300, "compile": 300, "attention": 100}, budget_s=401)  # side by side: 400 s
    with pytest.raises(ValueError, match="add up to 480 s, over the 480 s budget"):
        gpu_proof.check_budget({"tests": 300, "attention": 180})


def test_the_two_test_steps_run_every_gpu_test_once(tmp_path: Path):
    tests, compiled = gpu_proof.build_steps(gpu_proof.ProofConfig("cuda", tmp_path))[:2]
    assert all(Path(REPO, path.split("::")[0]).is_file() for path in gpu_proof.COMPILE_TESTS)
    left_out = [arg.split("=", 1)[1] for arg in tests.command if arg.startswith(("--ignore=", "--deselect="))]
    assert left_out == list(gpu_proof.COMPILE_TESTS) == compiled.command[-len(left_out) :]
    assert tests.env == compiled.env == {"KPCA_REQUIRE_TRITON": "1"}  # on CUDA a broken Triton fails, never skips
    cpu_tests = gpu_proof.build_steps(gpu_proof.ProofConfig("cpu", tmp_path))[0]
    assert "-n" not in cpu_tests.command and not cpu_tests.env  # one process on the CPU


def test_steps_are_selected_by_name_or_prefix(tmp_path: Path):
    steps = gpu_proof.build_steps(gpu_proof.ProofConfig("cuda", tmp_path))
    fits = ["fit_vision_cls", "fit_vision_cls_compiled", "fit_language_model", "fit_segmentation"]
    assert [s.name for s in gpu_proof.select_steps(steps, ["fit"])] == fits
    assert [s.name for s in gpu_proof.select_steps(steps, ["attention", "tests"])] == ["tests", "attention"]
    assert [s.name for s in gpu_proof.select_steps(steps, ["fit_vision_cls"])] == ["fit_vision_cls"]  # full name
    assert [s.name for s in gpu_proof.select_steps(steps, ["fit_vision"])] == fits[:2]
    with pytest.raises(ValueError, match="no step is named 'bench': pick from"):
        gpu_proof.select_steps(steps, ["bench"])


def test_a_failing_step_is_recorded_and_the_next_steps_still_run(tmp_path: Path):
    """One after another: a step that fails, one cut short by its limit after writing part of its report, one that
    cannot start, one whose results are unreadable, and one that passes; then the report of all five."""
    write_then_hang = (
        "import pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text('| row | 1.0 |\\n- ratio: 1.0 PASS\\n'); "
        "print('wrote', flush=True); time.sleep(600)"
    )
    steps = [
        Step("fails", "exits 3", python("print('last words'); raise SystemExit(3)"), 60),
        Step(
            "hangs", "writes, then hangs", python(write_then_hang, str(tmp_path / "hangs" / "x.md")), 10,
            summarize=lambda folder: gpu_proof.benchmark_summary(folder / "x.md"), partial_results=True,
        ),
        Step("missing", "a command that does not exist", [str(tmp_path / "no-such-command")], 60),
        Step("unreadable", "exits 0 without its results", python("pass"), 60, summarize=gpu_proof.pytest_summary),
        Step("passes", "reads its results", python("print('fine')"), 60, summarize=lambda _: ("3 numbers", "a table")),
    ]  # fmt: skip
    results = gpu_proof.run_steps(steps, tmp_path)
    assert [r.status for r in results] == ["failed", "timed out", "failed", "failed", "passed"]
    fails, hangs, missing, unreadable, passes = results
    assert fails.returncode == 3 and "last words" in fails.log_tail
    assert hangs.summary == "cut short; targets: 1 of 1 pass" and "| row | 1.0 |" in hangs.details
    assert "wrote" in hangs.log_tail and "time limit of 10 s" in hangs.log_tail
    assert "could not start" in missing.log_tail and "no-such-command" in missing.log_tail
    assert unreadable.returncode == 0 and unreadable.summary.startswith("results unreadable: FileNotFoundError")
    assert (passes.summary, passes.details, passes.log_tail) == ("3 numbers", "a table", "")
    assert gpu_proof.exit_status(results) == 1 and gpu_proof.exit_status([passes]) == 0

    started = datetime.datetime(2026, 12, 3, 14, 5, tzinfo=datetime.timezone.utc)
    report = gpu_proof.render_report(results, {"GPU": "a test GPU"}, started, "Notes here.")
    assert report.startswith("# GPU proof, 2026-12-03 14:05 UTC\n")
    assert "| GPU | a test GPU |" in report
    assert "| result | FAIL: fails, hangs, missing, unreadable did not pass |" in report
    assert re.search(r"\| fails \| exits 3 \| failed \| [\d.]+ \| 60 \|  \|", report)
    assert re.search(r"\| passes \| reads its results \| passed \| [\d.]+ \| 60 \| 3 numbers \|", report)
    assert "## passes: passed\n\n`python -c print('fine')`\n\na table\n" in report
    failures = report.split("## Failures")[1]
    assert "### fails: failed (exit status 3)" in failures and "last words" in failures
    assert "### hangs: timed out" in failures and "passes" not in failures


def test_correctness_steps_run_side_by_side_and_benchmarks_alone_after_them(tmp_path: Path):
    """Each correctness step waits for the other to start (run one after the other, the first would wait out its
    limit); the benchmark checks that both had ended when it started. The results keep the steps' order."""
    meet = (
        "import pathlib, sys, time; me, other = sys.argv[1:]; pathlib.Path(me + '.start').touch()\n"
        "while not pathlib.Path(other + '.start').exists(): time.sleep(0.05)\n"
        "pathlib.Path(me + '.end').touch()"
    )
    after = "import pathlib, sys; sys.exit(any(not pathlib.Path(p + '.end').exists() for p in sys.argv[1:]))"
    tests, compiled = str(tmp_path / "tests"), str(tmp_path / "compile")
    steps = [
        Step("attention", "a benchmark", python(after, tests, compiled), 60),
        Step("tests", "a correctness step", python(meet, tests, compiled), 60),
        Step("compile", "another one", python(meet, compiled, tests), 60),
    ]
    results = gpu_proof.run_steps(steps, tmp_path / "work")
    assert [(r.step.name, r.status) for r in results] == [
        ("attention", "passed"),
        ("tests", "passed"),
        ("compile", "passed"),
    ]


def test_without_dali_the_input_pipeline_step_still_times_the_cpu_paths(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(gpu_proof, "dali_installed", lambda: False)
    step = gpu_proof.input_pipeline_step(gpu_proof.ProofConfig("cuda", tmp_path))
    assert "--dali" not in step.command and "(DALI not available: nvidia.dali is not installed;" in step.title
    monkeypatch.setattr(gpu_proof, "dali_installed", lambda: True)
    step = gpu_proof.input_pipeline_step(gpu_proof.ProofConfig("cuda", tmp_path))
    assert step.command[2:6] == ["--device", "cuda", "--dali", "gpu"]  # DALI's GPU path and the batched RandAugment


def test_pytest_summary_counts_a_real_junit_report(tmp_path: Path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\n"
        "def test_passes():\n    pass\n\n"
        "def test_fails():\n    assert 1 == 2, 'one is not two'\n\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n"
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=junit.xml", "test_sample.py"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout
    summary, details = gpu_proof.pytest_summary(tmp_path)
    assert summary == "1 passed, 1 failed, 0 errors, 1 skipped"
    assert "`test_sample::test_fails`: AssertionError: one is not two" in details and "test_passes" not in details


@pytest.mark.slow  # about 50 s on 2 quiet cores, 110 s on busy ones
def test_fits_run_through_the_console_scripts_and_report_their_throughput(tmp_path: Path):
    """Two apps' fits on the CPU, 4 steps each, through the real ``vision-cls`` and ``language-model`` commands, side
    by side; then the language model's real-size benchmark at its tiny CPU shape, its report in the proof's."""
    report = tmp_path / "report.md"
    command = [
        sys.executable, str(SCRIPT), "--device", "cpu",
        "--steps", "fit_vision_cls,fit_language_model,realsize_language",
        "--fit-steps", "4", "--timeout-scale", "8", "--work-dir", str(tmp_path / "work"), "--output", str(report),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == str(report)
    text = report.read_text()
    assert "| GPU | none: --device cpu exercises the script on the CPU |" in text
    assert "| result | PASS: every step that ran passed |" in text
    row = r"\| {} \| [^|]+ \| passed \| [\d.]+ \| \d+ \| 4 steps, ([\d.]+) samples/s"
    vision = re.search(row.format("fit_vision_cls") + r" \|", text)
    lm = re.search(row.format("fit_language_model") + r", (\d+) tokens/s \|", text)
    assert vision and lm, text
    assert float(vision[1]) > 0 and float(lm[1]) > 0 and int(lm[2]) == pytest.approx(32 * float(lm[1]), rel=0.01)
    assert "fit_vision_cls_compiled" not in text and "## Failures" not in text
    assert re.search(
        r"\| realsize_language_model \| [^|]+ \| passed \| [\d.]+ \| \d+ \| targets: \d of 1 pass \|", text
    )
    assert re.search(
        r"\| eager \| RPC, 2 iterations in all layers \| [\d,.]+ \| [\d.]+ \| [\d.]+ \|", text
    )  # any speed
    assert (tmp_path / "work" / "fit_vision_cls" / "log.txt").is_file()  # a given --work-dir is kept
