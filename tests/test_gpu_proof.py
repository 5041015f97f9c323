"""benchmarks/gpu_proof.py (``make test-gpu``) on the CPU: its step runner, its report, and real fits through the apps'
console scripts with ``--device cpu``."""

import datetime
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_support import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_proof.py"


gpu_proof = load_script(SCRIPT, "gpu_proof")
Step = gpu_proof.Step


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_every_step_has_a_time_limit_and_the_limits_fit_the_budget(tmp_path: Path):
    steps = gpu_proof.build_steps(gpu_proof.ProofConfig("cuda", tmp_path))
    assert [s.name for s in steps] == list(gpu_proof.TIME_LIMITS)
    side_by_side = [s.timeout_s for s in steps if s.name in gpu_proof.CONCURRENT_STEPS]
    one_by_one = [s.timeout_s for s in steps if s.name not in gpu_proof.CONCURRENT_STEPS]
    assert len(side_by_side) == 6 and len(one_by_one) == 5
    assert max(side_by_side) + sum(one_by_one) < gpu_proof.BUDGET_S == 480  # 8 minutes on one GPU
    gpu_proof.check_budget(gpu_proof.TIME_LIMITS)
    assert gpu_proof.planned_seconds({"tests": 300, "compile": 300, "attention": 100}) == 400  # side by side
    with pytest.raises(ValueError, match="add up to 480 s, over the 480 s budget"):
        gpu_proof.check_budget({"tests": 300, "attention": 180})


def test_the_two_test_steps_split_the_gpu_tests_between_them(tmp_path: Path):
    tests, compiled = gpu_proof.build_steps(gpu_proof.ProofConfig("cuda", tmp_path))[:2]
    assert tests.command[-len(gpu_proof.COMPILE_TESTS) :] == [
        "--ignore=tests/attention/test_compile.py",
        "--ignore=tests/attention/test_compile_cuda.py",
        "--deselect=tests/attention/test_triton_backend.py::test_custom_op_registration",
    ]
    assert compiled.command[-len(gpu_proof.COMPILE_TESTS) :] == list(gpu_proof.COMPILE_TESTS)
    assert all(Path(REPO, path.split("::")[0]).is_file() for path in gpu_proof.COMPILE_TESTS)
    assert tests.env == compiled.env == {"KPCA_REQUIRE_TRITON": "1"}  # on CUDA a broken Triton fails, never skips
    assert tests.command[8:10] == ["-n", "6"] and compiled.command[8:10] == ["-n", "3"]  # xdist workers
    cpu_tests = gpu_proof.build_steps(gpu_proof.ProofConfig("cpu", tmp_path))[0]
    assert "-n" not in cpu_tests.command  # one process on the CPU


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
    steps = [
        Step("fails", "exits 3", python("print('last words'); raise SystemExit(3)"), 60),
        Step("hangs", "sleeps past its limit", python("import time; print('started', flush=True); time.sleep(60)"), 2),
        Step("missing", "a command that does not exist", [str(tmp_path / "no-such-command")], 60),
        Step(
            "unreadable", "exits 0 without its results", python("pass"), 60,
            summarize=lambda folder: gpu_proof.pytest_summary(folder / "junit.xml"),
        ),
        Step("absent", "not on this machine", python("raise SystemExit(9)"), 60, unavailable=lambda: "no such option"),
        Step("passes", "reads its results", python("print('fine')"), 60, summarize=lambda _: ("3 numbers", "a table")),
    ]  # fmt: skip
    results = gpu_proof.run_steps(steps, tmp_path)
    assert [r.status for r in results] == ["failed", "timed out", "failed", "failed", "not available", "passed"]
    fails, hangs, missing, unreadable, absent, passes = results
    assert fails.returncode == 3 and "last words" in fails.log_tail
    assert 2 <= hangs.wall_s < 20 and "started" in hangs.log_tail and "time limit of 2 s" in hangs.log_tail
    assert "could not start" in missing.log_tail and "no-such-command" in missing.log_tail
    assert unreadable.returncode == 0 and unreadable.summary.startswith("results unreadable: FileNotFoundError")
    assert absent.summary == "no such option" and not absent.log_tail
    assert (passes.summary, passes.details, passes.log_tail) == ("3 numbers", "a table", "")
    assert gpu_proof.exit_status(results) == 1
    assert gpu_proof.exit_status([absent, passes]) == 0

    started = datetime.datetime(2026, 12, 3, 14, 5, tzinfo=datetime.timezone.utc)
    report = gpu_proof.render_report(results, {"GPU": "a test GPU"}, started, "Notes here.")
    assert report.startswith("# GPU proof, 2026-12-03 14:05 UTC\n")
    assert "| GPU | a test GPU |" in report
    assert "| result | FAIL: fails, hangs, missing, unreadable did not pass; not available: absent |" in report
    assert re.search(r"\| fails \| exits 3 \| failed \| [\d.]+ \| 60 \|  \|", report)
    assert re.search(r"\| passes \| reads its results \| passed \| [\d.]+ \| 60 \| 3 numbers \|", report)
    assert "## passes: passed\n\n`python -c print('fine')`\n\na table\n" in report
    failures = report.split("## Failures")[1]
    assert "### fails: failed (exit status 3)" in failures and "last words" in failures
    assert "### hangs: timed out" in failures and "passes" not in failures


def test_correctness_steps_run_side_by_side_and_benchmarks_alone_after_them(tmp_path: Path):
    """Two 1.5 s correctness steps end together; the benchmark starts after both and the results keep step order."""
    stamp = "import sys, time; open(sys.argv[1], 'w').write(str(time.time())); time.sleep(1.5); print(time.time())"
    steps = [
        Step("attention", "a benchmark", [*python(stamp), str(tmp_path / "attention.start")], 60),
        Step("tests", "a correctness step", [*python(stamp), str(tmp_path / "tests.start")], 60),
        Step("compile", "another one", [*python(stamp), str(tmp_path / "compile.start")], 60),
    ]
    start = time.perf_counter()
    results = gpu_proof.run_steps(steps, tmp_path / "work")
    assert [r.step.name for r in results] == ["attention", "tests", "compile"]
    assert all(r.status == "passed" for r in results)
    starts = {name: float((tmp_path / f"{name}.start").read_text()) for name in ("attention", "tests", "compile")}
    assert abs(starts["tests"] - starts["compile"]) < 1.0  # started together
    assert starts["attention"] >= max(starts["tests"], starts["compile"]) + 1.4  # after both had ended
    assert time.perf_counter() - start < 3 * 1.5 + 2


def test_a_benchmark_cut_short_reports_the_rows_it_finished(tmp_path: Path):
    write_then_hang = (
        "import pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text('| row | 1.0 |\\n- ratio: 1.0 PASS\\n'); "
        "print('wrote', flush=True); time.sleep(60)"
    )
    report = tmp_path / "realsize_x" / "x.md"
    step = Step(
        "realsize_x", "writes, then hangs", [*python(write_then_hang), str(report)], 3,
        summarize=lambda folder: gpu_proof.benchmark_summary(folder / "x.md"), partial_results=True,
    )  # fmt: skip
    (result,) = gpu_proof.run_steps([step], tmp_path)
    assert result.status == "timed out" and gpu_proof.exit_status([result]) == 1
    assert result.summary == "cut short; targets: 1 of 1 pass" and "| row | 1.0 |" in result.details
    assert "wrote" in result.log_tail


def test_input_pipeline_step_times_the_cpu_paths_without_dali(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    assert gpu_proof.missing_module("no_such_module_here.sub") == (
        "not available: no_such_module_here.sub is not installed (pip install 'kpca-vision-cls[dali]')"
    )
    monkeypatch.setattr(gpu_proof, "missing_module", lambda name: f"not available: {name} is not installed")
    step = gpu_proof.input_pipeline_step(gpu_proof.ProofConfig("cuda", tmp_path))
    assert "--dali" not in step.command and step.title.endswith("(DALI not available: nvidia.dali is not installed)")
    assert step.command[2:4] == ["--device", "cuda"]  # the batched RandAugment timed on the GPU
    monkeypatch.setattr(gpu_proof, "missing_module", lambda name: None)
    step = gpu_proof.input_pipeline_step(gpu_proof.ProofConfig("cuda", tmp_path))
    assert step.command[2:6] == ["--dali", "gpu", "--device", "cuda"]


def test_the_real_size_steps_run_each_apps_benchmark_with_the_proofs_selection(tmp_path: Path):
    steps = {s.name: s for s in gpu_proof.build_steps(gpu_proof.ProofConfig("cuda", tmp_path))}
    vision = steps["realsize_vision_cls"].command
    assert vision[1:4] == ["benchmarks/vision_cls.py", "--device", "cuda"] and "--profile" in vision
    assert vision[vision.index("--compiled-rows") + 1] == "symvit,rpc2all-triton"
    assert steps["realsize_language_model"].command[1:4] == ["benchmarks/language_model.py", "--device", "cuda"]
    assert steps["realsize_segmentation"].command[-4:-2] == ["--modes", "eager"]
    assert all(steps[f"realsize_{app}"].partial_results for app in gpu_proof.APPS)


def test_pytest_summary_counts_a_real_junit_report(tmp_path: Path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\n"
        "def test_passes():\n    pass\n\n"
        "def test_fails():\n    assert 1 == 2, 'one is not two'\n\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n"
    )
    junit = tmp_path / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "test_sample.py"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout
    summary, details = gpu_proof.pytest_summary(junit)
    assert summary == "1 passed, 1 failed, 0 errors, 1 skipped"
    assert "`test_sample::test_fails`: AssertionError: one is not two" in details and "test_passes" not in details


def test_the_report_is_written_whole(tmp_path: Path):
    path = tmp_path / "results" / "gpu.md"
    gpu_proof.write_atomically(path, "old")
    gpu_proof.write_atomically(path, "new report")
    assert path.read_text() == "new report" and [p.name for p in path.parent.iterdir()] == ["gpu.md"]


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
    assert re.search(r"\| eager \| RPC, 2 iterations in all layers \| [\d,]+ \| [\d.]+ \| [\d.]+ \|", text)
    assert (tmp_path / "work" / "fit_vision_cls" / "log.txt").is_file()  # a given --work-dir is kept
