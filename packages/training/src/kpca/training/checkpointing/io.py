"""Atomic checkpoint writes: a crash mid-save never leaves a truncated ``last.ckpt``, and its leftovers are removed.

A save writes ``.<name>.<random>.tmp`` beside its target and renames it into place
(:func:`kpca.training.files.write_atomic`). A process killed mid-save leaves that file behind; the next ``fit`` on the
run folder removes it (:func:`remove_leftover_writes`), once it holds the folder's lock.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from kpca.training.checkpointing.resume import checkpoint_problem
from kpca.training.files import temporary_files, write_atomic

logger = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint to a temporary file in the target folder, fsync it, then rename it in place."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        write_atomic(Path(path), lambda f: torch.save(checkpoint, f))


def leftover_writes(folder: Path) -> list[Path]:
    """The temporary files of :class:`AtomicCheckpointIO` saves in ``folder`` (of killed saves, when none runs)."""
    return temporary_files(folder)


def remove_leftover_writes(folder: Path) -> list[Path]:
    """Delete the temporary files that killed saves left in ``folder``, logging each with its size; the removed paths.

    Call it only while no process saves into ``folder`` (``ProjectCLI`` does, holding the run folder's lock): a
    running save's temporary file looks the same. A temporary file that is a complete checkpoint (the process died
    between the write and the rename) is kept, with a warning that says how to use it: nothing is lost.
    """
    removed = []
    for path in leftover_writes(folder):
        size = path.stat().st_size
        if checkpoint_problem(path) is None:
            logger.warning(
                "kept %s (%d bytes): a complete checkpoint whose save was killed before its rename; resume from it "
                "with --ckpt_path %s, or delete it",
                path,
                size,
                path,
            )
            continue
        path.unlink(missing_ok=True)
        removed.append(path)
        logger.warning("removed %s (%d bytes): the partial file of a checkpoint save that was killed", path, size)
    return removed
