"""Damaged image data, named by file: the datasets' read errors, the cheap checks of ``setup``, and ``check-data``.

:func:`training_set` and :func:`evaluation_set` wrap an ImageFolder-based dataset in
:class:`~kpca.training.data_checks.bad_files.NamedFileErrors` (paths from ImageFolder's ``samples``, through ``Subset``
and the on-the-fly corruptions). :func:`require_nonempty_class_folders` is the cheap check ``setup`` runs before the
model is built (torchvision's own error names neither the split nor the root). :func:`check_image_folders` is the full
check behind ``vision-cls check-data``: every file of every configured split decodes to the end, class folders are not
empty, and ImageNet-C holds every corruption x severity folder.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from PIL import Image
from torch.utils.data import Dataset, Subset
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from kpca.training.data_checks.bad_files import (
    EVALUATION_FIX,
    BadFilesMode,
    NamedFileErrors,
    describe_error,
    training_fix,
)
from kpca.training.data_checks.check_data import check_in_workers
from kpca.training.data_checks.problems import DataError, DataProblem
from kpca.training.images.corruptions import CORRUPTION_NAMES
from kpca.training.images.decoding import strict_image_decoding
from kpca.vision_cls.robustness import check_class_folders

TRAIN_GROUP = "data.train"
"""The training options' group (:class:`kpca.vision_cls.input.options.TrainData`), as messages spell them."""
TRAINING_FIX = training_fix(TRAIN_GROUP)
IMAGE_EXTENSIONS = ", ".join(IMG_EXTENSIONS)
EMPTY_FOLDER_FIX = (
    "Put the class's images in it or remove the folder (labels come from the folder names, so train and val need "
    "the same classes)."
)


def sample_path(dataset: Dataset, index: int) -> str:
    """The absolute path of item ``index``'s file: ImageFolder's ``samples``, through ``Subset`` and wrappers.

    Raises:
        TypeError: If no dataset in the chain lists its files (an ImageFolder-like ``samples`` list).
    """
    while not hasattr(dataset, "samples"):
        if isinstance(dataset, Subset):
            index, dataset = dataset.indices[index], dataset.dataset
        elif hasattr(dataset, "base"):  # CorruptedDataset
            dataset = dataset.base
        elif hasattr(dataset, "dataset"):
            dataset = dataset.dataset
        else:
            raise TypeError(
                f"{type(dataset).__name__} does not list its files; damaged files are named through an "
                "ImageFolder-like `samples` list of (path, label)."
            )
    return os.path.abspath(dataset.samples[index][0])


def training_set(dataset: Dataset, mode: BadFilesMode, max_bad_fraction: float) -> NamedFileErrors:
    """The training set with named read errors, skipping damaged files in ``skip`` mode (``data.train.bad_files``)."""
    return _named(dataset, "train", mode=mode, max_bad_fraction=max_bad_fraction, group=TRAIN_GROUP)


def evaluation_set(dataset: Dataset, split: str) -> NamedFileErrors:
    """An evaluation set with named read errors; it never skips (every metric is over the whole set)."""
    return _named(dataset, split, evaluation=True)


def _named(dataset: Dataset, split: str, **options: object) -> NamedFileErrors:
    path_of = functools.partial(sample_path, dataset)
    if len(dataset):
        path_of(0)  # a dataset without file paths fails here, not at its first damaged file
    return NamedFileErrors(dataset, path_of, split, **options)


def _class_dirs(root: Path) -> list[Path]:
    return sorted((Path(entry.path) for entry in os.scandir(root) if entry.is_dir()), key=lambda p: p.name)


def _is_image(name: str) -> bool:
    return has_file_allowed_extension(name, IMG_EXTENSIONS)


def _has_image(folder: Path) -> bool:
    """Whether ``folder`` (searched recursively, as ImageFolder does) holds an image file; stops at the first."""
    return any(any(map(_is_image, names)) for _, _, names in os.walk(folder, followlinks=True))


def _images(folder: Path) -> list[str]:
    """The image files ImageFolder reads from one class folder (recursively), sorted, as absolute paths."""
    found = [
        os.path.join(parent, name)
        for parent, _, names in os.walk(folder, followlinks=True)
        for name in names
        if _is_image(name)
    ]
    return sorted(os.path.abspath(path) for path in found)


def _empty_folder_problem(folder: Path, split: str, root: Path) -> DataProblem:
    return DataProblem(
        str(folder.absolute()),
        split,
        f"class folder of {root.absolute()} holds no image file (extensions {IMAGE_EXTENSIONS})",
        EMPTY_FOLDER_FIX,
    )


def require_nonempty_class_folders(root: Path, split: str) -> None:
    """Raise a DataError naming the split, the root and every class folder of ``root`` without an image file.

    Cheap: each folder is read only up to its first image. ``root`` must exist (the layout check comes first).
    """
    problems = [_empty_folder_problem(folder, split, root) for folder in _class_dirs(root) if not _has_image(folder)]
    if problems:
        raise DataError(problems)


def decode_problems(item: tuple[str, str]) -> list[DataProblem]:
    """The problem of one ``(path, split)`` image file that does not decode to its last pixel (none if it does)."""
    path, split = item
    try:
        with strict_image_decoding(), Image.open(path) as image:
            image.convert("RGB")  # decodes every pixel, as ImageFolder's loader does
    except Exception as error:
        return [DataProblem(path, split, describe_error(error), TRAINING_FIX if split == "train" else EVALUATION_FIX)]
    return []


def scan_image_folder(root: Path, split: str, layout: str) -> tuple[list[tuple[str, str]], list[DataProblem]]:
    """The ``(path, split)`` image files of an ImageFolder ``root`` and its layout problems (missing, empty folders)."""
    if not root.is_dir():
        fix = f"Point the setting at a folder with the layout {layout}."
        return [], [DataProblem(str(root.absolute()), split, "is not a directory", fix)]
    folders = _class_dirs(root)
    if not folders:
        fix = f"Expected the layout {layout}."
        return [], [DataProblem(str(root.absolute()), split, "has no class sub-folders", fix)]
    files, problems = [], []
    for folder in folders:
        images = _images(folder)
        files += [(path, split) for path in images]
        if not images:
            problems.append(_empty_folder_problem(folder, split, root))
    return files, problems


def _imagenet_c_items(
    root: Path, severities: Sequence[int], layout: str
) -> tuple[list[tuple[str, str]], list[DataProblem]]:
    """Files and problems of ImageNet-C: every corruption folder found x every configured severity."""
    if not root.is_dir():
        fix = f"Set data.eval.imagenet_c to a folder with the layout {layout}."
        return [], [DataProblem(str(root.absolute()), "imagenet_c", "is not a directory", fix)]
    known = list(CORRUPTION_NAMES)
    folders = _class_dirs(root)
    files, problems = [], []
    if not any(folder.name in known for folder in folders):
        fix = f"Expected the layout {layout}."
        problems.append(DataProblem(str(root.absolute()), "imagenet_c", "holds no corruption folder", fix))
    for folder in folders:
        if folder.name not in known:
            fix = f"Remove or rename it; corruption folders are among {known}."
            problems.append(DataProblem(str(folder.absolute()), "imagenet_c", "is not a corruption name", fix))
            continue
        for severity in severities:
            if not (folder / str(severity)).is_dir():
                problem = f"severity folder {severity} is missing (data.eval.severities lists it)"
                fix = f"Add it from the ImageNet-C release, or drop {severity} from data.eval.severities."
                problems.append(DataProblem(str((folder / str(severity)).absolute()), "imagenet_c", problem, fix))
                continue
            found, wrong = scan_image_folder(folder / str(severity), f"imagenet_c/{folder.name}/{severity}", layout)
            files += found
            problems += wrong
    return files, problems


def _variant_items(kind: str, root: Path) -> tuple[list[tuple[str, str]], list[DataProblem]]:
    """Files and problems of ImageNet-A, -R or -O: the variant's wnid folders, each non-empty."""
    try:
        check_class_folders(root, kind)
    except (FileNotFoundError, ValueError) as error:
        return [], [DataProblem(str(root.absolute()), kind, str(error), f"Set data.eval.{kind} to the released set.")]
    return scan_image_folder(root, kind, f"{root}/<wnid>/<image>")


def check_image_folders(
    data_root: Path,
    layout: str,
    variant_roots: Mapping[str, Path | None],
    imagenet_c_root: Path | None,
    imagenet_c_layout: str,
    severities: Sequence[int],
    num_workers: int,
    progress: bool = True,
) -> tuple[int, list[DataProblem]]:
    """Check every configured split of an ImageNet-style datamodule: layout, class folders, every file decoding.

    Args:
        data_root: the ImageFolder root holding ``train/`` and ``val/``.
        layout: the expected layout of ``data_root``, for the fixes.
        variant_roots: ``{"imagenet_a": root or None, ...}``: the ImageNet-A, -R and -O roots.
        imagenet_c_root: the ImageNet-C root, or None.
        imagenet_c_layout: its expected layout, for the fixes.
        severities: the ImageNet-C severities that must be present.
        num_workers: DataLoader workers that decode the files.
        progress: show a progress bar.

    Returns:
        The number of image files decoded, and every problem found (layout problems first, then files).
    """
    files, problems = [], []
    classes = {}
    for split in ("train", "val"):
        found, wrong = scan_image_folder(data_root / split, split, layout)
        files += found
        problems += wrong
        if (data_root / split).is_dir():
            classes[split] = [folder.name for folder in _class_dirs(data_root / split)]
    if len(classes) == 2 and classes["train"] != classes["val"]:
        only_train = sorted(set(classes["train"]) - set(classes["val"]))
        only_val = sorted(set(classes["val"]) - set(classes["train"]))
        problems.append(
            DataProblem(
                str(data_root.absolute()),
                "train/val",
                f"train and val class folders differ (only in train: {only_train[:5]}, only in val: {only_val[:5]})",
                "Give both splits the same class folders: labels come from the folder names.",
            )
        )
    for kind, root in variant_roots.items():
        if root is not None:
            found, wrong = _variant_items(kind, root)
            files += found
            problems += wrong
    if imagenet_c_root is not None:
        found, wrong = _imagenet_c_items(imagenet_c_root, severities, imagenet_c_layout)
        files += found
        problems += wrong
    problems += check_in_workers(files, decode_problems, num_workers, "images", progress=progress)
    return len(files), problems
