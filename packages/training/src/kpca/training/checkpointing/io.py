"""Atomic checkpoint writes: a crash mid-save never leaves a truncated ``last.ckpt``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from kpca.training.files import write_atomic


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint to a temporary file in the target folder, fsync it, then rename it in place."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        write_atomic(Path(path), lambda f: torch.save(checkpoint, f))
