"""Training loaders that resume mid-epoch exactly: the same batches, the same worker-side random numbers.

Lightning saves the state of every training loader that has ``state_dict`` / ``load_state_dict`` in the
checkpoint's ``loops.fit_loop.state_dict.combined_loader`` and restores it before the resumed epoch's first
batch (else it warns "your dataloader is not resumable" and replays the epoch from its start).
:class:`ResumableLoader` is torchdata's ``StatefulDataLoader`` with what an exact resume needs beyond it:

- the sampler's epoch. Lightning calls ``set_epoch`` only after it has created the resumed epoch's iterator, so
  without it a ``DistributedSampler`` (Lightning's, :class:`~kpca.vision_cls.input.samplers.RepeatAugSampler`)
  would fast-forward through epoch 0's permutation;
- the loader's own generators (seeded from ``PL_GLOBAL_SEED`` and the rank), which draw the shuffled
  order and the workers' base seeds. The global torch RNG is not touched, so the model's random numbers
  (dropout, drop path, Mixup), which :class:`~kpca.training.checkpointing.restore.ExactResume` restores, are not
  shifted by a resumed loader's draws;
- each worker's torch / NumPy / Python RNG states after its last delivered batch (:class:`WorkerRNGDataset`):
  a resumed worker continues the random augmentations where the interrupted one stopped, instead of starting
  again from its epoch seed.

The sampler itself is fast-forwarded by StatefulDataLoader (its index list is skipped, no item is loaded).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import Dataset, Sampler, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from kpca.training.checkpointing.restore import rng_states, set_rng_states
from kpca.training.errors import OptionError


class WorkerRNGDataset(Dataset):
    """A map-style dataset whose state, inside a DataLoader worker, is that worker's RNG states.

    StatefulDataLoader asks each worker for its dataset's ``state_dict`` with every batch it delivers and gives
    it back to the restarted worker (after the worker init function, i.e. after Lightning's worker seeding), so
    the random transforms of a resumed worker draw what the interrupted one would have drawn next. In the main
    process (``num_workers=0``) the state is empty: there the transforms draw from the process's own RNGs, which
    :class:`~kpca.training.checkpointing.restore.ExactResume` saves. Every other attribute is the wrapped dataset's.

    Args:
        dataset: the map-style training set.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (unpickling in a worker): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def state_dict(self) -> dict[str, Any]:
        """This worker's RNG states; empty in the main process."""
        return rng_states() if get_worker_info() is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set this worker's RNG states to ``state`` (nothing for an empty state or in the main process)."""
        if state and get_worker_info() is not None:
            set_rng_states(state)


def training_dataset(loader: Any) -> Any:
    """The dataset a training loader reads, None for an object without one.

    A :class:`ResumableLoader`'s without its :class:`WorkerRNGDataset` wrapper; any other loader's ``dataset``.
    """
    dataset = getattr(loader, "dataset", None)
    return dataset.dataset if isinstance(dataset, WorkerRNGDataset) else dataset


def loader_generators(rank: int) -> tuple[torch.Generator, torch.Generator]:
    """The generators of a rank's training loader: (shuffled order, workers' base seeds).

    Both are seeded from ``PL_GLOBAL_SEED`` and ``rank``. Two, so that persistent workers (whose base seed is drawn
    once) and fresh ones draw the same orders. The rank keeps the workers' base seeds of different ranks apart.
    Without ``seed_everything`` (no ``PL_GLOBAL_SEED``) the seed is drawn from the global torch RNG, and a resumed
    run is not exact.
    """
    base = os.environ.get("PL_GLOBAL_SEED")
    seed = int(base) if base is not None else int(torch.randint(2**62, ()).item())
    order, workers = np.random.SeedSequence([seed, rank]).generate_state(4, np.uint32).view(np.uint64).tolist()
    return torch.Generator().manual_seed(order), torch.Generator().manual_seed(workers)


class ResumableLoader(StatefulDataLoader):
    """A ``StatefulDataLoader`` whose state also holds its sampler's epoch and its generators (module docstring).

    Build it with :func:`resumable_loader` (as :meth:`kpca.training.data.ProjectDataModule.train_loader` does).
    The arguments are ``DataLoader``'s (``generator`` is required: it draws the workers' base seeds), so that
    Lightning can rebuild it with its ``DistributedSampler`` under DDP, plus:

    Args:
        batches_per_epoch: the number of batches the trainer takes per epoch (``trainer.num_training_batches``,
            which ``limit_train_batches`` may make smaller than the loader). A state saved after that many
            batches resumes with the next epoch's fresh iterator, as the uninterrupted run creates one; None:
            the loader's length.
    """

    def __init__(self, *args: Any, batches_per_epoch: Callable[[], float] | None = None, **kwargs: Any) -> None:
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, which torch 2.14 deprecates
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
            super().__init__(*args, **kwargs)
        if self.generator is None:
            raise OptionError("ResumableLoader needs its own generator=torch.Generator (see loader_generators).")
        self.batches_per_epoch = batches_per_epoch
        self._generators_to_load: list[torch.Tensor] | None = None

    def state_dict(self) -> dict[str, Any]:
        """Every rank's :meth:`rank_state` (gathered under ``torch.distributed``: the checkpoint file is rank 0's)."""
        state = self.rank_state()
        if dist.is_available() and dist.is_initialized():
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, state)
            return {"ranks": gathered}
        return {"ranks": [state]}

    def rank_state(self) -> dict[str, Any]:
        """This rank's state: where the next batch comes from.

        StatefulDataLoader's state (sampler position, batches yielded, workers' base seed and dataset states), the
        sampler's epoch and the generators' states; after the epoch's last batch, the next epoch's start.
        """
        epoch = next((sampler.epoch for sampler in self._samplers() if hasattr(sampler, "epoch")), None)
        done = self._iterator is not None and self._iterator._num_yielded >= self._epoch_length()
        return {
            "loader": {} if done else super().state_dict(),
            "epoch": epoch + 1 if done and epoch is not None else epoch,
            "generators": [generator.get_state() for generator in self._generators()],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume this rank's next iterator at its saved position, the sampler set to the saved epoch first.

        With another number of processes than the checkpoint's, only the epoch is restored: the epoch is loaded
        from its start again (with a warning), as a loader without state would.

        Raises:
            ValueError: If ``state_dict`` is not a :meth:`state_dict` of this class (another loader saved it).
        """
        if state_dict.keys() != {"ranks"}:
            raise OptionError(
                f"this training loader state has the keys {sorted(state_dict)}, not a ResumableLoader's ['ranks']; "
                "the checkpoint was written by another loader: resume from an end-of-epoch checkpoint or afresh"
            )
        ranks = state_dict["ranks"]
        world_size, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
        state = ranks[rank] if len(ranks) == world_size else None
        if state is None:
            rank_zero_warn(
                f"the checkpoint holds the training loaders of {len(ranks)} processes, this run has {world_size}: "
                "the interrupted epoch is loaded again from its start (the data order does not resume exactly)"
            )
        epoch = (state or ranks[0])["epoch"]
        if epoch is not None:
            for sampler in self._samplers():
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(epoch)
        if state is None:
            return
        super().load_state_dict(state["loader"])
        if state["loader"]:  # mid-epoch: creating the resumed iterator draws, then the saved states apply
            self._generators_to_load = state["generators"]
        else:  # the next epoch: its fresh iterator draws from the saved states, as the uninterrupted run did
            self._set_generators(state["generators"])

    def __iter__(self) -> Any:
        """The batches; after a mid-epoch :meth:`load_state_dict`, from the saved position on.

        The generators are set to their saved states afterwards: creating the resumed iterator drew from them, which
        the interrupted run had already done.
        """
        iterator = super().__iter__()
        if self._generators_to_load is not None:
            self._set_generators(self._generators_to_load)
            self._generators_to_load = None
        return iterator

    def _epoch_length(self) -> float:
        return self.batches_per_epoch() if self.batches_per_epoch is not None else len(self)

    def _samplers(self) -> list[Sampler]:
        """The sampler and the batch sampler (Lightning calls ``set_epoch`` on whichever has it)."""
        return [sampler for sampler in (self.sampler, self.batch_sampler) if sampler is not None]

    def _generators(self) -> list[torch.Generator]:
        """The base-seed generator, and the order's when the sampler is torchdata's ``RandomSampler``."""
        order = getattr(self.sampler, "generator", None)
        return [self.generator] + ([order] if isinstance(order, torch.Generator) else [])

    def _set_generators(self, states: list[torch.Tensor]) -> None:
        generators = self._generators()
        if len(states) != len(generators):
            raise OptionError(
                f"the checkpoint's training loader had {len(states)} generators, this one has {len(generators)}: "
                "it was saved with another sampler (a shuffled loader against a DistributedSampler's)"
            )
        for generator, state in zip(generators, states, strict=True):
            generator.set_state(state)


def resumable_loader(
    dataset: Dataset,
    rank: int,
    shuffle: bool,
    sampler: Sampler | None,
    batches_per_epoch: Callable[[], float] | None = None,
    **loader_args: Any,
) -> ResumableLoader:
    """A :class:`ResumableLoader` over ``dataset`` (wrapped in :class:`WorkerRNGDataset`) for ``rank``.

    Args:
        dataset: the map-style training set.
        rank: this process's global rank (seeds the generators, :func:`loader_generators`).
        shuffle: shuffle with torchdata's ``RandomSampler`` on the order generator (``sampler`` must be None).
        sampler: the sampler, None for ``shuffle`` or the dataset order.
        batches_per_epoch: as :class:`ResumableLoader`'s.
        **loader_args: the other ``DataLoader`` arguments (batch_size, drop_last, workers, ...).
    """
    order, workers = loader_generators(rank)
    wrapped = WorkerRNGDataset(dataset)
    if shuffle:
        if sampler is not None:
            raise OptionError("shuffle=True and a sampler exclude each other: the sampler decides the order")
        sampler = RandomSampler(wrapped, generator=order)
    return ResumableLoader(
        wrapped, sampler=sampler, generator=workers, batches_per_epoch=batches_per_epoch, **loader_args
    )
