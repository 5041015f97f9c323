"""What the benchmark scripts share: each case in a fresh interpreter, the worker's side, timing, targets, reports.

A script is both parent and worker. The parent builds one case (a JSON-able dict) per measurement and runs it as
``<script> --worker <case>`` in a fresh interpreter (:func:`spawn_case`), so that no case's memory, threads or
compiled graphs reach another; the worker (:func:`work`) runs the case with the runner of its ``kind`` and prints the
result as its last line. torch is imported inside the worker's functions: the parent only spawns workers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Sequence

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_MODES = ("eager", "compiled")
"""How the real-size tables run a model: as it is, or ``torch.compile``-d."""
GIB = 2**30
Check = tuple[str, float, str, float, bool]  # (name, value, "<=" or ">=", target, passed)


# --- the parent: every case in a fresh interpreter ---------------------------------------------------------------


def spawn(script: str, args: list[str]) -> dict:
    """Run ``script`` with ``args`` in a fresh interpreter and return the JSON object it prints last."""
    proc = subprocess.run([sys.executable, os.path.abspath(script), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{os.path.basename(script)} {args} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spawn_case(script: str, case: dict) -> dict:
    """``script --worker <case>``'s result, from a fresh interpreter."""
    return spawn(script, ["--worker", json.dumps(case)])


def spawn_or_error(script: str, case: dict) -> dict:
    """:func:`spawn_case`, or ``{"error": <its last stderr line>}`` if the worker fails."""
    try:
        return spawn_case(script, case)
    except RuntimeError as err:
        lines = [line for line in str(err).splitlines() if line.strip()]
        return {"error": lines[-1] if lines else "failed"}


def spawn_rounds(script: str, cases: dict[Hashable, dict], rounds: int) -> dict[Hashable, list[dict]]:
    """Each case's results over ``rounds`` rounds; in each round every case runs once, in turn."""
    runs: dict[Hashable, list[dict]] = {key: [] for key in cases}
    for _ in range(rounds):
        for key, case in cases.items():
            runs[key].append(spawn_case(script, case))
    return runs


def run_rows(script: str, cases: dict, render: Callable[[dict], str], output: str | None) -> dict:
    """Each row's result, measured in its own process, in order; a case with ``"skipped"`` (the reason) is not run.

    After each row the progress goes to stderr and the report so far to ``output``, so that a run cut short still
    reports the rows it finished.
    """
    results = {}
    for key, case in cases.items():
        results[key] = {"skipped": case["skipped"]} if "skipped" in case else spawn_or_error(script, case)
        print(f"{' '.join(filter(None, key))}: {progress(results[key])}", file=sys.stderr, flush=True)
        write_report(output, render(results))
    return results


def progress(result: dict) -> str:
    """One row's result in a few words, for the progress lines on stderr."""
    if "time_ms" in result:
        return f"{result['time_ms']:.2f} ms/step, first step {result['first_step_s']:.1f} s"
    return f"skipped: {result['skipped']}" if "skipped" in result else f"failed: {result['error']}"


def mode_rows(modes: Sequence[str], names: Sequence[str]) -> list[tuple[str, str]]:
    """The (mode, name) rows of a real-size table in running order: eager ones first."""
    return [(mode, name) for mode in STEP_MODES if mode in modes for name in names]


# --- the worker ------------------------------------------------------------------------------------------------


def work(case_json: str, runners: dict[str, Callable[[dict], dict]]) -> int:
    """Run the case with the runner of its ``kind`` on its ``threads``; print its result with the environment's."""
    import torch

    case = json.loads(case_json)
    if case.get("threads"):
        torch.set_num_threads(case["threads"])
    result = runners[case["kind"]](case)
    print(json.dumps({**result, **environment(case.get("device", "cpu"))}))
    return 0


def environment(device: str) -> dict:
    """The torch and Triton versions, intra-op threads and device name of this process."""
    import importlib.metadata

    import torch

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "not installed"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    return {"torch": torch.__version__, "triton": triton, "threads": torch.get_num_threads(), "device_name": name}


def autocast(device: str):
    """bf16 autocast on CUDA; a no-op context on CPU (fp32)."""
    import torch

    return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda")


def synchronize(device: str) -> None:
    """Wait for queued CUDA work so that wall-clock times cover it."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(step: Callable[[], None], device: str, warmup: int, steps: int) -> dict:
    """Run ``warmup`` untimed calls of ``step``, then ``steps`` timed ones, each synchronised.

    Returns the median step time (``time_ms``) and the fastest (``best_ms``), the first call's time (s; compiled,
    it includes the compilation), the timed steps and the peak GPU memory (GiB since the process started; None on
    CPU).
    """
    import torch

    times = []
    for _ in range(warmup + steps):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {
        "time_ms": statistics.median(times[warmup:]) * 1e3,
        "best_ms": min(times[warmup:]) * 1e3,
        "first_step_s": times[0],
        "steps": steps,
        "peak_gib": torch.cuda.max_memory_allocated() / GIB if device == "cuda" else None,
    }


def decay_groups(net) -> list[dict]:
    """The apps' optimizer parameter groups: weight decay on matrices, none on vectors and ``net.no_weight_decay()``."""
    skip, params = net.no_weight_decay(), list(net.named_parameters())
    return [
        {"params": [p for name, p in params if p.ndim > 1 and name not in skip]},
        {"params": [p for name, p in params if p.ndim <= 1 or name in skip], "weight_decay": 0.0},
    ]


def read_config(path: str) -> dict:
    """The YAML config at ``path``, relative to the repository root."""
    with open(os.path.join(REPO, path)) as f:
        return yaml.safe_load(f)


# --- options and the report --------------------------------------------------------------------------------------


def csv(choices: Sequence[str]):
    """An argparse type: a comma-separated list of names, each one of ``choices``."""

    def parse(text: str) -> list[str]:
        names = [name for name in text.split(",") if name]
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {', '.join(choices)}")
        return names

    return parse


def add_common_options(p: argparse.ArgumentParser) -> None:
    """``--threads``, ``--output`` and the hidden ``--worker``."""
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--output", help="also write the Markdown report to this path")
    p.add_argument("--worker", help=argparse.SUPPRESS)


def check(name: str, value: float, op: str, target: float) -> Check:
    """One target check: ``value <= target`` or ``value >= target``."""
    if op not in ("<=", ">="):
        raise ValueError(f"op must be '<=' or '>=', got {op!r}")
    return name, value, op, target, value <= target if op == "<=" else value >= target


def render_targets(checks: list[Check], digits: int = 3) -> list[str]:
    """``Targets:`` and one ``- <name>: <value> (target <op> <target>) PASS|FAIL`` line per check (none: nothing)."""
    lines = [f"- {n}: {v:.{digits}f} (target {op} {t}) {'PASS' if ok else 'FAIL'}" for n, v, op, t, ok in checks]
    return ["", "Targets:", "", *lines] if lines else []


def settings_line(results: dict, device: str, dtype: str) -> str:
    """A real-size report's first line: the device, ``dtype``, and the torch, Triton and threads of the workers."""
    env = next((r for r in results.values() if "torch" in r), {})
    return (
        f"device={device} ({env.get('device_name', '?')}) dtype={dtype} torch={env.get('torch', '?')} "
        f"triton={env.get('triton', '?')} threads={env.get('threads', '?')}"
    )


def rate_table(
    results: dict[tuple[str, str], dict], labels: dict[str, str], columns: tuple[str, str], items_per_step: int
) -> list[str]:
    """Markdown rows of a real-size training-step table, each row's ratio to the symmetric row of the same mode.

    Args:
        results: ``(mode, name) -> {"time_ms", "peak_gib", "first_step_s"}``, or ``{"error"}`` for a failed row.
        labels: each name's label in the table.
        columns: the headers of the name column and of the rate column (e.g. ``("model", "img/s")``).
        items_per_step: images or tokens per step, for the rate.
    """
    name_header, rate_header = columns
    lines = [
        f"| mode | {name_header} | {rate_header} | ms/step | / symmetric | peak GPU memory (GiB) | first step (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (mode, name), r in results.items():
        head = f"| {mode} | {labels[name]} |"
        if "time_ms" not in r:
            lines.append(f"{head} failed: {r['error']} | | | | |")
            continue
        base = results.get((mode, "symmetric"), {})
        ratio = f"{r['time_ms'] / base['time_ms']:.3f}" if "time_ms" in base else "-"
        peak = "n/a" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        rate = items_per_step / r["time_ms"] * 1e3
        shown = f"{rate:,.{1 if rate < 100 else 0}f}"  # one decimal below 100 (a CPU's img/s)
        lines.append(f"{head} {shown} | {r['time_ms']:.2f} | {ratio} | {peak} | {r['first_step_s']:.1f} |")
    return lines


def write_report(path: str | None, report: str) -> None:
    """Write the Markdown ``report`` to ``path`` (its folder created) when a path is given."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(report)


def publish(report: str, output: str | None) -> None:
    """Print the report and write it to ``output`` when given."""
    print(report, end="")
    write_report(output, report)
