"""``make test``'s workers keep an ``xdist_group`` together (``--dist loadgroup``): the `slurm` tests share one local
Slurm, which the worker that starts it stops when its session ends, so they must all run on that worker. pytest 9.2
with pytest-xdist 3.8 spreads a group over the workers without a word (pytest-dev/pytest-xdist#1386)."""

import subprocess
import sys
from pathlib import Path

import pytest

INNER = """
import os
from pathlib import Path

import pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("case", range(6))
def test_grouped(case):
    Path(f"ran-{case}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


@pytest.mark.slow
def test_a_group_runs_on_one_worker(tmp_path: Path):
    (tmp_path / "test_inner.py").write_text(INNER)
    command = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q",
               "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "6 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    workers = {path.read_text() for path in tmp_path.glob("ran-*")}
    assert len(workers) == 1, workers
