"""DeiT's training-side sampling and augmentation: the repeated-augmentation sampler and pixel-space random erasing.

Legend: H x W image.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence, Sized
from typing import Literal

import torch
import torch.distributed as dist
from timm.data.random_erasing import RandomErasing
from torch import Tensor
from torch.utils.data import DistributedSampler


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
            raise ValueError(f"num_repeats={num_repeats} must be at least 1 (1 means no repetition).")
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


class PixelSpaceRandomErasing:
    """timm's ``RandomErasing`` for pixel-space images, with the fill DeiT draws in normalised space.

    DeiT erases *normalised* images and fills the box with z ~ N(0, 1) per pixel (mode ``"pixel"``), per channel
    (``"rand"``) or z = 0 (``"const"``). Our images are normalised later, inside the model, so the same fill in pixel
    space is ``mean + std * z`` per channel. It is not clipped (it leaves [0, 1] on purpose): after the model's
    normalisation the erased box holds exactly timm's values. The boxes are drawn by timm's own ``RandomErasing`` (same
    parameters, same random calls) on a NaN canvas; the pixels it filled are copied, mapped to pixel space, into the
    image, and the other pixels are left untouched.

    Args:
        probability: Probability of erasing an image.
        mean: Per-channel normalisation mean of the model.
        std: Per-channel normalisation std of the model.
        mode: Fill mode of timm's ``RandomErasing``: ``"pixel"``, ``"rand"`` or ``"const"``.
        max_count: Maximum number of boxes per image.
    """

    def __init__(
        self,
        probability: float,
        mean: Sequence[float],
        std: Sequence[float],
        mode: Literal["pixel", "rand", "const"] = "pixel",
        max_count: int = 1,
    ) -> None:
        self.erasing = RandomErasing(probability, mode=mode, max_count=max_count, device="cpu")
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)  # (3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)  # (3, 1, 1)

    def __call__(self, image: Tensor) -> Tensor:
        """Erase boxes of a (3, H, W) float image in [0, 1]; returns a new tensor."""
        canvas = self.erasing(torch.full_like(image, float("nan")))  # (3, H, W): NaN where not erased
        erased = ~torch.isnan(canvas)
        return torch.where(erased, self.mean + self.std * canvas, image)

    def __repr__(self) -> str:
        """Show the wrapped timm transform."""
        return f"{type(self).__name__}({self.erasing!r})"
