"""Data helpers every app uses: the cache folder, the global batch split, evaluation subsets and sampler."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sized
from pathlib import Path
from typing import TypeVar

from torch.utils.data import DistributedSampler

T = TypeVar("T")


def default_cache_dir() -> Path:
    """Where generated data goes: ``$KPCA_CACHE`` if set, else ``~/.cache/kpca``."""
    return Path(os.environ.get("KPCA_CACHE", Path.home() / ".cache" / "kpca"))


def per_device_batch_size(global_batch: int, world_size: int, name: str = "data.batch_size") -> int:
    """Split a global batch evenly over ``world_size`` processes (devices × nodes).

    Args:
        global_batch: the batch summed over every process.
        world_size: number of processes.
        name: the config key that set ``global_batch``, named in the error.

    Raises:
        ValueError: If ``global_batch`` is not a positive multiple of ``world_size``.
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be at least 1.")
    if global_batch < world_size or global_batch % world_size:
        lower = max(world_size, global_batch // world_size * world_size)
        raise ValueError(
            f"{name.rsplit('.', 1)[-1]}={global_batch} (the global batch) is not divisible by world_size={world_size} "
            f"(devices × nodes); set {name} to a multiple of {world_size}, e.g. {lower}."
        )
    return global_batch // world_size


def evenly_spaced(n: int, k: int | None) -> list[int] | None:
    """``k`` indices spread evenly over ``range(n)`` (every class of a class-sorted set is hit), or None for all.

    None also when ``k`` is None or ``k >= n``.
    """
    return None if k is None or k >= n else [i * n // k for i in range(k)]


def require_built(value: T | None, stage: str) -> T:
    """``value`` (a dataset or list of datasets built by ``setup``), or RuntimeError saying to call ``setup``."""
    if value is None:
        raise RuntimeError(f"The datasets are not built; call setup({stage!r}) first (the Trainer does).")
    return value


class UnpaddedDistributedSampler(DistributedSampler):
    """Evaluation sampler: rank r takes items r, r + R, r + 2R, ... in order, without padding.

    Lightning's ``DistributedSampler`` pads every rank to the same length by repeating items, which would count
    those items twice in metrics summed over ranks; here each item is counted exactly once (ranks may get one
    item fewer, which is fine: evaluation runs no collective per step). Being a ``DistributedSampler``, Lightning
    uses it as is.

    Args:
        dataset: the evaluation set (only its length is used).
        num_replicas: number of processes R.
        rank: this process's rank r.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.num_samples = len(range(rank, len(dataset), num_replicas))
        self.total_size = len(dataset)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))
