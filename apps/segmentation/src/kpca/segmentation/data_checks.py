"""Damaged ADE20K data, named by file: checked pipeline steps, the cheap checks of ``setup``, and ``check-data``.

:func:`guard_pipeline` makes mmseg's loading steps name their file when decoding fails and adds :class:`CheckAnnotation`
after ``LoadAnnotations``: an annotation whose size differs from its image's, or whose label values are outside the
classes, is a :class:`~kpca.training.data_checks.problems.DataError` naming the files and the values as they are on
disk, in training and in evaluation alike. :func:`pair_problems` is the per-pair check of ``segmentation check-data``:
both files decode to the end, sizes equal, label values in range.

Label values on disk (ADE20K, ``reduce_zero_label``): 0 is "other" (ignored), 1..K the K classes, 255 ignored.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from mmcv.transforms import LoadImageFromFile
from mmseg.datasets.transforms import LoadAnnotations
from PIL import Image

from kpca.training.data_checks.bad_files import EVALUATION_FIX, TRAINING_FIX, describe_error
from kpca.training.data_checks.problems import DataError, DataProblem
from kpca.training.images.decoding import strict_image_decoding

IGNORED_ON_DISK = 255
"""A label value on disk that is ignored whatever the classes (mmseg's ignore index)."""
LABEL_MAP_MODES = ("L", "P")
"""PIL modes of single-channel 8-bit label maps (grey levels or palette indices)."""


def _fix(split: str) -> str:
    return TRAINING_FIX if split == "train" else EVALUATION_FIX


def _label_range(num_classes: int, reduce_zero_label: bool) -> str:
    if reduce_zero_label:
        return f"0 (other, ignored), 1..{num_classes} (the classes) and {IGNORED_ON_DISK} (ignored)"
    return f"0..{num_classes - 1} (the classes) and {IGNORED_ON_DISK} (ignored)"


def values_out_of_range(labels: np.ndarray, limit: int) -> list[int]:
    """The distinct values of ``labels`` at or above ``limit``, other than the ignored 255, sorted."""
    return np.unique(labels[(labels >= limit) & (labels != IGNORED_ON_DISK)]).astype(int).tolist()


def out_of_range_problem(
    annotation: str, split: str, values: list[int], num_classes: int, reduce_zero_label: bool
) -> DataProblem:
    """The problem of an annotation holding the label ``values`` (as on disk) outside the classes."""
    return DataProblem(
        annotation,
        split,
        f"holds label values {values} (as on disk) outside the valid {_label_range(num_classes, reduce_zero_label)}",
        "Re-export it as a single-channel label map of class indices (not palette colours), or fix those pixels; "
        "the app's check-data subcommand lists every such file.",
    )


def size_mismatch_problem(
    annotation: str, image: str, split: str, annotation_hw: tuple, image_hw: tuple
) -> DataProblem:
    """The problem of an annotation whose (H, W) differs from its image's."""
    return DataProblem(
        annotation,
        split,
        f"is {annotation_hw[1]}x{annotation_hw[0]} (WxH) but its image {image} is {image_hw[1]}x{image_hw[0]}: "
        "labels would be compared with pixels they do not belong to",
        "Re-export the annotation at its image's size (or pair it with the right image); the app's check-data "
        "subcommand lists every such pair.",
    )


class NamedLoad:
    """An mmseg loading step whose failure is a DataError naming the file it was reading.

    Args:
        step: ``LoadImageFromFile`` or ``LoadAnnotations``.
        path_key: the results key of the file it reads (``img_path``, ``seg_map_path``).
        what: ``image`` or ``annotation``, for the message.
        split: the split named in the error.
    """

    def __init__(self, step: Any, path_key: str, what: str, split: str) -> None:
        self.step, self.path_key, self.what, self.split = step, path_key, what, split

    def __call__(self, results: dict) -> dict:
        try:
            return self.step(results)
        except Exception as error:
            path = os.path.abspath(results[self.path_key])
            problem = DataProblem(path, self.split, f"{self.what} {describe_error(error)}", _fix(self.split))
            raise DataError(problem) from error

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.step!r})"


class CheckAnnotation:
    """mmseg pipeline step after ``LoadAnnotations``: the label map has its image's size and values in range.

    Sizes are compared with ``ori_shape``, the image as loaded (an evaluation pipeline resizes the image before it
    loads the annotation). Values are reported as on disk: with ``reduce_zero_label`` a loaded value v is v + 1 on
    disk.

    Args:
        num_classes: K, the number of classes.
        split: the split named in errors.
    """

    def __init__(self, num_classes: int, split: str) -> None:
        self.num_classes, self.split = num_classes, split

    def __call__(self, results: dict) -> dict:
        labels = results["gt_seg_map"]  # (H0, W0) uint8, after reduce_zero_label
        annotation = os.path.abspath(results["seg_map_path"])
        image_hw = tuple(results["ori_shape"])
        if labels.shape != image_hw:
            image = os.path.abspath(results["img_path"])
            raise DataError(size_mismatch_problem(annotation, image, self.split, labels.shape, image_hw))
        reduced = bool(results.get("reduce_zero_label", False))
        values = [v + int(reduced) for v in values_out_of_range(labels, self.num_classes)]
        if values:
            raise DataError(out_of_range_problem(annotation, self.split, values, self.num_classes, reduced))
        return results

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_classes={self.num_classes})"


def guard_pipeline(steps: list, split: str, num_classes: int) -> list:
    """``steps`` with loaders that name their file on failure and :class:`CheckAnnotation` after ``LoadAnnotations``."""
    guarded = []
    for step in steps:
        if isinstance(step, LoadImageFromFile):
            guarded.append(NamedLoad(step, "img_path", "image", split))
        elif isinstance(step, LoadAnnotations):
            guarded += [NamedLoad(step, "seg_map_path", "annotation", split), CheckAnnotation(num_classes, split)]
        else:
            guarded.append(step)
    return guarded


def _image_size(path: str, split: str) -> tuple[tuple[int, int] | None, list[DataProblem]]:
    """The (H, W) of the image at ``path`` decoded to its last pixel, or None and the problem saying why not."""
    try:
        with strict_image_decoding(), Image.open(path) as image:
            image.load()
            return (image.height, image.width), []
    except Exception as error:
        return None, [DataProblem(path, split, f"image {describe_error(error)}", _fix(split))]


def _label_map(path: str, split: str) -> tuple[np.ndarray | None, list[DataProblem]]:
    """The (H, W) label values of the annotation at ``path`` as on disk, or None and the problem saying why not."""
    try:
        with strict_image_decoding(), Image.open(path) as annotation:
            annotation.load()
            mode = annotation.mode
            labels = np.asarray(annotation) if mode in LABEL_MAP_MODES else None  # (H, W) uint8
    except Exception as error:
        return None, [DataProblem(path, split, f"annotation {describe_error(error)}", _fix(split))]
    if labels is None:
        problem = f"is a mode {mode} image; a label map is single-channel 8-bit (mode L or P)"
        fix = "Re-export it as a single-channel label map of class indices (not a colour visualisation)."
        return None, [DataProblem(path, split, problem, fix)]
    return labels, []


def pair_problems(item: tuple[str, str, str, int]) -> list[DataProblem]:
    """The problems of one ``(image, annotation, split, num_classes)`` pair of ADE20K (``reduce_zero_label``).

    Both files decode to their last pixel, the annotation is a single-channel label map of its image's size, and
    its values on disk are 0, 1..K or 255.
    """
    image_path, annotation_path, split, num_classes = item
    image_hw, problems = _image_size(image_path, split)
    if not os.path.isfile(annotation_path):
        fix = "Add its label map, or remove the image from the split."
        return [*problems, DataProblem(annotation_path, split, f"is missing (the annotation of {image_path})", fix)]
    labels, wrong = _label_map(annotation_path, split)
    if labels is None:
        return problems + wrong
    if image_hw is not None and labels.shape != image_hw:
        problems.append(size_mismatch_problem(annotation_path, image_path, split, labels.shape, image_hw))
    values = values_out_of_range(labels, num_classes + 1)
    if values:
        problems.append(out_of_range_problem(annotation_path, split, values, num_classes, True))
    return problems


def split_problems(images: Path, annotations: Path, split: str, layout: str) -> list[DataProblem]:
    """Layout problems of one split: its image and annotation folders exist and hold files (cheap: first file)."""
    problems = []
    for folder, suffix in ((images, ".jpg"), (annotations, ".png")):
        if not folder.is_dir():
            fix = f"data.root must hold the ADE20K layout {layout}."
            problems.append(DataProblem(str(folder.absolute()), split, "is not a directory", fix))
        elif not any(folder.rglob(f"*{suffix}")):
            fix = f"Put the split's files in it; expected the ADE20K layout {layout}."
            problems.append(DataProblem(str(folder.absolute()), split, f"holds no {suffix} file", fix))
    return problems
