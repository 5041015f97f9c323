"""Atomic file and folder writes: a crash mid-write never leaves a truncated file or half a folder in place."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from kpca.training.errors import OptionError


def _umask() -> int:
    """The process's umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


TEMPORARY_SUFFIX = ".tmp"
"""The end of the name of :func:`write_atomic`'s temporary files."""


def temporary_prefix(path: Path) -> str:
    """The start of the name of :func:`write_atomic`'s temporary file for ``path``: ``.<name>.``.

    Random characters and :data:`TEMPORARY_SUFFIX` follow; the leading dot hides the file from plain listings and
    from globs such as ``*.ckpt``.
    """
    return f".{path.name}."


def temporary_files(folder: Path, pattern: str = "*") -> list[Path]:
    """The temporary files of :func:`write_atomic` calls for targets named ``pattern`` in ``folder``, sorted.

    A process killed mid-write leaves its temporary file behind (nothing else removes it); while a write runs, its
    file is listed too, so only a caller that knows no writer is at work may delete what this returns.
    """
    return sorted(folder.glob(f"{temporary_prefix(Path(pattern))}*{TEMPORARY_SUFFIX}"))


def write_atomic(path: Path, write: Callable[[IO], None], mode: str = "wb", **open_kwargs) -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, fsync it, then rename it over ``path``.

    The file gets the permissions a plain ``open`` would give it (0666 less the umask), not mkstemp's 0600. An
    operating-system error of the write (a full disk) names ``path`` and leaves nothing behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path), suffix=TEMPORARY_SUFFIX)
    try:
        with os.fdopen(handle, mode, **open_kwargs) as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as error:
        Path(tmp).unlink(missing_ok=True)
        if error.errno is None or error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_tree_atomic(root: Path, marker: str, write: Callable[[Path], None], what: str = "tree") -> bool:
    """Build the folder ``root`` once: ``write(tmp)`` fills a temporary folder beside it, which is renamed into place.

    A complete tree holds the file ``marker``; a crash never leaves half a tree at ``root``, and of concurrent
    writers the first rename wins. The folder gets a plain ``mkdir``'s permissions (0777 less the umask).
    ``what`` names the tree in errors (e.g. "digits tree").

    Returns:
        True when this call wrote the tree, False when a complete tree was already there.

    Raises:
        ValueError: If ``root`` exists without ``marker`` (not a complete tree).
    """
    if (root / marker).is_file():
        return False
    if root.exists():
        raise OptionError(f"{root} exists but is not a complete {what} (no {marker}); delete it or move it.")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        write(tmp)
        (tmp / marker).touch()
        os.chmod(tmp, 0o777 & ~_umask())
        try:
            os.rename(tmp, root)
        except OSError:
            if not (root / marker).is_file():  # not a concurrent writer that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True
