"""The training samplers: DeiT's repeated-augmentation sampler, and the sampler of a loader Lightning does not wrap.

The DataLoader paths (``data.train.input: turbo | timm``) get :class:`RepeatAugSampler` with ``data.train.repeated_aug >
1``, else Lightning's own. The DALI path is no DataLoader, so :func:`rank_sampler` builds the one Lightning would
inject.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from kpca.training.errors import OptionError


class RepeatAugSampler(DistributedSampler):
    """DeiT's repeated-augmentation sampler, DDP-aware, with a seed.

    Each epoch draws a permutation of the dataset (seeded by ``seed + epoch``; call :meth:`set_epoch`), repeats every
    index ``num_repeats`` times in a row (``[a, a, a, b, b, b, ...]``) and deals the list round-robin to the ranks, so
    the copies of one image land on different ranks (when ``num_replicas >= num_repeats``) and get different
    augmentations. As in DeiT and timm, an epoch keeps the length of a plain epoch: each rank takes only the first
    ``len(dataset) // selected_round * selected_round // num_replicas`` indices (``ceil(len(dataset) / num_replicas)``
    for datasets smaller than ``selected_round``), so one epoch sees about ``1 / num_repeats`` of the images,
    ``num_repeats`` times each. With ``seed=0`` the indices equal ``timm.data.distributed_sampler.RepeatAugSampler``'s.

    It subclasses :class:`~torch.utils.data.DistributedSampler` so that Lightning (``use_distributed_sampler=True``)
    keeps it as is instead of wrapping it, and calls its ``set_epoch`` every epoch.

    Args:
        dataset: The dataset to sample from (only its length is used).
        num_replicas: Number of processes; None reads it from ``torch.distributed`` (1 when not initialised).
        rank: This process's rank; None reads it from ``torch.distributed`` (0 when not initialised).
        shuffle: Permute the dataset each epoch; False keeps the dataset order.
        num_repeats: Copies of each selected sample per epoch, at least 1.
        seed: Base seed of the per-epoch permutation; must be the same on all ranks.
        selected_round: Round the per-epoch sample count down to a multiple of this (DeiT: 256); 0 disables.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        num_repeats: int = 3,
        seed: int = 0,
        selected_round: int = 256,
    ) -> None:
        initialised = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if initialised else 1
        if rank is None:
            rank = dist.get_rank() if initialised else 0
        if num_repeats < 1:
            raise OptionError(f"num_repeats={num_repeats} must be at least 1 (1 means no repetition).")
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.num_repeats = num_repeats
        n = len(dataset)
        self.num_samples = math.ceil(n * num_repeats / num_replicas)
        self.total_size = self.num_samples * num_replicas
        if selected_round and n >= selected_round:
            selected = n // selected_round * selected_round // num_replicas
        else:
            selected = math.ceil(n / num_replicas)
        self.num_selected_samples = min(selected, self.num_samples)

    def __iter__(self) -> Iterator[int]:
        """Indices of this rank for the current epoch."""
        n = len(self.dataset)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=generator)
        else:
            order = torch.arange(n)
        indices = torch.repeat_interleave(order, self.num_repeats).tolist()
        ranks = range(self.rank, self.total_size, self.num_replicas)[: self.num_selected_samples]
        return iter([indices[i % len(indices)] for i in ranks])

    def __len__(self) -> int:
        """Samples this rank yields per epoch."""
        return self.num_selected_samples


def rank_sampler(dataset: Sized, num_replicas: int, rank: int, repeated_aug: int, seed: int) -> DistributedSampler:
    """This rank's training sampler for a loader Lightning does not wrap (the DALI path).

    The sampler a DataLoader path gets under DDP: :class:`RepeatAugSampler` with ``repeated_aug > 1``, else the
    shuffled ``DistributedSampler`` Lightning injects (it pads the dataset to a multiple of ``num_replicas`` by
    repeating its first indices). Lightning calls its ``set_epoch`` as for a DataLoader's sampler.

    Args:
        dataset: What is sampled (only its length is used).
        num_replicas: Number of processes.
        rank: This process's rank.
        repeated_aug: ``data.train.repeated_aug``: copies of each sample per epoch spread over the ranks; 1 disables.
        seed: Base seed of the per-epoch permutation (``PL_GLOBAL_SEED``); the same on all ranks.
    """
    if repeated_aug > 1:
        return RepeatAugSampler(dataset, num_replicas, rank, num_repeats=repeated_aug, seed=seed)
    return DistributedSampler(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
