"""The ``data.eval`` option group: the test sets of ImageNetDataModule beyond the clean validation set.

In a config file::

    data:
      eval:
        imagenet_c: /data/imagenet-c
        corruptions: [gaussian_noise, fog]
        severities: [1, 2, 3]
        subset: 1000

and on the command line ``--data.eval.corruptions=[gaussian_noise,fog]``. :class:`EvalData` holds these options and
knows the sets they give (:meth:`EvalData.eval_sets`, one :class:`EvalSet` per test dataloader), their folders and
their labels; :class:`~kpca.vision_cls.data.ImageNetDataModule` builds the loaders.

Folder layouts (ImageFolder-style, one sub-folder per class):

* ImageNet-C: ``<imagenet_c>/<corruption>/<severity>/<wnid>/*``. The released files are already 224×224 center
  crops, so they only get ``CenterCrop(image_size)`` (a no-op at 224), as in Hendrycks & Dietterich's
  ``ImageNet-C/test.py`` and the RPC authors' ``eval_OOD.py``; they are not resized again.
* ImageNet-A, ImageNet-R, ImageNet-O: ``<root>/<wnid>/*`` (200 classes each).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PIL import Image
from torch.utils.data import Dataset, Subset
from torchvision import transforms
from torchvision.datasets import ImageFolder

from kpca.training.choices import choices
from kpca.training.data import evenly_spaced
from kpca.training.errors import OptionError
from kpca.training.eval_subset import check_eval_subset
from kpca.training.images.corruptions import CORRUPTION_NAMES, check_corruptions
from kpca.vision_cls.corrupted import CorruptedDataset
from kpca.vision_cls.image_folders import ClassListImageFolder, class_folders
from kpca.vision_cls.robustness import VariantName, check_class_folders, variant_synsets

EvalKind = Literal["clean", "corrupted", "imagenet_c", "imagenet_a", "imagenet_r", "imagenet_o", "imagenet_o_in"]
IMAGENET_C_LAYOUT = "<data.eval.imagenet_c>/<corruption>/<severity>/<wnid>/* (e.g. gaussian_noise/1/n01440764/x.JPEG)"


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set of :meth:`ImageNetDataModule.test_dataloader` (one loader each, in this order).

    Attributes:
        name: Log prefix, e.g. ``"clean"``, ``"corrupted/fog/3"``, ``"imagenet_c/fog/3"``, ``"imagenet_a"``.
        kind: ``"clean"`` (the validation set), ``"corrupted"`` (validation set corrupted on the fly),
            ``"imagenet_c"`` (ImageNet-C folders), ``"imagenet_a"``, ``"imagenet_r"``, ``"imagenet_o"`` (the
            out-of-distribution images, label -1), ``"imagenet_o_in"`` (its in-distribution partner: the validation
            images of ImageNet-O's 200 classes).
        corruption: Corruption name for ``"corrupted"`` and ``"imagenet_c"``, else None.
        severity: Severity 1-5 for ``"corrupted"`` and ``"imagenet_c"``, else None.
    """

    name: str
    kind: EvalKind
    corruption: str | None = None
    severity: int | None = None


@dataclass(frozen=True)
class EvalData:
    """The evaluation sets of the ``test`` stage beyond the clean validation set, and the size of every evaluation set.

    Args:
        imagenet_c: ImageNet-C root, ``<corruption>/<severity>/<wnid>/*``; every corruption folder found is
            evaluated at each of ``severities`` (the mean corruption accuracy and mCE use the 15 benchmark
            corruptions only; the 4 extra ones get their own rows). Images are center-cropped to ``image_size``
            without resizing, the benchmark's protocol; an image smaller than ``image_size`` is an error.
        imagenet_a: ImageNet-A root (200 wnid folders); labels are positions in sorted wnid order. Every folder must
            be one of ImageNet-A's wnids (so a wrong root, e.g. ImageNet-R, is an error).
        imagenet_r: ImageNet-R root (200 wnid folders); labels are positions in sorted wnid order. Every folder must
            be one of ImageNet-R's wnids.
        imagenet_o: ImageNet-O root (wnid folders of out-of-distribution images, label -1); also adds the
            in-distribution set ``imagenet_o_in``: the validation images of ImageNet-O's 200 classes. Every folder
            must be one of ImageNet-O's wnids.
        corruptions: ``imagecorruptions`` names applied on the fly to the validation set (after the resize and crop),
            each at every severity in ``severities``, e.g. ``[gaussian_noise, fog]``. ``glass_blur`` is compiled by
            numba on first use in each worker (a few seconds).
        severities: Severities (1-5) for ``corruptions`` and for ImageNet-C.
        subset: Use only this many images of every evaluation set (validation, test and predict loaders), spread
            evenly over the set so all classes appear; None uses all. For quick runs.
    """

    imagenet_c: str | None = None
    imagenet_a: str | None = None
    imagenet_r: str | None = None
    imagenet_o: str | None = None
    corruptions: tuple[str, ...] = ()
    severities: tuple[int, ...] = (1, 2, 3, 4, 5)
    subset: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "corruptions", tuple(self.corruptions))  # lists from Python callers
        object.__setattr__(self, "severities", tuple(self.severities))
        check_eval_subset(self.subset)
        check_corruptions(self.corruptions, self.severities)
        if (self.corruptions or self.imagenet_c) and not self.severities:
            raise OptionError(
                "data.eval.severities is empty; list at least one of 1-5 for the corruptions and ImageNet-C."
            )

    def check_image_size(self, image_size: int) -> None:
        """Raise ValueError if the on-the-fly corruptions cannot run on ``image_size`` pixel images."""
        if self.corruptions and image_size < 32:
            raise OptionError(
                f"data.image_size={image_size}: imagecorruptions (data.eval.corruptions) needs images of at least "
                "32 pixels; raise data.image_size or set data.eval.corruptions: []."
            )

    @property
    def imagenet_c_root(self) -> Path | None:
        """The ImageNet-C root as a path, or None."""
        return None if self.imagenet_c is None else Path(self.imagenet_c)

    def variant_roots(self) -> dict[VariantName, Path | None]:
        """The root folders of ImageNet-A, -R and -O, each its field of the same name (None where unset)."""
        roots = {kind: getattr(self, kind) for kind in choices(VariantName)}
        return {kind: None if root is None else Path(root) for kind, root in roots.items()}

    def variant_root(self, kind: str) -> Path:
        """The root folder of ImageNet-A, -R or -O (``kind``); ValueError naming the option if it is unset."""
        root = self.variant_roots().get(kind)
        if root is None:
            raise OptionError(f"Eval set kind {kind!r} has no folder; set data.eval.{kind}.")
        return root

    def imagenet_c_corruptions(self) -> list[str]:
        """Corruption folders of the ImageNet-C root, in imagecorruptions' (ImageNet-C's) order."""
        root = self.imagenet_c_root
        assert root is not None, "only called when imagenet_c is set"
        folders = class_folders(root, IMAGENET_C_LAYOUT)
        known = list(CORRUPTION_NAMES)
        unknown = [f for f in folders if f not in known]
        if unknown:
            raise OptionError(
                f"{root} has folders {unknown} that are not corruption names; expected the layout "
                f"{IMAGENET_C_LAYOUT} with corruptions among {known}."
            )
        return [c for c in known if c in folders]

    def eval_sets(self) -> list[EvalSet]:
        """The test sets, in the order of the test dataloaders: clean, corrupted, ImageNet-C, -A, -R, -O, -O in."""
        sets = [EvalSet("clean", "clean")]
        sets += [EvalSet(f"corrupted/{c}/{s}", "corrupted", c, s) for c in self.corruptions for s in self.severities]
        if self.imagenet_c is not None:
            sets += [
                EvalSet(f"imagenet_c/{c}/{s}", "imagenet_c", c, s)
                for c in self.imagenet_c_corruptions()
                for s in self.severities
            ]
        if self.imagenet_a is not None:
            sets.append(EvalSet("imagenet_a", "imagenet_a"))
        if self.imagenet_r is not None:
            sets.append(EvalSet("imagenet_r", "imagenet_r"))
        if self.imagenet_o is not None:
            sets += [EvalSet("imagenet_o", "imagenet_o"), EvalSet("imagenet_o_in", "imagenet_o_in")]
        return sets

    def check_layout(self, classes: Sequence[str], data_root: Path) -> None:
        """Raise FileNotFoundError or ValueError naming the folder and the expected layout if a set is unusable.

        Args:
            classes: The training classes (ImageNet-O needs its wnids among them).
            data_root: The ImageFolder root of the training and validation sets, named in errors.
        """
        for kind, root in self.variant_roots().items():
            if root is not None:
                check_class_folders(root, kind)
        root = self.imagenet_c_root
        if root is not None:
            for corruption in self.imagenet_c_corruptions():
                for severity in self.severities:
                    class_folders(root / corruption / str(severity), IMAGENET_C_LAYOUT)
        if self.imagenet_o is not None:
            _ood_classes(classes, data_root)

    def class_indices(self, eval_set: EvalSet, classes: Sequence[str], data_root: Path) -> list[int] | None:
        """Columns of the model's logits that an evaluation set's labels refer to, or None for all classes.

        ImageNet-A and -R labels are positions in their sorted 200 wnids, so their predictions are the argmax over
        these columns. ImageNet-O and its in-distribution set use ImageNet-O's own 200 classes present in the
        training classes (all 200 on ImageNet-1K), as in Hendrycks et al.'s evaluation.

        Args:
            eval_set: One of :meth:`eval_sets`.
            classes: The training classes, in label (logit) order.
            data_root: The ImageFolder root of the training classes, named in errors.
        """
        class_to_idx = {name: i for i, name in enumerate(classes)}
        if eval_set.kind in ("imagenet_a", "imagenet_r"):
            root = self.variant_root(eval_set.kind)
            wnids = check_class_folders(root, eval_set.kind)
            missing = [w for w in wnids if w not in class_to_idx]
            if missing:
                raise OptionError(
                    f"{root} has class folders {missing[:5]} that are not training classes of {data_root}; "
                    f"{eval_set.kind} needs an ImageNet-1K root (wnid folder names)."
                )
            return [class_to_idx[w] for w in wnids]
        if eval_set.kind in ("imagenet_o", "imagenet_o_in"):
            return [class_to_idx[w] for w in _ood_classes(classes, data_root)]
        return None

    def spread(self, dataset: Dataset) -> Dataset:
        """At most ``subset`` items spread evenly over ``dataset`` (every class of a sorted ImageFolder is hit)."""
        indices = evenly_spaced(len(dataset), self.subset)
        return dataset if indices is None else Subset(dataset, indices)

    def dataset(
        self, eval_set: EvalSet, data_root: Path, classes: Sequence[str], geometry: Callable, image_size: int
    ) -> Dataset:
        """The whole dataset of ``eval_set`` (before :meth:`spread`), yielding float32 pixel images in [0, 1].

        Args:
            eval_set: One of :meth:`eval_sets`.
            data_root: The ImageFolder root whose ``val/`` holds the validation images.
            classes: The training classes, in label order.
            geometry: The evaluation resize and center crop on PIL images (``ImageNetDataModule.eval_geometry``);
                ImageNet-C images are only center-cropped to ``image_size`` instead.
            image_size: Side of the square images the model sees, in pixels.
        """
        to_tensor = transforms.Compose([geometry, transforms.ToTensor()])
        if eval_set.kind == "clean":
            return ClassListImageFolder(data_root / "val", classes, transform=to_tensor)
        if eval_set.kind == "corrupted":
            assert eval_set.corruption is not None and eval_set.severity is not None, "set by eval_sets"
            val_set = ClassListImageFolder(data_root / "val", classes, transform=geometry)
            return CorruptedDataset(val_set, eval_set.corruption, eval_set.severity)
        if eval_set.kind == "imagenet_c":
            root = self.imagenet_c_root
            assert root is not None, "set by eval_sets"
            folder = root / str(eval_set.corruption) / str(eval_set.severity)
            return ClassListImageFolder(folder, classes, transform=_imagenet_c_transform(image_size, folder))
        if eval_set.kind == "imagenet_o_in":
            return ClassListImageFolder(data_root / "val", _ood_classes(classes, data_root), transform=to_tensor)
        target_transform = _ood_label if eval_set.kind == "imagenet_o" else None
        root = self.variant_root(eval_set.kind)
        return ImageFolder(str(root), transform=to_tensor, target_transform=target_transform)


def _ood_classes(classes: Sequence[str], data_root: Path) -> list[str]:
    """ImageNet-O's 200 wnids among the training ``classes`` (of ``data_root``), sorted."""
    ours = set(classes)
    wnids = [w for w in variant_synsets("imagenet_o") if w in ours]
    if not wnids:
        raise OptionError(
            f"data.eval.imagenet_o is set but {data_root} has none of ImageNet-O's 200 wnids as class folders; "
            "ImageNet-O needs an ImageNet-1K root."
        )
    return wnids


def _imagenet_c_transform(image_size: int, folder: Path) -> Callable:
    """ImageNet-C's evaluation transform for the images of ``folder``: ``CenterCrop(image_size)``, ``ToTensor``.

    The released ImageNet-C files are 224×224 crops of resized validation images; Hendrycks & Dietterich
    (``ImageNet-C/test.py``) and the RPC authors (``eval_OOD.py``) only center-crop them to 224, a no-op.
    """
    return transforms.Compose([_CenterCropNoPad(image_size, folder), transforms.ToTensor()])


class _CenterCropNoPad(transforms.CenterCrop):
    """``CenterCrop(size)`` that refuses images smaller than ``size`` instead of padding them with black.

    Args:
        size: Side of the square crop, in pixels.
        folder: The folder whose images are cropped, named in the error.
    """

    def __init__(self, size: int, folder: Path) -> None:
        super().__init__(size)
        self.side = size
        self.folder = folder

    def forward(self, image: Image.Image) -> Image.Image:
        """The centre ``side`` × ``side`` crop of a PIL image at least that large."""
        width, height = image.size
        if min(width, height) < self.side:
            raise OptionError(
                f"{self.folder} holds a {width}x{height} image, smaller than data.image_size={self.side}: ImageNet-C "
                f"images are center-cropped, never resized, so set data.image_size to at most {min(width, height)} "
                "(224 for the released ImageNet-C files)."
            )
        return super().forward(image)


def _ood_label(_: int) -> int:
    """Label of an out-of-distribution image (ImageNet-O)."""
    return -1
