"""ADE20K through mmsegmentation's ``ADE20KDataset`` and pipelines, in a LightningDataModule; corrupted test sets.

Batches are dicts. Training: ``images`` (B, 3, S, S) float32 RGB in [0, 1] and ``labels`` (B, S, S) int64, padded
to the crop size S with 0 and 255 (mmseg's ``SegDataPreProcessor``). Evaluation: ``images``, a list of (3, H, W)
images at the test scale, and ``labels``, a list of (H0, W0) label maps at the original size (mmseg loads the
annotation after ``Resize`` in its test pipeline), plus ``names``. Labels follow ``reduce_zero_label``: ADE20K's 0
("other") becomes 255 (ignored) and class k becomes k - 1, so 150 classes 0..149. Nothing is normalised here; the
model normalises inside, so corruptions act on real pixels.

Every read error names its file (:mod:`kpca.segmentation.data_checks`): an image or annotation that does not decode, an
annotation whose size differs from its image's, or label values outside the classes (reported as on disk) is a
:class:`~kpca.training.data_checks.problems.DataError`, in training and evaluation. With ``bad_files=skip`` the training
set skips damaged pairs (:class:`~kpca.training.data_checks.bad_files.NamedFileErrors`); evaluation sets never do.

Importing this module installs the ``mmcv.ops`` shim first (``kpca.segmentation``), and the dataset class that
DataLoader workers unpickle lives here, so spawned workers import the shim before mmseg too.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol

import mmseg.datasets  # noqa: F401 (registers mmseg's transforms; kpca.segmentation has installed the shim)
import numpy as np
import torch
import torch.nn.functional as F
from mmseg.datasets import ADE20KDataset
from mmseg.registry import TRANSFORMS
from torch.utils.data import DataLoader, Dataset

from kpca.segmentation.builtin_data import SyntheticADE20K, write_synthetic_ade20k
from kpca.segmentation.data_checks import guard_pipeline, pair_problems, split_problems
from kpca.segmentation.eval_data import EvalData
from kpca.training.data import ProjectDataModule, evenly_spaced, require_built
from kpca.training.data_checks.bad_files import BadFilesMode, NamedFileErrors, check_bad_files_options
from kpca.training.data_checks.check_data import check_in_workers
from kpca.training.data_checks.problems import DataError, DataProblem
from kpca.training.errors import MissingPathError, OptionError
from kpca.training.images.corruptions import check_corruptions, corrupt_seeded

ADE20K_LAYOUT = (
    "root/images/{training,validation}/*.jpg and root/annotations/{training,validation}/*.png (ADEChallengeData2016)"
)
SPLIT_FOLDERS = {"train": "training", "val": "validation"}


def train_pipeline(
    crop_size: int = 512,
    scale: tuple[int, int] = (2048, 512),
    ratio_range: tuple[float, float] = (0.5, 2.0),
    cat_max_ratio: float = 0.75,
) -> list[dict]:
    """Mmseg's ADE20K training pipeline (``configs/_base_/datasets/ade20k.py``) as config dicts."""
    return [
        {"type": "LoadImageFromFile"},
        {"type": "LoadAnnotations"},  # reduce_zero_label comes from ADE20KDataset (mmseg 1.x deprecates it here)
        {"type": "RandomResize", "scale": scale, "ratio_range": ratio_range, "keep_ratio": True},
        {"type": "RandomCrop", "crop_size": (crop_size, crop_size), "cat_max_ratio": cat_max_ratio},
        {"type": "RandomFlip", "prob": 0.5},
        {"type": "PhotoMetricDistortion"},
        {"type": "PackSegInputs"},
    ]


def eval_pipeline(scale: tuple[int, int] = (2048, 512)) -> list[dict]:
    """Mmseg's ADE20K test pipeline: resize keeping the ratio, then load the full-size annotation."""
    return [
        {"type": "LoadImageFromFile"},
        {"type": "Resize", "scale": scale, "keep_ratio": True},
        {"type": "LoadAnnotations"},  # reduce_zero_label from ADE20KDataset
        {"type": "PackSegInputs"},
    ]


class CorruptImage:
    """mmseg pipeline step: corrupt ``results["img"]`` (BGR uint8, as loaded) with ``imagecorruptions``, reproducibly.

    The seed of an image is a stable hash of ``(seed, corruption, severity, file name)``: the same image is always
    corrupted the same way, in any worker, run or order.

    Args:
        corruption: a name from ``kpca.training.images.corruptions.CORRUPTION_NAMES``.
        severity: 1 to 5.
        seed: base seed.
    """

    def __init__(self, corruption: str, severity: int, seed: int = 0) -> None:
        check_corruptions([corruption], [severity])
        self.corruption, self.severity, self.seed = corruption, severity, seed

    def __call__(self, results: dict) -> dict:
        key = f"{self.seed}:{self.corruption}:{self.severity}:{Path(results['img_path']).name}"
        rgb = np.ascontiguousarray(results["img"][..., ::-1])  # (H, W, 3) RGB
        corrupted = corrupt_seeded(rgb, self.corruption, self.severity, zlib.crc32(key.encode()))
        results["img"] = np.ascontiguousarray(np.asarray(corrupted, dtype=np.uint8)[..., ::-1])  # (H, W, 3) BGR
        return results

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.corruption!r}, severity={self.severity}, seed={self.seed})"


def build_transforms(configs: Sequence[dict]) -> list:
    """Build pipeline steps from config dicts with mmseg's registry (so ``LoadAnnotations`` is mmseg's)."""
    return [TRANSFORMS.build(dict(cfg)) for cfg in configs]


class MMSegDataset(Dataset):
    """An mmseg ``ADE20KDataset`` whose items are ``(image, label, name)`` tensors instead of packed samples.

    ``image`` is the (3, H, W) uint8 RGB tensor after the pipeline, ``label`` the (H', W') int64 label map
    (255 = ignored), ``name`` the image file stem. The pipeline's loaders name the file they fail on, and each
    annotation is checked against its image's size and the classes
    (:func:`~kpca.segmentation.data_checks.guard_pipeline`).

    Args:
        root: ADE20K root (``ADEChallengeData2016``).
        split: ``train`` or ``val``.
        pipeline: pipeline steps, ending in ``PackSegInputs``.
        indices: keep only these items (None: all).
    """

    def __init__(self, root: Path, split: Literal["train", "val"], pipeline: list, indices: list[int] | None = None):
        folder = SPLIT_FOLDERS[split]
        self.dataset = ADE20KDataset(
            data_root=str(root),
            data_prefix={"img_path": f"images/{folder}", "seg_map_path": f"annotations/{folder}"},
            pipeline=guard_pipeline(pipeline, split, len(ADE20KDataset.METAINFO["classes"])),
            indices=indices,
            test_mode=split != "train",
        )

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, str]:
        packed = self.dataset[index]
        image = packed["inputs"].flip(0)  # (3, H, W) uint8, BGR -> RGB
        sample = packed["data_samples"]
        label = sample.gt_sem_seg.data[0].long()  # (H', W')
        return image, label, Path(sample.img_path).stem

    def image_path(self, index: int) -> str:
        """The absolute path of item ``index``'s image."""
        return os.path.abspath(self.dataset.get_data_info(index)["img_path"])

    def pairs(self) -> list[tuple[str, str]]:
        """The ``(image, annotation)`` absolute paths of every item, in order."""
        infos = (self.dataset.get_data_info(i) for i in range(len(self)))
        return [(os.path.abspath(info["img_path"]), os.path.abspath(info["seg_map_path"])) for info in infos]


class PadCollate:
    """Stack training samples padded to ``size`` x ``size`` (image 0, label 255), as mmseg's data preprocessor."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, samples: list[tuple[torch.Tensor, torch.Tensor, str]]) -> dict[str, torch.Tensor]:
        images, labels = [], []
        for image, label, _ in samples:
            pad = (0, self.size - image.shape[-1], 0, self.size - image.shape[-2])
            images.append(F.pad(image, pad, value=0).float() / 255.0)  # (3, S, S)
            labels.append(F.pad(label, pad, value=255))  # (S, S)
        return {"images": torch.stack(images), "labels": torch.stack(labels)}


def collate_lists(samples: list[tuple[torch.Tensor, torch.Tensor, str]]) -> dict[str, list]:
    """Evaluation batch: lists of (3, H, W) float images in [0, 1], (H0, W0) labels and names (sizes differ)."""
    return {
        "images": [image.float() / 255.0 for image, _, _ in samples],
        "labels": [label for _, label, _ in samples],
        "names": [name for _, _, name in samples],
    }


class SegmentationData(Protocol):
    """What :class:`~kpca.segmentation.module.SegmentationModule` and its overlay callback read from the datamodule.

    :class:`ADE20KDataModule` provides it. The module and the callback check any other datamodule against it
    (:func:`kpca.training.data.require_datamodule`), naming what is missing.
    """

    @property
    def eval_sets(self) -> list[tuple[str, str | None, int | None]]:
        """``(name, corruption, severity)`` per test dataloader, in that order; the clean set first."""

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names, in label order (for the per-class report)."""

    @property
    def palette(self) -> list[list[int]]:
        """An RGB colour per class, for overlays."""


def _check_geometry(
    crop_size: int,
    scale: tuple[int, int],
    ratio_range: tuple[float, float],
    cat_max_ratio: float,
    train_subset: int | None,
) -> None:
    """Refuse training-crop and resize settings that mmseg's transforms would assert on or read as no resize."""
    if crop_size < 1 or min(scale) < 1:
        raise OptionError(
            f"data.crop_size={crop_size} and data.scale={list(scale)} must be 1 or more (the paper: 512 and "
            "[2048, 512])"
        )
    if not 0.0 < ratio_range[0] <= ratio_range[1]:
        raise OptionError(f"data.ratio_range={list(ratio_range)} must satisfy 0 < low <= high (the paper: [0.5, 2.0])")
    if not 0.0 < cat_max_ratio <= 1.0:
        raise OptionError(f"data.cat_max_ratio={cat_max_ratio} must be in (0, 1] (the paper: 0.75; 1 disables)")
    if train_subset is not None and train_subset < 1:
        raise OptionError(f"data.train_subset={train_subset} must be 1 or more, or null for every training image")


class ADE20KDataModule(ProjectDataModule):
    """ADE20K (or the built-in synthetic ADE20K) with mmseg's pipelines, and corrupted copies of the validation set.

    ``val_dataloader`` and ``predict_dataloader`` give the clean validation set; ``test_dataloader`` gives one
    loader per entry of :attr:`eval_sets`: the clean set, then each corruption at each severity (the ``data.eval``
    group).

    Args:
        root: ADE20K root with the layout ``root/images/{training,validation}/*.jpg`` and
            ``root/annotations/{training,validation}/*.png``. Exactly one of ``root`` and ``builtin`` must be set.
        builtin: ``synthetic``: the built-in synthetic ADE20K (see :mod:`kpca.segmentation.builtin_data`), written
            once into ``cache_dir``.
        synthetic: size and seed of the built-in set.
        cache_dir: where built-in data is written; default ``$KPCA_CACHE`` or ``~/.cache/kpca``.
        batch_size: global training batch (split over devices x nodes; the paper: 8).
        eval_batch_size: evaluation images per device and step (mmseg: 1).
        num_workers: dataloader worker processes per device.
        multiprocessing_context: ``fork``, ``spawn`` or ``forkserver`` for the workers; None: the platform default.
        pin_memory: pin batches in page-locked memory (only when the trainer's accelerator is not the CPU).
        crop_size: training crop side S (the paper: 512).
        scale: mmseg's (long, short) resize scale for training (times ``ratio_range``) and evaluation.
        ratio_range: random rescale range of ``scale`` in training.
        cat_max_ratio: a crop is re-drawn (up to 10 times) while one class covers more than this fraction.
        train_subset: use only this many training images, evenly spaced (None: all).
        eval: the corrupted test sets and the size of every evaluation set
            (:class:`~kpca.segmentation.eval_data.EvalData`, the ``data.eval`` group): ``corruption_preset``,
            ``corruptions`` and ``severities`` replacing the preset's, ``corruption_seed``, and ``subset``.
        bad_files: what a damaged training pair (an image or annotation that does not decode, sizes that differ,
            label values outside the classes) does: ``error`` stops the fit with an error naming the file (the
            default); ``skip`` trains on the next pair instead, logs each damaged pair once as a WARNING and counts
            them (``data/bad_files`` in TensorBoard and the HParams summary). Evaluation sets never skip. The
            ``check-data`` subcommand lists every problem before a run.
        max_bad_fraction: with ``bad_files=skip``, the fit stops with an error once more than this fraction of the
            training pairs is damaged (default 0.001).
    """

    def __init__(
        self,
        root: Path | None = None,
        builtin: Literal["synthetic"] | None = None,
        synthetic: SyntheticADE20K = SyntheticADE20K(),  # noqa: B008 (frozen dataclass default)
        cache_dir: Path | None = None,
        batch_size: int = 8,
        eval_batch_size: int = 1,
        num_workers: int = 4,
        multiprocessing_context: Literal["fork", "spawn", "forkserver"] | None = None,
        pin_memory: bool = True,
        crop_size: int = 512,
        scale: tuple[int, int] = (2048, 512),
        ratio_range: tuple[float, float] = (0.5, 2.0),
        cat_max_ratio: float = 0.75,
        train_subset: int | None = None,
        eval: EvalData = EvalData(),  # noqa: B008 (frozen dataclass default)
        bad_files: BadFilesMode = "error",
        max_bad_fraction: float = 0.001,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            num_workers=num_workers,
            cache_dir=cache_dir,
            eval_batch_size=eval_batch_size,
            pin_memory=pin_memory,
            multiprocessing_context=multiprocessing_context,
        )
        if (root is None) == (builtin is None):
            raise OptionError(
                f"set exactly one of data.root (an ADE20K folder: {ADE20K_LAYOUT}) and data.builtin ('synthetic'); "
                f"got root={root!r}, builtin={builtin!r}"
            )
        check_bad_files_options(bad_files, max_bad_fraction)
        _check_geometry(crop_size, tuple(scale), tuple(ratio_range), cat_max_ratio, train_subset)
        self.root = Path(root) if root is not None else None
        self.builtin = builtin
        self.synthetic = synthetic
        self.crop_size = crop_size
        self.scale = tuple(scale)
        self.ratio_range = tuple(ratio_range)
        self.cat_max_ratio = cat_max_ratio
        self.train_subset = train_subset
        self.eval = eval
        self.bad_files = bad_files
        self.max_bad_fraction = max_bad_fraction
        self.train_set: NamedFileErrors | None = None
        self.val_set: NamedFileErrors | None = None
        self.test_sets: list[NamedFileErrors] | None = None

    @property
    def data_root(self) -> Path:
        """The ADE20K folder read: ``root``, or the built-in set's folder in ``cache_dir``."""
        return self.root if self.root is not None else self.cache_dir / self.synthetic.folder_name

    @property
    def classes(self) -> tuple[str, ...]:
        """The 150 ADE20K class names, in label order."""
        return tuple(ADE20KDataset.METAINFO["classes"])

    @property
    def num_classes(self) -> int:
        """Number of classes (150), linked to the model by the CLI."""
        return len(self.classes)

    @property
    def palette(self) -> list[list[int]]:
        """ADE20K's RGB colour per class, for overlays."""
        return [list(c) for c in ADE20KDataset.METAINFO["palette"]]

    @property
    def eval_sets(self) -> list[tuple[str, str | None, int | None]]:
        """``(name, corruption, severity)`` per test loader: ``("clean", None, None)``, ``("fog/s3", "fog", 3)``...

        After the clean set come exactly the pairs of ``eval.corruption_set``, corruption-major
        (:meth:`~kpca.segmentation.eval_data.EvalData.eval_sets`).
        """
        return self.eval.eval_sets()

    def prepare_data(self) -> None:
        """Write the built-in set (once per node; Lightning calls this on local rank 0 only) and check the layout."""
        if self.builtin == "synthetic":
            write_synthetic_ade20k(self.cache_dir, self.synthetic)
        self._check_layout()

    def setup(self, stage: str | None = None) -> None:
        """Split the global batch (:class:`ProjectDataModule`) and build the datasets that ``stage`` needs."""
        super().setup(stage)
        self._check_layout()
        if stage in (None, "fit") and self.train_set is None:
            pipeline = train_pipeline(self.crop_size, self.scale, self.ratio_range, self.cat_max_ratio)
            train_set = self._dataset("train", build_transforms(pipeline), self.train_subset)
            self.train_set = NamedFileErrors(
                train_set, train_set.image_path, "train", self.bad_files, self.max_bad_fraction
            )
        if stage in (None, "fit", "validate", "predict") and self.val_set is None:
            self.val_set = _evaluation_set(self.eval_dataset(None, None))
        if stage in (None, "test") and self.test_sets is None:
            self.test_sets = [_evaluation_set(self.eval_dataset(c, s)) for _, c, s in self.eval_sets]

    def check_data(self, progress: bool = True) -> tuple[int, list[DataProblem]]:
        """Read every image and annotation of both splits in ``num_workers`` workers and check each pair.

        Each pair: both files decode to their last pixel, the annotation is a single-channel label map of its
        image's size with values 0, 1..150 or 255 on disk; each split exists and is not empty. The built-in set is
        written first.

        Returns:
            The number of files read and the problems found, each naming its file (``check-data``).
        """
        if self.builtin == "synthetic":
            write_synthetic_ade20k(self.cache_dir, self.synthetic)
        problems, items = [], []
        for split, folder in SPLIT_FOLDERS.items():
            images, annotations = self.data_root / "images" / folder, self.data_root / "annotations" / folder
            wrong = split_problems(images, annotations, split, ADE20K_LAYOUT)
            problems += wrong
            if not wrong:
                pairs = MMSegDataset(self.data_root, split, []).pairs()
                items += [(image, annotation, split, self.num_classes) for image, annotation in pairs]
        problems += check_in_workers(items, pair_problems, self.num_workers, "image/annotation pairs", progress)
        return 2 * len(items), problems

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches of the per-device size, padded to the crop size, last partial batch dropped."""
        return self.train_loader(require_built(self.train_set, "fit"), collate_fn=PadCollate(self.crop_size))

    def val_dataloader(self) -> DataLoader:
        """The clean validation set (lists of images at the test scale and labels at the original size)."""
        return self.eval_loader(require_built(self.val_set, "validate"), collate_fn=collate_lists)

    def test_dataloader(self) -> list[DataLoader]:
        """One loader per entry of :attr:`eval_sets`, in that order."""
        return [self.eval_loader(d, collate_fn=collate_lists) for d in require_built(self.test_sets, "test")]

    def predict_dataloader(self) -> DataLoader:
        """The clean validation set."""
        return self.eval_loader(require_built(self.val_set, "predict"), collate_fn=collate_lists)

    def _dataset(self, split: Literal["train", "val"], pipeline: list, subset: int | None) -> MMSegDataset:
        count = len(list((self.data_root / "images" / SPLIT_FOLDERS[split]).glob("*.jpg")))
        return MMSegDataset(self.data_root, split, pipeline, evenly_spaced(count, subset))

    def eval_dataset(self, corruption: str | None = None, severity: int | None = None) -> MMSegDataset:
        """The validation set through the test pipeline, corrupted on the original image when ``corruption`` is set."""
        steps = build_transforms(eval_pipeline(self.scale))
        if corruption is not None:
            steps.insert(1, CorruptImage(corruption, severity, self.eval.corruption_seed))  # on the original image
        return self._dataset("val", steps, self.eval.subset)

    def _check_layout(self) -> None:
        """Raise FileNotFoundError naming the missing folder and the expected ADE20K layout."""
        for kind in ("images", "annotations"):
            for folder in SPLIT_FOLDERS.values():
                path = self.data_root / kind / folder
                if not path.is_dir():
                    raise MissingPathError(
                        f"{path} is not a directory; data.root must hold the ADE20K layout {ADE20K_LAYOUT}"
                    )
                if kind == "images" and not any(path.glob("*.jpg")):
                    raise MissingPathError(f"{path} holds no .jpg images; expected the ADE20K layout {ADE20K_LAYOUT}")
        for split, folder in SPLIT_FOLDERS.items():
            images, annotations = self.data_root / "images" / folder, self.data_root / "annotations" / folder
            problems = split_problems(images, annotations, split, ADE20K_LAYOUT)
            if problems:
                raise DataError(problems)


def _evaluation_set(dataset: MMSegDataset) -> NamedFileErrors:
    """An evaluation set whose read errors name the file; it never skips (every metric is over the whole set)."""
    return NamedFileErrors(dataset, dataset.image_path, "val", evaluation=True)
