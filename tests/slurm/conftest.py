"""A one-node Slurm on localhost for the tests marked ``slurm`` (docker/local_slurm.sh), started once per session.

Started when the tests run as root and Debian's ``slurm-wlm`` and ``munge`` are installed (CI installs them, see
.ci/run; nothing is downloaded here), stopped at the end of the session unless it was running before. Otherwise
the tests skip with the reason. ``KPCA_REQUIRE_SLURM=1`` (set by .ci/run when the packages installed) turns a skip
into a failure, so a Slurm that stops starting on CI is not skipped silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.support import CONF, LOCAL_SLURM, MARK, LocalSlurm, node_state

START_TIMEOUT_S = 120
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "srun", "sinfo")


def _missing() -> list[str]:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in DAEMONS if shutil.which(name, path=path) is None]


def _unavailable(reason: str) -> None:
    if os.environ.get("KPCA_REQUIRE_SLURM") == "1":
        pytest.fail(f"KPCA_REQUIRE_SLURM=1 but no local Slurm: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def local_slurm() -> Iterator[LocalSlurm]:
    """The running local Slurm (started here if needed); skips the test with the reason when it cannot run."""
    state = Path(os.environ.get("KPCA_LOCAL_SLURM_DIR", "/tmp/kpca-local-slurm"))
    if node_state() in ("idle", "mixed", "allocated") and CONF.is_file() and CONF.read_text().startswith(MARK):
        yield LocalSlurm(state)  # a local Slurm started by hand: used, and left running
        return
    if os.geteuid() != 0:
        _unavailable(f"starting a local Slurm needs root ({LOCAL_SLURM} start; CI runs as root)")
    missing = _missing()
    if missing:
        _unavailable(
            f"Slurm is not installed ({', '.join(missing)} missing): apt-get install -y --no-install-recommends "
            "slurm-wlm munge (make local-slurm)"
        )
    if CONF.is_file() and not CONF.read_text().startswith(MARK):
        _unavailable(f"{CONF} belongs to this machine's own Slurm; the tests use only the one of {LOCAL_SLURM}")
    try:
        started = subprocess.run(
            ["bash", str(LOCAL_SLURM), "start"], capture_output=True, text=True, timeout=START_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as error:
        _unavailable(f"{LOCAL_SLURM} start did not finish within {START_TIMEOUT_S} s: {error.stdout} {error.stderr}")
    if started.returncode != 0:
        _unavailable(f"{LOCAL_SLURM} start failed: {started.stdout}{started.stderr}"[-3000:])
    try:
        yield LocalSlurm(state)
    finally:
        subprocess.run(["bash", str(LOCAL_SLURM), "stop"], capture_output=True, text=True, timeout=120)
