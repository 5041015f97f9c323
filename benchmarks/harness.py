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
