"""Per-rank RNG states in checkpoints, so that a resumed run draws the same random numbers as an unbroken one."""

from __future__ import annotations

import random

import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from kpca.training.loader_states import load_pending_loader_states


class RNGStateCheckpointing:
    """LightningModule mixin: save every rank's torch / CUDA / NumPy / Python RNG states and restore them on resume.

    Put it before ``LightningModule`` in the bases: ``class M(RNGStateCheckpointing, pl.LightningModule)``.
    At ``on_train_start`` it also applies the training loaders' states of a mid-epoch checkpoint that Lightning
    left pending (:func:`kpca.training.loader_states.load_pending_loader_states`), so that the data order resumes
    with the random numbers.
    """

    def on_train_start(self) -> None:
        """Apply the checkpoint's pending training loader states before the first batch is fetched."""
        load_pending_loader_states(self.trainer)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Store every rank's RNG states, so that a resumed run draws the same augmentations, Mixup and drop paths.

        Lightning calls this hook on every rank before rank 0 writes the file, so the states are gathered.
        """
        states = rng_states()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, states)
            checkpoint["rng_states"] = gathered
        else:
            checkpoint["rng_states"] = [states]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore this rank's RNG states when ``fit`` resumes with the same number of processes.

        Not in ``load_from_checkpoint`` (no Trainer) nor in validate / test / predict (nothing to resume); with
        another world size the ranks keep Lightning's seeding.
        """
        states = checkpoint.get("rng_states")
        if self._trainer is None or states is None or self.trainer.state.fn != TrainerFn.FITTING:
            return
        if len(states) == self.trainer.world_size:
            set_rng_states(states[self.trainer.global_rank])
        else:
            rank_zero_warn(
                f"checkpoint holds RNG states of {len(states)} processes, this run has {self.trainer.world_size}: "
                "the data order resumes exactly, random augmentations do not"
            )


def rng_states() -> dict:
    """The torch, NumPy and Python RNG states as tensors and tuples (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached_gaussian),
        "python": random.getstate(),
    }


def set_rng_states(states: dict) -> None:
    """Restore what :func:`rng_states` stored."""
    torch.set_rng_state(states["torch"])
    if torch.cuda.is_available():
        for device, state in enumerate(states["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, device)
    kind, keys, pos, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached_gaussian))
    random.setstate(states["python"])
