"""The DALI input path (``data.train.input: dali``): DALI reads ``root/train``'s files in the sampler's order."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from kpca.training.data import ProjectDataModule, require_built
from kpca.vision_cls.input.dali.loader import DaliTrainLoader, image_folder_samples, require_dali
from kpca.vision_cls.input.dali.recipe import DaliTrainRecipe
from kpca.vision_cls.input.options import MEAN, Interpolation, TrainData
from kpca.vision_cls.input.samplers import rank_sampler
from kpca.vision_cls.input.train_input import TrainInput, rank_of, run_seed


class DaliInput(TrainInput):
    """The training files listed at setup and read, decoded and augmented by DALI (no ImageFolder, no workers).

    Args:
        train: The checked ``data.train`` group; ``input`` is ``"dali"``.
        image_size: Side of the square training crop, in pixels (``data.image_size``).
        interpolation: Resampling filter of the crop and of RandAugment (``data.interpolation``).

    Raises:
        ImportError: NVIDIA DALI is not importable; the message gives the install command.
    """

    def __init__(self, train: TrainData, image_size: int, interpolation: Interpolation) -> None:
        require_dali()
        super().__init__(train, image_size, interpolation)
        self.samples: list[tuple[str, int]] | None = None

    def setup(self, root: Path, classes: Sequence[str]) -> None:
        """List ``(path, label)`` of every training image as ImageFolder would, once (DALI reads the files)."""
        if self.samples is None:
            self.samples = image_folder_samples(root / "train", classes)

    def loader(self, datamodule: ProjectDataModule) -> DaliTrainLoader:
        """This rank's DALI loader on the trainer's device, ``num_workers`` pipeline threads (at least 1).

        Its sampler is the one the workers' loader gets under DDP (:func:`kpca.vision_cls.input.samplers.rank_sampler`,
        seeded with ``PL_GLOBAL_SEED``); Lightning calls its ``set_epoch`` as for a DataLoader's sampler.
        """
        samples = require_built(self.samples, "fit")
        train, trainer = self.train, datamodule.trainer
        world_size, rank = rank_of(datamodule)
        seed = run_seed()
        sampler = rank_sampler(samples, world_size, rank, train.repeated_aug, seed)
        recipe = DaliTrainRecipe.from_timm(
            self.image_size, train.scale, train.hflip, train.auto_augment, self.interpolation, MEAN
        )
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        threads = max(1, datamodule.num_workers)
        return DaliTrainLoader(samples, sampler, recipe, datamodule.batch_size_per_device, device, threads, seed)
