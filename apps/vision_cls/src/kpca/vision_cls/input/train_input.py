"""What every training input path offers ImageNetDataModule: setup, this rank's loader, and the device tail.

:func:`kpca.vision_cls.input.build_train_input` builds one from the ``data.train`` group
(:class:`~kpca.vision_cls.input.options.TrainData`):
:class:`~kpca.vision_cls.input.workers.train_input.WorkerInput` (``data.train.input: turbo | timm``) or
:class:`~kpca.vision_cls.input.dali.train_input.DaliInput` (``data.train.input: dali``). The datamodule holds it and
asks it, never the options, what to do.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path

from torch import Tensor

from kpca.training.data import ProjectDataModule
from kpca.vision_cls.input.device.tail import DeviceTail
from kpca.vision_cls.input.options import Interpolation, TrainData


class TrainInput(ABC):
    """A training input path: what it reads at setup, this rank's training loader, and the device tail after transfer.

    Args:
        train: The checked ``data.train`` group.
        image_size: Side of the square training crop, in pixels (``data.image_size``).
        interpolation: Resampling filter of the crop and of RandAugment (``data.interpolation``).
    """

    def __init__(self, train: TrainData, image_size: int, interpolation: Interpolation) -> None:
        self.train = train
        self.image_size = image_size
        self.interpolation = interpolation

    @abstractmethod
    def setup(self, root: Path, classes: Sequence[str]) -> None:
        """Read what the loader needs from the ImageFolder tree at ``root`` (``train/<class>/*``), once."""

    @abstractmethod
    def loader(self, datamodule: ProjectDataModule) -> Iterable[tuple[Tensor, Tensor]]:
        """This rank's training batches ``(images (B, 3, S, S), labels (B,))`` of the datamodule's per-device batch.

        Images are uint8 where the device tail finishes them, float32 otherwise; the order is the sampler's that
        Lightning gives a DataLoader under DDP, seeded with ``PL_GLOBAL_SEED``.
        """

    @cached_property
    def device_tail(self) -> DeviceTail:
        """What runs on each training batch after transfer (``data.train.augment_on``), built at its first batch."""
        return DeviceTail.from_options(self.train, self.image_size, self.interpolation)


def rank_of(datamodule: ProjectDataModule) -> tuple[int, int]:
    """``(world size, rank)`` of the datamodule's trainer; ``(1, 0)`` without one."""
    trainer = datamodule.trainer
    return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)


def run_seed() -> int:
    """The run's seed, ``PL_GLOBAL_SEED`` (set by ``seed_everything``; the seed Lightning gives its samplers), or 0."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))
