import os
import stat
from pathlib import Path

import pytest

from kpca.training.files import write_atomic, write_tree_atomic


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def test_atomic_file_gets_plain_open_permissions_and_leaves_no_temporary(tmp_path: Path, umask_027):
    path = tmp_path / "sub" / "report.csv"
    write_atomic(path, lambda f: f.write("a,b\n"), mode="w")
    assert path.read_text() == "a,b\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in path.parent.iterdir()] == ["report.csv"]


def test_failed_atomic_write_keeps_the_old_file(tmp_path: Path):
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"old")

    def crash(stream) -> None:
        stream.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomic(path, crash)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_atomic_tree_is_written_once_with_plain_mkdir_permissions(tmp_path: Path, umask_027):
    root = tmp_path / "cache" / "tree"
    calls = []

    def fill(folder: Path) -> None:
        calls.append(folder)
        (folder / "data.txt").write_text("x")

    assert write_tree_atomic(root, "DONE", fill) is True
    assert write_tree_atomic(root, "DONE", fill) is False
    assert len(calls) == 1 and (root / "data.txt").read_text() == "x"
    assert stat.S_IMODE(root.stat().st_mode) == 0o750


def test_incomplete_tree_is_refused_with_the_fix(tmp_path: Path):
    (tmp_path / "tree").mkdir()
    with pytest.raises(ValueError, match="not a complete digits tree .*delete it"):
        write_tree_atomic(tmp_path / "tree", "DONE", lambda folder: None, what="digits tree")
