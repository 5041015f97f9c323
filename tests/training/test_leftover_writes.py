"""What a checkpoint save killed mid-write leaves is found by the writer's own naming, and removed (kept if whole)."""

import logging
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kpca.training.checkpointing.io import AtomicCheckpointIO, leftover_writes, remove_leftover_writes
from kpca.training.checkpointing.resume import checkpoint_problem
from kpca.training.files import TEMPORARY_SUFFIX, temporary_prefix

# AtomicCheckpointIO.save_checkpoint's write, without importing Lightning (a fresh interpreter starts faster).
SAVE_A_BIG_CHECKPOINT = """
import sys
from pathlib import Path

import torch

from kpca.training.files import write_atomic

write_atomic(Path(sys.argv[1]), lambda f: torch.save({"state_dict": {"w": torch.ones(64 * 2**20)}}, f))
"""


def kill_a_save_mid_write(target: Path) -> Path:
    """Start a real 256 MB checkpoint save to ``target``, SIGKILL it once its temporary file has data; that file."""
    process = subprocess.Popen([sys.executable, "-c", SAVE_A_BIG_CHECKPOINT, str(target)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        partial = [path for path in leftover_writes(target.parent) if path.stat().st_size > 0]
        if partial:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.001)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, f"the save ended before it was killed: {stderr.decode()[-2000:]}"
    assert not target.exists()
    (leftover,) = leftover_writes(target.parent)
    return leftover


def test_a_save_killed_mid_write_leaves_a_partial_file_that_is_removed(tmp_path: Path, caplog):
    folder = tmp_path / "checkpoints"
    leftover = kill_a_save_mid_write(folder / "last.ckpt")
    assert leftover.name.startswith(temporary_prefix(folder / "last.ckpt")) and leftover.name.endswith(".tmp")
    assert checkpoint_problem(leftover) is not None  # partial
    size = leftover.stat().st_size
    with caplog.at_level(logging.WARNING, logger="kpca.training.checkpointing.io"):
        assert remove_leftover_writes(folder) == [leftover]
    assert not leftover.exists()
    assert f"removed {leftover} ({size} bytes)" in caplog.text


def test_leftovers_are_named_as_write_atomic_names_its_temporary_files(tmp_path: Path):
    handle, name = tempfile.mkstemp(dir=tmp_path, prefix=temporary_prefix(tmp_path / "best-003.ckpt"), suffix=".tmp")
    (tmp_path / "best-003.ckpt").write_bytes(b"x")
    (tmp_path / "notes.tmp").write_bytes(b"x")
    assert leftover_writes(tmp_path) == [Path(name)]
    assert TEMPORARY_SUFFIX == ".tmp"


def test_a_whole_checkpoint_whose_rename_never_happened_is_kept(tmp_path: Path, caplog):
    whole = tmp_path / f"{temporary_prefix(tmp_path / 'last.ckpt')}abcd1234{TEMPORARY_SUFFIX}"
    torch.save({"global_step": 3}, whole)
    partial = tmp_path / f"{temporary_prefix(tmp_path / 'best-000.ckpt')}efgh5678{TEMPORARY_SUFFIX}"
    partial.write_bytes(whole.read_bytes()[:40])
    with caplog.at_level(logging.WARNING, logger="kpca.training.checkpointing.io"):
        assert remove_leftover_writes(tmp_path) == [partial]
    assert whole.is_file() and f"--ckpt_path {whole}" in caplog.text


def test_a_finished_save_leaves_nothing(tmp_path: Path):
    AtomicCheckpointIO().save_checkpoint({"global_step": 1}, tmp_path / "last.ckpt")
    assert leftover_writes(tmp_path) == [] and remove_leftover_writes(tmp_path) == []
    assert remove_leftover_writes(tmp_path / "absent") == []
