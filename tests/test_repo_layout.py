"""The monorepo's wiring: every distribution installs through dev.txt, and the tree is lint-clean."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = sorted(p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("*/*/pyproject.toml"))


def test_every_distribution_is_in_dev_requirements_and_the_uv_workspace():
    dev = (ROOT / "requirements" / "dev.txt").read_text()
    workspace = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]
    covered = {m for pattern in workspace for m in MEMBERS if Path(m).match(pattern)}
    assert MEMBERS, "no distribution found under packages/ or apps/"
    for member in MEMBERS:
        assert f"-e ./{member}" in dev, f"{member} is missing from requirements/dev.txt"
        assert member in covered, f"{member} is missing from [tool.uv.workspace] members"


def test_constraints_pin_every_package_exactly():
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            assert "==" in line, f"constraint {line!r} is not an exact pin"


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff(command):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))  # installed by requirements/dev.txt
    assert ruff is not None, "ruff is missing from the environment; install requirements/dev.txt"
    result = subprocess.run([ruff, *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
