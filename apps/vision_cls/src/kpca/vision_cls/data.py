"""ImageNet-style data for image classification: DeiT training transforms, robustness test sets, built-in digits.

Every dataloader yields ``(images, labels)`` with ``images`` float32 in pixel space [0, 1], shape (B, 3, H, W), and
``labels`` int64, shape (B,), once on the device. The training input path (the ``data.train`` group,
:class:`kpca.vision_cls.input.options.TrainData`: ``input``, ``augment_on``, the augmentation) is one object,
:attr:`ImageNetDataModule.train_input` (:mod:`kpca.vision_cls.input`): it reads the training set, gives the training
loader, and finishes training batches on the device after transfer (with ``augment_on="device"``,
the default, the loader stops at uint8 and the float conversion and random erasing run batched there,
:mod:`kpca.vision_cls.input.device`). Under DDP the evaluation
loaders (validation, test, predict) use :class:`kpca.training.data.UnpaddedDistributedSampler`, so every image counts
exactly once on any number of ranks.
Nothing is normalised here: the model normalises inside (with :attr:`mean` and
:attr:`std`), so adversarial attacks and corruptions work in pixel units. The one exception is random erasing, whose
fill is drawn in normalised space as in DeiT and is therefore allowed to leave [0, 1] (see
:class:`kpca.vision_cls.input.workers.random_erasing.PixelSpaceRandomErasing`). The evaluation sets beyond the clean
validation set (ImageNet-C/A/R/O, the on-the-fly corruptions, the evaluation subset) are the ``data.eval`` group,
:class:`kpca.vision_cls.eval_data.EvalData`, whose module gives their folder layouts.

Folder layouts (ImageFolder-style, one sub-folder per class):

* ImageNet: ``root/train/<wnid>/*.JPEG`` and ``root/val/<wnid>/*``.
* Built-in digits: scikit-learn's handwritten digits, written once by
  :func:`kpca.vision_cls.builtin_data.write_digits_imagefolder` as
  ``<cache>/digits-<size>px/{train,val}/<0..9>/*.png`` and then read by the same ImageFolder code as ImageNet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import ClassVar, Literal, Protocol

import torch
from timm.data.transforms import str_to_interp_mode
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from kpca.training.choices import check_choice
from kpca.training.data import ProjectDataModule, require_built
from kpca.training.data_checks.problems import DataError, DataProblem
from kpca.training.errors import OptionError
from kpca.vision_cls.builtin_data import DIGITS_CLASSES, write_digits_imagefolder
from kpca.vision_cls.data_checks import check_image_folders, evaluation_set, require_nonempty_class_folders
from kpca.vision_cls.eval_data import IMAGENET_C_LAYOUT, EvalData, EvalSet
from kpca.vision_cls.image_folders import class_folders
from kpca.vision_cls.input import Interpolation, TrainData, TrainInput, build_train_input
from kpca.vision_cls.input.options import MEAN, STD

Builtin = Literal["digits"]

IMAGENET_LAYOUT = "root/train/<class>/*.JPEG and root/val/<class>/*"
TRAIN_OPTIONS = tuple(field.name for field in fields(TrainData))
"""The ``data.train`` group's options (each was a flat ``data`` option before the group)."""


class VisionData(Protocol):
    """What :class:`~kpca.vision_cls.module.ClassificationModule` reads from the trainer's datamodule.

    :class:`ImageNetDataModule` provides it. The module checks any other datamodule against it
    (:func:`kpca.training.data.require_datamodule`), naming what is missing.

    Attributes:
        batch_size: The global training batch, which scales the learning rate.
    """

    batch_size: int

    @property
    def eval_sets(self) -> list[EvalSet]:
        """The test sets, one per test dataloader, in that order."""

    def class_indices(self, eval_set: EvalSet) -> list[int] | None:
        """The logit columns that ``eval_set``'s labels refer to, or None for all classes."""


def _check_image_source(root: str | None, builtin: str | None) -> None:
    """Raise ValueError unless exactly one of ``data.root`` and ``data.builtin`` (a :data:`Builtin`) is set."""
    if (root is None) == (builtin is None):
        raise OptionError(
            f"Set exactly one of data.root and data.builtin (got root={root!r}, builtin={builtin!r}): "
            f"root is an ImageFolder tree ({IMAGENET_LAYOUT}), builtin='digits' the built-in digits."
        )
    if builtin is not None:
        check_choice("data.builtin", builtin, Builtin, "choose it, or set data.root to an ImageFolder tree instead")


class ImageNetDataModule(ProjectDataModule):
    """ImageNet-1K (or any ImageFolder tree, or the built-in digits) with DeiT's augmentation and robustness test sets.

    Loaders yield float32 pixel-space images in [0, 1], (B, 3, H, W); the model normalises with :attr:`mean` and
    :attr:`std`. ``val_dataloader`` and ``predict_dataloader`` give the clean validation set; ``test_dataloader`` gives
    one loader per entry of :attr:`eval_sets`.

    Args:
        root: ImageFolder root holding ``train/<class>/*.JPEG`` and ``val/<class>/*`` (ImageNet-1K: 1000 wnid folders
            each). Exactly one of ``root`` and ``builtin`` must be set.
        builtin: ``"digits"`` uses scikit-learn's handwritten digits (10 classes), written once under ``cache_dir`` as
            an ImageFolder tree at ``image_size`` pixels and read by the same code as ImageNet.
        cache_dir: Where built-in data is written; None means ``$KPCA_CACHE`` or else ``~/.cache/kpca``.
        batch_size: Global batch size over all devices and nodes; each process loads ``batch_size // world_size``
            (setup raises ValueError if it does not divide).
        num_workers: Dataloader worker processes per device.
        image_size: Side of the square images the model sees, in pixels.
        crop_pct: Evaluation resizes the short side to ``image_size / crop_pct`` and center-crops ``image_size``
            (validation, on-the-fly corruptions, ImageNet-A/R/O). ImageNet-C images, already 224×224 crops, are only
            center-cropped to ``image_size``.
        interpolation: Resampling filter of the training crop, of RandAugment and of the evaluation resize.
        pin_memory: Pin loaded batches in page-locked memory (only when the trainer's accelerator is not the CPU).
        eval: The evaluation sets beyond the clean validation set, and the size of every evaluation set
            (:class:`~kpca.vision_cls.eval_data.EvalData`, the ``data.eval`` group): ImageNet-C/A/R/O roots
            (``imagenet_c``, ...), on-the-fly ``corruptions`` at ``severities``, and ``subset``.
        train: The training input (:class:`~kpca.vision_cls.input.options.TrainData`, the ``data.train`` group):
            the input path (``input``, ``augment_on``), DeiT's augmentation (``scale``, ``hflip``, ``auto_augment``,
            ``color_jitter``, ``re_prob``, ``re_mode``, ``repeated_aug``) and damaged files (``bad_files``,
            ``max_bad_fraction``).
    """

    moved_options: ClassVar[Mapping[str, str]] = {name: f"train.{name}" for name in TRAIN_OPTIONS}
    """The training-input options, once flat under ``data`` (``data.re_prob``), now the ``data.train`` group's:
    checkpoints and config files saved before read them there (:mod:`kpca.training.moved_options`)."""

    def __init__(
        self,
        root: str | None = None,
        builtin: Builtin | None = None,
        cache_dir: str | None = None,
        batch_size: int = 1024,
        num_workers: int = 8,
        image_size: int = 224,
        crop_pct: float = 0.875,
        interpolation: Interpolation = "bicubic",
        pin_memory: bool = True,
        train: TrainData = TrainData(),  # noqa: B008 (frozen dataclass default)
        eval: EvalData = EvalData(),  # noqa: B008 (frozen dataclass default)
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, cache_dir=cache_dir, pin_memory=pin_memory)
        _check_image_source(root, builtin)
        if not 0.0 < crop_pct <= 1.0:
            raise OptionError(f"crop_pct={crop_pct} must be in (0, 1]; DeiT uses 0.875.")
        eval.check_image_size(image_size)
        self.root = Path(root) if root is not None else None
        self.builtin = builtin
        self.image_size = image_size
        self.crop_pct = crop_pct
        self.interpolation = interpolation
        self.train = train
        self.eval = eval
        self.train_input: TrainInput = build_train_input(
            train, builtin=builtin, image_size=image_size, interpolation=interpolation
        )
        self.val_set: Dataset | None = None
        self.test_sets: list[Dataset] | None = None

    @property
    def data_root(self) -> Path:
        """The ImageFolder root in use: ``root``, or the digits tree under ``cache_dir``."""
        if self.root is not None:
            return self.root
        return self.cache_dir / f"digits-{self.image_size}px"

    @property
    def classes(self) -> list[str]:
        """Class folder names in label order (read from ``root/train`` without loading the dataset)."""
        if self.builtin == "digits":
            return list(DIGITS_CLASSES)
        return class_folders(self.data_root / "train", IMAGENET_LAYOUT)

    @property
    def num_classes(self) -> int:
        """Number of classes: 10 for digits, the number of class folders in ``root/train`` otherwise.

        Raises:
            DataError: ``root/train`` has fewer than two class folders (a classifier needs two classes).
        """
        classes = self.classes
        if len(classes) < 2:
            raise DataError(
                f"{self.data_root / 'train'} has {len(classes)} class folder(s) ({', '.join(classes)}); a classifier "
                f"needs at least two. Expected the layout {IMAGENET_LAYOUT}."
            )
        return len(classes)

    @property
    def mean(self) -> tuple[float, float, float]:
        """Per-channel mean the model normalises with (timm's IMAGENET_DEFAULT_MEAN)."""
        return MEAN

    @property
    def std(self) -> tuple[float, float, float]:
        """Per-channel std the model normalises with (timm's IMAGENET_DEFAULT_STD)."""
        return STD

    @property
    def eval_sets(self) -> list[EvalSet]:
        """The test sets, in the order of :meth:`test_dataloader`: clean, corrupted, ImageNet-C, -A, -R, -O, -O in."""
        return self.eval.eval_sets()

    def class_indices(self, eval_set: EvalSet) -> list[int] | None:
        """Columns of the model's logits that an evaluation set's labels refer to, or None for all classes.

        See :meth:`kpca.vision_cls.eval_data.EvalData.class_indices`.
        """
        return self.eval.class_indices(eval_set, self.classes, self.data_root)

    def prepare_data(self) -> None:
        """Write the digits tree (once per node; Lightning calls this on local rank 0 only) and check the folders."""
        if self.builtin == "digits":
            write_digits_imagefolder(self.data_root, image_size=self.image_size)
        self._check_layout()

    def setup(self, stage: str | None = None) -> None:
        """Split the global batch (:class:`ProjectDataModule`) and build the datasets that ``stage`` needs.

        For ``fit`` the training input path reads what its loader needs (:meth:`TrainInput.setup`).
        """
        super().setup(stage)
        self._check_layout()
        if stage in (None, "fit"):
            self.train_input.setup(self.data_root, self.classes)
        if stage in (None, "fit", "validate", "predict") and self.val_set is None:
            self.val_set = evaluation_set(self._eval_dataset(EvalSet("clean", "clean")), "val")
        if stage in (None, "test") and self.test_sets is None:
            self.test_sets = [evaluation_set(self._eval_dataset(s), s.name) for s in self.eval_sets]

    def check_data(self, progress: bool = True) -> tuple[int, list[DataProblem]]:
        """Decode every image of train, val and the configured robustness sets in ``num_workers`` workers.

        Also checks the layout: class folders present and non-empty, train and val with the same classes, every
        ImageNet-C corruption folder holding each of ``eval.severities``. The built-in digits are written first.

        Returns:
            The number of image files decoded and the problems found, each naming its file (``check-data``).
        """
        if self.builtin == "digits":
            write_digits_imagefolder(self.data_root, image_size=self.image_size)
        return check_image_folders(
            self.data_root,
            IMAGENET_LAYOUT,
            self.eval.variant_roots(),
            self.eval.imagenet_c_root,
            IMAGENET_C_LAYOUT,
            self.eval.severities,
            self.num_workers,
            progress,
        )

    def on_after_batch_transfer(self, batch: tuple[torch.Tensor, torch.Tensor], dataloader_idx: int) -> tuple:
        """Finish training batches on the device (the input path's :attr:`TrainInput.device_tail`).

        Lightning calls this for every batch after transfer; validation, test and predict batches pass as they are.
        """
        if self.trainer is None or not self.trainer.training:
            return batch
        images, labels = batch
        return self.train_input.device_tail(images), labels

    def eval_geometry(self) -> Callable:
        """Evaluation resize (short side to ``image_size / crop_pct``) and center crop, on PIL images."""
        return transforms.Compose(
            [
                transforms.Resize(
                    math.floor(self.image_size / self.crop_pct), interpolation=str_to_interp_mode(self.interpolation)
                ),
                transforms.CenterCrop(self.image_size),
            ]
        )

    def train_dataloader(self) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's shuffled training batches of the per-device size (:meth:`TrainInput.loader`).

        A DataLoader over the workers' ImageFolder (DeiT's :class:`~kpca.vision_cls.input.samplers.RepeatAugSampler`
        for ``repeated_aug > 1``, seeded with ``PL_GLOBAL_SEED``, else Lightning's sampler), or the DALI loader
        reading in the order of the same samplers; the last partial batch is dropped.
        """
        return self.train_input.loader(self)

    def val_dataloader(self) -> DataLoader:
        """The clean validation set."""
        return self.eval_loader(require_built(self.val_set, "validate"))

    def test_dataloader(self) -> list[DataLoader]:
        """One loader per entry of :attr:`eval_sets`, in that order."""
        return [self.eval_loader(dataset) for dataset in require_built(self.test_sets, "test")]

    def predict_dataloader(self) -> DataLoader:
        """The clean validation set."""
        return self.eval_loader(require_built(self.val_set, "predict"))

    def _eval_dataset(self, eval_set: EvalSet) -> Dataset:
        """The dataset of ``eval_set``, cut to ``eval.subset`` images spread over it."""
        dataset = self.eval.dataset(eval_set, self.data_root, self.classes, self.eval_geometry(), self.image_size)
        return self.eval.spread(dataset)

    def _check_layout(self) -> None:
        """Raise FileNotFoundError or ValueError naming the path and the expected layout if a folder is unusable."""
        train = self.classes
        val = class_folders(self.data_root / "val", IMAGENET_LAYOUT)
        if train != val:
            only_train, only_val = sorted(set(train) - set(val)), sorted(set(val) - set(train))
            raise OptionError(
                f"{self.data_root}: train and val class folders differ (only in train: {only_train[:5]}, only in val: "
                f"{only_val[:5]}); labels come from the folder names, so both splits need the same classes."
            )
        for split in ("train", "val"):
            require_nonempty_class_folders(self.data_root / split, split)
        self.eval.check_layout(train, self.data_root)
