"""timm's RandAugment with its slow ops' pixels computed by compiled kernels (:mod:`.pil_kernels`).

In DeiT's recipe most of RandAugment's time per image goes to a few ops whose pixels Pillow computes in slow
per-pixel loops: rotations, shears and translations (3-4 ms each on a 224 x 224 image), sharpness (about 2 ms) and
the other ``ImageEnhance`` ops (contrast, colour, brightness: 0.6-0.9 ms). :func:`with_compiled_ops` keeps timm's
RandAugment object, its op choice, its magnitudes and every random draw, and swaps only the functions that compute
those pixels for ones that give Pillow's result bit for bit, 1.5-4x faster. Anything the kernels do not cover goes
to timm's own function: a resampling filter other than bicubic, a non-RGB image, a rotation by a multiple of 90
degrees (which Pillow does by transposing).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageStat
from timm.data import auto_augment as timm_ops
from timm.data.auto_augment import RandAugment

from kpca.vision_cls.input.policy import AFFINE
from kpca.vision_cls.input.workers.pil_kernels import Matrix, affine_bicubic, blend, rotation_matrix, smooth


def _rotate(degrees: float, width: int, height: int) -> Matrix | None:
    """``Image.rotate``'s matrix, or None where Pillow transposes instead (multiples of 90 degrees but 0)."""
    if degrees % 360.0 in (90.0, 180.0, 270.0):
        return None
    return rotation_matrix(width, height, degrees)


class CompiledGeometricOp:
    """A timm geometric op (same signature and random draws) whose bicubic RGB case runs :func:`affine_bicubic`.

    Args:
        timm_op: timm's function, e.g. ``timm.data.auto_augment.shear_x``; called for every other case.
        matrix: The affine coefficients timm's function hands to Pillow, from the op's argument and the image's
            width and height (:data:`kpca.vision_cls.input.policy.AFFINE`); None leaves the image to ``timm_op``.
    """

    def __init__(self, timm_op: Callable, matrix: Callable[[float, int, int], Matrix | None]) -> None:
        self.timm_op = timm_op
        self.matrix = matrix

    def __call__(self, image: Image.Image, level: float, **kwargs) -> Image.Image:
        """Transform ``image`` as ``timm_op(image, level, **kwargs)`` does, pixel for pixel."""
        resample = kwargs.pop("resample", Image.BICUBIC)  # timm's default
        if isinstance(resample, (list, tuple)):  # timm's _interpolation: one draw from Python's random
            resample = random.choice(resample)
        fill = kwargs.get("fillcolor")
        matrix = self.matrix(level, *image.size)
        if resample != Image.BICUBIC or image.mode != "RGB" or not _is_rgb(fill) or matrix is None:
            return self.timm_op(image, level, resample=resample, **kwargs)
        return Image.fromarray(affine_bicubic(np.asarray(image), matrix, fill))

    def __repr__(self) -> str:
        """Name timm's op."""
        return f"{type(self).__name__}({self.timm_op.__name__})"


def _is_rgb(fill: object) -> bool:
    """Whether ``fill`` is an (r, g, b) colour."""
    return isinstance(fill, (tuple, list)) and len(fill) == 3


def _sharpness_degenerate(image: Image.Image, pixels: np.ndarray) -> np.ndarray:
    """``ImageEnhance.Sharpness``'s degenerate image: the SMOOTH filter."""
    return smooth(pixels)


def _color_degenerate(image: Image.Image, pixels: np.ndarray) -> np.ndarray:
    """``ImageEnhance.Color``'s degenerate image: grey ("L") back to RGB."""
    return np.asarray(image.convert("L").convert("RGB"))


def _contrast_degenerate(image: Image.Image, pixels: np.ndarray) -> np.ndarray:
    """``ImageEnhance.Contrast``'s degenerate image: the mean grey level, rounded, everywhere."""
    mean = int(ImageStat.Stat(image.convert("L")).mean[0] + 0.5)
    return np.full_like(pixels, mean)


def _brightness_degenerate(image: Image.Image, pixels: np.ndarray) -> np.ndarray:
    """``ImageEnhance.Brightness``'s degenerate image: black."""
    return np.zeros_like(pixels)


class CompiledEnhanceOp:
    """A timm ``ImageEnhance`` op (``enhance(factor)`` = blend of a degenerate image) run by :func:`blend`.

    Args:
        timm_op: timm's function, e.g. ``timm.data.auto_augment.sharpness``; called for non-RGB images.
        degenerate: The enhancer's degenerate image, from the PIL image and its (H, W, 3) uint8 pixels.
    """

    def __init__(self, timm_op: Callable, degenerate: Callable[[Image.Image, np.ndarray], np.ndarray]) -> None:
        self.timm_op = timm_op
        self.degenerate = degenerate

    def __call__(self, image: Image.Image, factor: float, **kwargs) -> Image.Image:
        """Enhance ``image`` as ``timm_op(image, factor)`` does, pixel for pixel."""
        if image.mode != "RGB":
            return self.timm_op(image, factor, **kwargs)
        pixels = np.asarray(image)  # (H, W, 3)
        return Image.fromarray(blend(self.degenerate(image, pixels), pixels, factor))

    def __repr__(self) -> str:
        """Name timm's op."""
        return f"{type(self).__name__}({self.timm_op.__name__})"


_DEGENERATE = {
    "Sharpness": _sharpness_degenerate,
    "Color": _color_degenerate,
    "Contrast": _contrast_degenerate,
    "Brightness": _brightness_degenerate,
}
COMPILED_OPS: dict[str, CompiledGeometricOp | CompiledEnhanceOp] = {
    "Rotate": CompiledGeometricOp(timm_ops.rotate, _rotate),
    **{name: CompiledGeometricOp(timm_ops.NAME_TO_OP[name], matrix) for name, matrix in AFFINE.items()},
    **{
        name + increasing: CompiledEnhanceOp(timm_ops.NAME_TO_OP[name], degenerate)
        for name, degenerate in _DEGENERATE.items()
        for increasing in ("", "Increasing")
    },
}
"""The compiled op of each timm op name whose pixels Pillow computes slowly."""


def with_compiled_ops(augment: RandAugment) -> RandAugment:
    """A copy of timm's ``augment`` whose slow ops compute their pixels with the kernels of ``pil_kernels``.

    The copy draws the same random numbers in the same order and returns the same images; ``augment`` is unchanged.
    """
    ops = []
    for op in augment.ops:
        if op.name in COMPILED_OPS:
            op = copy.copy(op)
            op.aug_fn = COMPILED_OPS[op.name]
        ops.append(op)
    compiled = copy.copy(augment)
    compiled.ops = ops
    return compiled
