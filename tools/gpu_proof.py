"""`make test-gpu`: the GPU side of the project proved in one run, written up as one Markdown report.

Each step is a subprocess with its own time limit, run from the repository root; its wall time is recorded, and a
step that fails or runs out of time is recorded with the tail of its log while the other steps still run. The
correctness steps run side by side first: the gpu/triton tests (``pytest -m "gpu or triton"``) without the compile
tests, the compile tests, and a short fit of each app through its console script. The benchmarks then run one after
another, each alone on the GPU: ``benchmarks/attention.py``, ``benchmarks/input_pipeline.py`` and each app's
real-size training step. The longest correctness limit plus the benchmarks' limits stays under 8 minutes on one
CUDA GPU; the exit status is 1 when any step failed or timed out. Every step works in a temporary folder, removed
when every step passed and kept (its path in the report) otherwise. What each step runs: docs/benchmarks.md,
"On a GPU". Run from the repository root::

    python tools/gpu_proof.py                          # every step on CUDA; report in benchmarks/results/
    python tools/gpu_proof.py --steps fit,attention    # some steps (names or prefixes of names)
    python tools/gpu_proof.py --device cpu --steps fit --fit-steps 6 --timeout-scale 4   # the fits on CPU
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kpca.training.files import write_atomic

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 480
"""The whole run on one CUDA GPU: the concurrent steps' longest limit plus the sequential steps' limits, under it."""
TIME_LIMITS = {
    "tests": 100,
    "compile": 100,
    "fit_vision_cls": 60,
    "fit_vision_cls_compiled": 90,
    "fit_language_model": 45,
    "fit_segmentation": 45,
    "attention": 60,
    "input_pipeline": 40,
    "realsize_vision_cls": 165,
    "realsize_language_model": 80,
    "realsize_segmentation": 30,
}
"""Each step's time limit in seconds on one CUDA GPU (``--timeout-scale`` multiplies them); where they come from:
docs/benchmarks.md, "On a GPU". A real-size benchmark that runs out of time still reports the rows it finished."""
CONCURRENT_STEPS = (
    "tests", "compile", "fit_vision_cls", "fit_vision_cls_compiled", "fit_language_model", "fit_segmentation",
)  # fmt: skip
"""The correctness steps: run side by side first (their fits' throughput is therefore no benchmark); every other
step is a benchmark and runs alone on the GPU afterwards, one after another."""
REALSIZE_OPTIONS = {
    "cuda": {
        "vision_cls": ["--profile", "--compiled-rows", "symvit,rpc2all-triton"],
        "language_model": [],
        "segmentation": ["--modes", "eager"],
    },
    "cpu": {
        "vision_cls": ["--real-size", "--arches", "deit_tiny", "--modes", "eager", "--backends", "torch",
                       "--batch", "2", "--img-size", "32", "--steps", "2", "--warmup", "1"],
        "language_model": ["--paper-size", "--vocab", "2000", "--context", "32", "--depth", "2", "--batch", "2",
                           "--steps", "2", "--warmup", "1", "--modes", "eager"],
        "segmentation": ["--image-size", "64", "--batch", "2", "--steps", "2", "--warmup", "1", "--modes", "eager"],
    },
}  # fmt: skip
"""Each real-size benchmark's options beside ``--device``: on CUDA the proof's selection, on CPU tiny shapes that
exercise the same code in seconds."""
TEST_WORKERS = {"tests": 6, "compile": 3}
"""pytest-xdist workers per test step when pytest-xdist is installed (most of their time is Triton's and Inductor's
JIT, on the CPU)."""
COMPILE_TESTS = (
    "tests/attention/test_compile.py",
    "tests/attention/test_compile_cuda.py",
    "tests/attention/test_triton_backend.py::test_custom_op_registration",
)
"""Step 2's tests; step 1 leaves them out, so that the two steps together are ``pytest -m "gpu or triton"``."""
TEST_MARKERS = "gpu or triton"
FIT_STEPS = 40
TRAINER_CONFIGS = {"cuda": "configs/trainer/gpu_1x_bf16.yaml", "cpu": "configs/trainer/cpu.yaml"}
APPS = {"vision_cls": "vision-cls", "language_model": "language-model", "segmentation": "segmentation"}
"""Each app's folder under configs/ and its console script."""
STATUSES_THAT_FAIL = ("failed", "timed out")
LOG_TAIL_LINES = 40
LOG_TAIL_CHARS = 6000
KILL_GRACE_S = 10


@dataclass(frozen=True)
class Step:
    """One step of the proof: a command, its time limit, and how to read its results.

    Args:
        name: short name (``--steps`` selects by it).
        title: what it runs, for the report.
        command: the subprocess, run in the repository root.
        timeout_s: time limit of the subprocess in seconds.
        summarize: reads the step's results from its folder: a one-line summary and a Markdown section (either may
            be empty); an exception marks the step failed with its message.
        env: variables added to the environment of the command.
        partial_results: ``summarize`` also runs after a timeout (the step writes its results as it goes).
    """

    name: str
    title: str
    command: list[str]
    timeout_s: float
    summarize: Callable[[Path], tuple[str, str]] | None = None
    env: dict[str, str] = field(default_factory=dict)
    partial_results: bool = False


@dataclass
class StepResult:
    """What a step did: ``status`` is passed, failed or timed out."""

    step: Step
    status: str
    wall_s: float
    returncode: int | None = None
    summary: str = ""
    details: str = ""
    log_tail: str = ""


# --- running steps --------------------------------------------------------------------------


def run_step(step: Step, folder: Path) -> StepResult:
    """Run ``step`` with ``folder`` (created) holding its log and results; never raises for the step's failures."""
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    log = folder / "log.txt"
    returncode, timed_out = run_command(step, log)
    wall = time.perf_counter() - start
    status = "timed out" if timed_out else "passed" if returncode == 0 else "failed"
    result = StepResult(step, status, wall, returncode)
    if step.summarize and timed_out and step.partial_results:
        with contextlib.suppress(Exception):  # whatever it finished before its time ran out, if anything
            result.summary, result.details = step.summarize(folder)
            result.summary = f"cut short; {result.summary}"
    elif step.summarize and not timed_out:
        try:
            result.summary, result.details = step.summarize(folder)
        except Exception as error:  # the results are unreadable: the step failed, whatever its exit status
            result.status, result.summary = "failed", f"results unreadable: {type(error).__name__}: {error}"
    if result.status in STATUSES_THAT_FAIL:
        result.log_tail = log_tail(log)
    return result


def run_command(step: Step, log: Path) -> tuple[int | None, bool]:
    """Run the step's command, its output into ``log``; (exit status, whether it ran out of time).

    The command runs in a session of its own, so that a timeout ends it with every process it started.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **step.env}
    with open(log, "w") as out:
        try:
            process = subprocess.Popen(
                step.command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as error:
            out.write(f"could not start {step.command[0]!r}: {error}\n")
            return None, False
        try:
            return process.wait(timeout=step.timeout_s), False
        except subprocess.TimeoutExpired:
            stop_session(process)
            out.write(f"\n[gpu_proof] stopped after the step's time limit of {step.timeout_s:.0f} s\n")
            return process.returncode, True


def stop_session(process: subprocess.Popen) -> None:
    """SIGTERM the process's session, then SIGKILL it if it is still running after ``KILL_GRACE_S``."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


def log_tail(log: Path) -> str:
    """The last ``LOG_TAIL_LINES`` lines of ``log`` (at most ``LOG_TAIL_CHARS`` characters)."""
    if not log.is_file():
        return "(no log)"
    lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return "\n".join(lines)[-LOG_TAIL_CHARS:]


def run_steps(steps: list[Step], work_dir: Path) -> list[StepResult]:
    """Run every step, each in ``work_dir / step.name``, whatever became of the others; results in step order.

    The steps named in ``CONCURRENT_STEPS`` run first, side by side; the others then run one after another.
    """
    side_by_side = [s for s in steps if s.name in CONCURRENT_STEPS]
    one_by_one = [s for s in steps if s.name not in CONCURRENT_STEPS]
    results: dict[str, StepResult] = {}
    if side_by_side:
        names = ", ".join(s.name for s in side_by_side)
        print(f"side by side: {names}", file=sys.stderr, flush=True)
        with ThreadPoolExecutor(max_workers=len(side_by_side)) as pool:
            for result in pool.map(lambda step: run_step(step, work_dir / step.name), side_by_side):
                print(f"    {result.step.name}: {result.status} in {result.wall_s:.1f} s  {result.summary}",
                      file=sys.stderr, flush=True)  # fmt: skip
                results[result.step.name] = result
    for index, step in enumerate(one_by_one, 1):
        print(f"[{index}/{len(one_by_one)}] {step.name}: {step.title}", file=sys.stderr, flush=True)
        result = run_step(step, work_dir / step.name)
        print(f"    {result.status} in {result.wall_s:.1f} s  {result.summary}", file=sys.stderr, flush=True)
        results[step.name] = result
    return [results[s.name] for s in steps]


def exit_status(results: list[StepResult]) -> int:
    """1 when a step failed or timed out, else 0."""
    return int(any(r.status in STATUSES_THAT_FAIL for r in results))


def check_budget(limits: dict[str, float], budget_s: float = BUDGET_S) -> None:
    """Raise ValueError unless the steps at their limits end within ``budget_s``.

    The steps take at most the concurrent steps' longest limit plus every other step's limit.
    """
    concurrent = [limit for name, limit in limits.items() if name in CONCURRENT_STEPS]
    total = max(concurrent, default=0) + sum(t for name, t in limits.items() if name not in CONCURRENT_STEPS)
    if total >= budget_s:
        raise ValueError(
            f"the steps' time limits add up to {total:.0f} s, over the {budget_s} s budget: lower TIME_LIMITS"
        )


# --- reading results ------------------------------------------------------------------------


def pytest_summary(folder: Path) -> tuple[str, str]:
    """``N passed, N failed, N errors, N skipped`` from pytest's JUnit XML in ``folder``, and the failed tests."""
    root = ElementTree.parse(folder / "junit.xml").getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    summary = f"{passed} passed, {counts['failures']} failed, {counts['errors']} errors, {counts['skipped']} skipped"
    failed = []
    for case in (c for s in suites for c in s.iter("testcase")):
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            message = (problem.get("message") or "").splitlines()[:1]
            failed.append(f"- `{case.get('classname')}::{case.get('name')}`: {' '.join(message)[:300]}")
    return summary, "\n".join(["Failed:", "", *failed]) if failed else ""


def benchmark_summary(report: Path) -> tuple[str, str]:
    """How many of a benchmark's targets pass, and its Markdown report (the rows it finished, if cut short)."""
    details = report.read_text().strip()
    targets = [line for line in details.splitlines() if line.startswith("- ") and line.endswith(("PASS", "FAIL"))]
    passed = sum(line.endswith("PASS") for line in targets)
    return (f"targets: {passed} of {len(targets)} pass" if targets else "report below"), details


def fit_summary(folder: Path, expected_steps: int) -> tuple[str, str]:
    """Steps trained and the last logged training throughput of the fit whose runs are in ``folder / "runs"``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted((folder / "runs").glob("lightning_logs/version_*"))
    if not runs:
        raise FileNotFoundError(f"no run folder under {folder / 'runs'}: the fit wrote no TensorBoard events")
    events = EventAccumulator(str(runs[-1]))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    if "train/device/samples_per_sec" not in scalars:
        raise ValueError(f"{runs[-1]} has no train/device/samples_per_sec: the Throughput callback logged nothing")
    steps = int(events.Scalars("train/batches")[-1].value)
    if steps < expected_steps:
        raise ValueError(f"the fit trained {steps} steps, not {expected_steps}: its training set is too small")
    numbers = [f"{steps} steps", f"{events.Scalars('train/device/samples_per_sec')[-1].value:.1f} samples/s"]
    if "train/device/items_per_sec" in scalars:
        numbers.append(f"{events.Scalars('train/device/items_per_sec')[-1].value:.0f} tokens/s")
    return ", ".join(numbers), ""


# --- the steps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProofConfig:
    """What the steps run on: ``device`` (cuda or cpu), the working folder, fit length, time-limit factor."""

    device: str
    work_dir: Path
    fit_steps: int = FIT_STEPS
    timeout_scale: float = 1.0


def build_steps(config: ProofConfig) -> list[Step]:
    """Every step of the proof, in order: the correctness steps (run side by side), then the benchmarks."""
    fits = [fit_step(config, "vision_cls"), fit_step(config, "vision_cls", compiled=True)]
    fits += [fit_step(config, app) for app in APPS if app != "vision_cls"]
    benchmarks = [attention_step(config), input_pipeline_step(config), *realsize_steps(config)]
    return [*pytest_steps(config), *fits, *benchmarks]


def limit(config: ProofConfig, name: str) -> float:
    """The step's time limit for this run."""
    return TIME_LIMITS[name] * config.timeout_scale


def pytest_steps(config: ProofConfig) -> list[Step]:
    """Steps 1 and 2: the gpu / triton tests without the compile tests, then the compile tests.

    Each runs in its ``TEST_WORKERS`` of pytest-xdist workers on CUDA where pytest-xdist is installed; on CUDA a
    broken Triton fails them (``KPCA_REQUIRE_TRITON=1``) instead of skipping them.
    """
    files = [path for path in COMPILE_TESTS if "::" not in path]
    leave_out = [f"--ignore={path}" for path in files] + [f"--deselect={t}" for t in COMPILE_TESTS if "::" in t]
    runs = {
        "tests": (f'pytest -m "{TEST_MARKERS}" (without the compile tests)', ["tests", *leave_out]),
        "compile": ("the compile tests and opcheck of the kpca custom ops", list(COMPILE_TESTS)),
    }
    parallel = config.device == "cuda" and importlib.util.find_spec("xdist") is not None
    env = {"KPCA_REQUIRE_TRITON": "1"} if config.device == "cuda" else {}
    steps = []
    for name, (title, targets) in runs.items():
        workers = ["-n", str(TEST_WORKERS[name])] if parallel else []
        junit = f"--junitxml={config.work_dir / name / 'junit.xml'}"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", TEST_MARKERS, *workers, junit]
        steps.append(Step(name, title, [*command, *targets], limit(config, name), pytest_summary, env=env))
    return steps


def benchmark_step(
    config: ProofConfig, name: str, script: str, options: list[str], note: str = "", partial: bool = False
) -> Step:
    """``benchmarks/<script> --device <device> <options> --output <report>``, summarised from its report.

    ``partial``: the benchmark rewrites its report after each row, so when it runs out of time the report still
    gives the rows it finished.
    """
    report = f"{Path(script).stem}.md"
    command = [sys.executable, f"benchmarks/{script}", "--device", config.device, *options]
    output = ["--output", str(config.work_dir / name / report)]
    return Step(
        name, " ".join(display(command)[1:]) + note, [*command, *output], limit(config, name),
        lambda folder: benchmark_summary(folder / report), partial_results=partial,
    )  # fmt: skip


def attention_step(config: ProofConfig) -> Step:
    """Step 4: the attention benchmark in bf16 on CUDA (fp32 up to N = 4096 on CPU), its targets checked."""
    dtype = "bfloat16" if config.device == "cuda" else "float32"
    return benchmark_step(config, "attention", "attention.py", ["--dtype", dtype, "--check"])


def input_pipeline_step(config: ProofConfig) -> Step:
    """Step 5: the input-pipeline benchmark, with its DALI path on the GPU where DALI is installed.

    Without DALI (``kpca-vision-cls[dali]``, about 700 MB) the CPU paths are still timed and the title says so.
    """
    dali = ["--dali", "gpu" if config.device == "cuda" else "cpu"] if dali_installed() else []
    note = "" if dali else " (DALI not available: nvidia.dali is not installed; pip install 'kpca-vision-cls[dali]')"
    return benchmark_step(config, "input_pipeline", "input_pipeline.py", dali, note)


def dali_installed() -> bool:
    """Whether NVIDIA DALI (``kpca-vision-cls[dali]``, about 700 MB) is installed here."""
    return importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None


def realsize_steps(config: ProofConfig) -> list[Step]:
    """Step 6: each app's real-size training step (``benchmarks/<app>.py``): img/s or tokens/s, eager and compiled."""
    options = REALSIZE_OPTIONS[config.device]
    return [benchmark_step(config, f"realsize_{app}", f"{app}.py", options[app], partial=True) for app in options]


def fit_step(config: ProofConfig, app: str, compiled: bool = False) -> Step:
    """A short fit of ``app`` on its smoke config through its console script (``compiled``: ``--model.compile``)."""
    name = f"fit_{app}" + ("_compiled" if compiled else "")
    folder = config.work_dir / name
    smoke = f"configs/{app}/smoke.yaml"
    steps, window = config.fit_steps, max(2, config.fit_steps // 2)
    options = [
        "-c", TRAINER_CONFIGS[config.device], "-c", smoke, f"--data.cache_dir={config.work_dir / 'cache' / app}",
        f"--trainer.default_root_dir={folder}", f"--trainer.logger.init_args.save_dir={folder / 'runs'}",
        "--trainer.enable_progress_bar=false", "--trainer.max_epochs=1", f"--trainer.limit_train_batches={steps}",
        "--trainer.limit_val_batches=2", "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1",
        f"--throughput.window_size={window}", *app_options(app, steps), *(["--model.compile=true"] if compiled else []),
    ]  # fmt: skip
    script = APPS[app]
    title = f"{script} fit: smoke config, {Path(TRAINER_CONFIGS[config.device]).stem}, {steps} steps"
    return Step(
        name, title + (", --model.compile true" if compiled else ""), [console_script(script), "fit", *options],
        limit(config, name), lambda folder: fit_summary(folder, steps),
    )  # fmt: skip


def app_options(app: str, steps: int) -> list[str]:
    """The app's own fit options.

    Vision: the RPC diagnostics record every step in both vision fits, so that the compiled one keeps one training
    graph (switching them on and off recompiles) and the two do the same work. Segmentation: enough synthetic images
    for ``steps`` batches (the smoke set has 4).
    """
    if app == "vision_cls":
        return ["--rpc_diagnostics.every_n_steps=1"]
    if app == "segmentation":
        batch = yaml.safe_load((REPO / "configs" / app / "smoke.yaml").read_text())["data"]["batch_size"]
        return [f"--data.synthetic.num_train={batch * steps}"]
    return []


def console_script(name: str) -> str:
    """The console script ``name`` of this interpreter's environment, else the one on PATH, else the bare name.

    A bare name that does not exist fails its step with "could not start 'name'" in the report.
    """
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name) or name


def select_steps(steps: list[Step], names: list[str] | None) -> list[Step]:
    """The steps named by ``names``, in run order: a step's full name selects it, a prefix every step it begins.

    ``fit`` selects every fit; ``fit_vision_cls`` the eager vision fit only, ``fit_vision`` both vision fits.
    """
    if not names:
        return steps
    chosen = set()
    for name in names:
        exact = {s.name for s in steps if s.name == name}
        chosen |= exact or {s.name for s in steps if s.name.startswith(name)}
        if not exact and not any(s.name.startswith(name) for s in steps):
            raise ValueError(f"no step is named {name!r}: pick from {[s.name for s in steps]} (or a prefix, e.g. fit)")
    return [s for s in steps if s.name in chosen]


# --- the report -----------------------------------------------------------------------------


def environment(device: str) -> dict[str, str]:
    """The GPU (name, compute capability, memory) and the versions of torch, CUDA, Triton, Python."""
    import torch

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        gpu = f"{torch.cuda.get_device_name(0)} (compute capability {props.major}.{props.minor}, "
        gpu += f"{props.total_memory / 2**30:.0f} GiB; {torch.cuda.device_count()} visible)"
    else:
        gpu = "none: --device cpu exercises the script on the CPU"
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "not installed"
    return {
        "GPU": gpu,
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})",
        "Triton": triton,
        "Python": f"{platform.python_version()} on {platform.platform()}, {os.cpu_count()} CPU cores",
    }


def render_report(results: list[StepResult], env: dict[str, str], started: datetime.datetime, notes: str) -> str:
    """The Markdown report: the machine, one row per step, each step's section, then the failures' log tails."""
    failing = [r.step.name for r in results if r.status in STATUSES_THAT_FAIL]
    verdict = f"FAIL: {', '.join(failing)} did not pass" if failing else "PASS: every step that ran passed"
    limits = sum(r.step.timeout_s for r in results)
    lines = [f"# GPU proof, {started:%Y-%m-%d %H:%M} UTC", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in env.items()]
    lines += [
        f"| time | {sum(r.wall_s for r in results):.0f} s for {len(results)} steps, limits {limits:.0f} s "
        f"(budget on one GPU: {BUDGET_S} s) |",
        f"| result | {verdict} |",
        "",
        notes,
        "",
        "| step | runs | status | wall (s) | limit (s) | key numbers |",
        "|---|---|---|---:|---:|---|",
    ]
    lines += [
        f"| {r.step.name} | {r.step.title} | {r.status} | {r.wall_s:.1f} | {r.step.timeout_s:.0f} | {r.summary} |"
        for r in results
    ]
    for r in results:
        lines += ["", f"## {r.step.name}: {r.status}", "", f"`{' '.join(display(r.step.command))}`"]
        lines += ["", r.details] if r.details else []
    tails = [r for r in results if r.log_tail]
    if tails:
        lines += ["", "## Failures"]
    for r in tails:
        lines += ["", f"### {r.step.name}: {r.status} (exit status {r.returncode})", "", "```text", r.log_tail, "```"]
    return "\n".join(lines) + "\n"


def display(command: list[str]) -> list[str]:
    """The command as a reader would type it: paths inside the repository relative, this Python as ``python``."""
    shown = ["python" if part == sys.executable else part for part in command]
    return [part.replace(f"{REPO}/", "") for part in shown]


# --- the command ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: exercise the script without a GPU")
    p.add_argument("--steps", help="comma-separated step names or prefixes (default: every step)")
    p.add_argument("--fit-steps", type=int, default=FIT_STEPS, help="training steps of each fit (at least 4)")
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every step's time limit")
    p.add_argument("--work-dir", type=Path, help="keep the steps' logs and runs here (default: a temporary folder)")
    p.add_argument("--output", type=Path, help="the report (default: benchmarks/results/gpu-<UTC time>.md)")
    args = p.parse_args(argv)
    if args.fit_steps < 4:
        p.error(f"--fit-steps must be at least 4 (the throughput is a mean over the second half), got {args.fit_steps}")
    if args.timeout_scale <= 0:
        p.error(f"--timeout-scale must be positive, got {args.timeout_scale}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the selected steps, write the report, print its path, and return the exit status."""
    args = parse_args(argv)
    check_budget(TIME_LIMITS)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "no CUDA device here (torch.cuda.is_available() is False): run on a CUDA machine, or pass --device cpu"
        )
    started = datetime.datetime.now(datetime.timezone.utc)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="kpca-gpu-proof-"))
    config = ProofConfig(args.device, work_dir.resolve(), args.fit_steps, args.timeout_scale)
    try:
        steps = select_steps(build_steps(config), args.steps.split(",") if args.steps else None)
    except ValueError as error:
        if args.work_dir is None:
            work_dir.rmdir()  # nothing ran in it
        sys.exit(str(error))
    results = run_steps(steps, config.work_dir)
    status = exit_status(results)
    if status == 0 and args.work_dir is None:
        shutil.rmtree(work_dir)
        notes = "Every step passed; their temporary folder was removed."
    else:
        notes = f"The steps' logs and runs are in `{config.work_dir}`."
    output = args.output or REPO / "benchmarks" / "results" / f"gpu-{started:%Y-%m-%dT%H%MZ}.md"
    report = render_report(results, environment(args.device), started, notes)
    write_atomic(output, lambda file: file.write(report), "w")  # no reader sees half a report
    print(output)
    return status


if __name__ == "__main__":
    sys.exit(main())
