"""The DataLoader workers' input path (``data.train.input: turbo | timm``): an ImageFolder, its workers transforming."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch.utils.data import DataLoader, Dataset
from torchvision import transforms
from torchvision.datasets import ImageFolder

from kpca.training.data import ProjectDataModule, require_built
from kpca.vision_cls.data_checks import training_set
from kpca.vision_cls.input.samplers import RepeatAugSampler
from kpca.vision_cls.input.train_input import TrainInput, rank_of, run_seed
from kpca.vision_cls.input.workers.transform import train_image_loader, worker_train_transform


class WorkerInput(TrainInput):
    """``root/train`` as an ImageFolder (damaged files named or skipped, ``data.train.bad_files``) read by workers.

    Takes :class:`TrainInput`'s arguments; ``train.input`` is ``"turbo"`` or ``"timm"``.
    """

    dataset: Dataset | None = None

    def transform(self) -> transforms.Compose:
        """The workers' transform per image (:func:`kpca.vision_cls.input.workers.transform.worker_train_transform`)."""
        return worker_train_transform(self.train, self.image_size, self.interpolation)

    def setup(self, root: Path, classes: Sequence[str]) -> None:
        """Build the training ImageFolder over ``root/train`` with :meth:`transform`, once."""
        if self.dataset is not None:
            return
        loader = train_image_loader(self.train.input)
        folder = ImageFolder(str(root / "train"), transform=self.transform(), loader=loader)
        self.dataset = training_set(folder, self.train.bad_files, self.train.max_bad_fraction)

    def loader(self, datamodule: ProjectDataModule) -> DataLoader:
        """Shuffled batches of the per-device size, last partial batch dropped (:meth:`ProjectDataModule.train_loader`).

        With ``repeated_aug > 1`` the sampler is a :class:`RepeatAugSampler` built for this rank and seeded with
        ``PL_GLOBAL_SEED``. Being a ``DistributedSampler``, Lightning uses it as is (no wrapping) and calls its
        ``set_epoch`` every epoch. Otherwise the loader shuffles, and under DDP Lightning swaps in its
        ``DistributedSampler``.
        """
        dataset = require_built(self.dataset, "fit")
        if self.train.repeated_aug == 1:
            return datamodule.train_loader(dataset)
        world_size, rank = rank_of(datamodule)
        sampler = RepeatAugSampler(dataset, world_size, rank, num_repeats=self.train.repeated_aug, seed=run_seed())
        return datamodule.train_loader(dataset, sampler=sampler)
