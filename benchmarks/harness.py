"""What the benchmark scripts share: each case in a fresh interpreter, target checks, and the report file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

Check = tuple[str, float, str, float, bool]  # (name, value, "<=" or ">=", target, passed)


def spawn(script: str, args: list[str]) -> dict:
    """Run ``script`` with ``args`` in a fresh interpreter and return the JSON object it prints last."""
    proc = subprocess.run([sys.executable, os.path.abspath(script), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{os.path.basename(script)} {args} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check(name: str, value: float, op: str, target: float) -> Check:
    """One target check: ``value <= target`` or ``value >= target``."""
    if op not in ("<=", ">="):
        raise ValueError(f"op must be '<=' or '>=', got {op!r}")
    return name, value, op, target, value <= target if op == "<=" else value >= target


def write_report(path: str | None, report: str) -> None:
    """Write the Markdown ``report`` to ``path`` (its folder created) when a path is given."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(report)


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
