"""What a checkpoint restores beyond Lightning's own state, so that a resumed ``fit`` continues exactly.

Every rank's RNG states (:class:`ExactResume`, :func:`rng_states`) and the training loaders' positions that Lightning
2.6 leaves unapplied (:func:`load_pending_loader_states`). Which checkpoint a fit resumes from is
:mod:`kpca.training.checkpointing.resume`.
"""

from __future__ import annotations

import random

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn


class ExactResume:
    """LightningModule mixin: what a checkpoint restores beyond Lightning's own state, so that a resumed fit is exact.

    Every rank's torch / CUDA / NumPy / Python RNG states are saved and restored; at ``on_train_start`` the training
    loaders' states of a mid-epoch checkpoint that Lightning left pending are applied
    (:func:`load_pending_loader_states`), so that the data order resumes with the random numbers. Put it before
    ``LightningModule`` in the bases: ``class M(ExactResume, pl.LightningModule)``.
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


def load_pending_loader_states(trainer: pl.Trainer) -> None:
    """Apply the checkpoint's training loader states that Lightning 2.6 left unapplied, and restart the iterator.

    Lightning applies them when the fit loop builds the training loader, and only when the loop is ``restarting``.
    Two resumes leave them pending, and the resumed epoch then silently reads the batches of another:

    - the loader was built before the checkpoint was restored, because ``configure_optimizers`` read
      ``trainer.estimated_stepping_batches`` (a warmup in epochs): its iterator was created with the sampler still
      at epoch 0;
    - the checkpoint was saved at the end of an epoch: the loop is then resuming but not ``restarting``, so its
      states (the next epoch's sampler epoch and generators) are never loaded.

    Called at ``on_train_start``, before the first batch is fetched and after every ``iter`` Lightning makes of a
    resumed fit's loader, this loads them and creates the iterator again; it does nothing when nothing is pending.
    """
    fit_loop = trainer.fit_loop
    states = fit_loop._combined_loader_states_to_load
    if not states or fit_loop._combined_loader is None or fit_loop._data_fetcher is None:
        return
    fit_loop._combined_loader._load_state_dicts(states)
    fit_loop._combined_loader_states_to_load = []
    iter(fit_loop._data_fetcher)
