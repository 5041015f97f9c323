"""Pillow's slow per-pixel loops for RGB images, compiled with numba: bit-identical pixels, 1.5-4x faster.

These are the loops behind timm's RandAugment ops, in the same floating-point arithmetic and order as Pillow's C
(``src/libImaging/Geometry.c``, ``Filter.c`` and ``Blend.c``), checked bit for bit against the installed Pillow:

* :func:`affine_bicubic`: ``Image.transform(size, Image.AFFINE, matrix, resample=BICUBIC, fillcolor=fill)``, which
  ``rotate``, ``shear_*`` and ``translate_*`` call. The source point of output pixel (x, y) is
  ``(a0 (x + .5) + a1 (y + .5) + a2, a3 (x + .5) + a4 (y + .5) + a5)`` in doubles; points outside the image take the
  fill colour; otherwise a 4 x 4 cubic convolution (Pillow's a = -1 kernel, edge pixels repeated) is clipped to
  [0, 255] and truncated. Where a fraction is exactly 0 (vertically for a shear or translation along x,
  horizontally for one along y) Pillow's cubic returns its second sample exactly, so the kernel skips the other three
  rows or columns: shears and translations run about 3x faster than in Pillow, rotations about 1.5x.
* :func:`smooth`: ``Image.filter(ImageFilter.SMOOTH)`` (:data:`kpca.vision_cls.input.policy.SMOOTH` in floats,
  rounded; border pixels copied), the degenerate image of ``ImageEnhance.Sharpness``.
* :func:`blend`: ``Image.blend(degenerate, image, alpha)``, the last step of every ``ImageEnhance`` class, in float32
  (truncated; clipped when extrapolating).

Legend: H x W image, 3 channels (RGB), pixels flattened row by row (N = H * W * 3 values).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numba
import numpy as np

from kpca.training.errors import OptionError
from kpca.vision_cls.input.policy import SMOOTH_CENTRE, SMOOTH_SIDE, cubic

Matrix = tuple[float, float, float, float, float, float]  # Pillow's affine coefficients a0..a5


FLOAT32 = numba.float32


# Pillow's BICUBIC macro and SMOOTH kernel come from the policy module. numba's cache checks the time stamp of this
# file only, so an edit there recompiles nothing until this file changes too (or the cache is cleared).
_cubic = numba.njit(cache=True, nogil=True, inline="always")(cubic)


@numba.njit(cache=True, nogil=True, inline="always")
def _taps(source, first, second, third, fourth, d):  # pragma: no cover - compiled
    """The cubic through the samples at four offsets of ``source``; unsigned offsets skip negative-index handling."""
    return _cubic(
        source[numba.uint64(first)],
        source[numba.uint64(second)],
        source[numba.uint64(third)],
        source[numba.uint64(fourth)],
        d,
    )


@numba.njit(cache=True, nogil=True)
def _affine_bicubic(source, height, width, matrix, fill, out):  # pragma: no cover - compiled
    """Fill ``out`` (H * W * 3,) uint8 with Pillow's bicubic affine transform of ``source`` (H * W * 3,) float64.

    Samples outside the image repeat the edge pixel (Pillow's XCLIP and its repeat of the previous row). The source
    holds the uint8 values as float64, which Pillow's integer-then-double arithmetic gives exactly.
    """
    a0, a1, a2, a3, a4, a5 = matrix[0], matrix[1], matrix[2], matrix[3], matrix[4], matrix[5]
    stride = width * 3
    for y in range(height):
        for x in range(width):
            at = y * stride + x * 3
            xin = a0 * (x + 0.5) + a1 * (y + 0.5) + a2
            yin = a3 * (x + 0.5) + a4 * (y + 0.5) + a5
            if xin < 0.0 or xin >= width or yin < 0.0 or yin >= height:
                for channel in range(3):
                    out[numba.uint64(at + channel)] = fill[channel]
                continue
            xin -= 0.5
            yin -= 0.5
            xi = math.floor(xin)
            yi = math.floor(yin)
            dx = xin - xi
            dy = yin - yi
            c0, c1 = max(xi - 1, 0) * 3, max(xi, 0) * 3  # column offsets of the 4 samples
            c2, c3 = min(xi + 1, width - 1) * 3, min(xi + 2, width - 1) * 3
            r0, r1 = max(yi - 1, 0) * stride, max(yi, 0) * stride  # row offsets of the 4 samples
            r2, r3 = min(yi + 1, height - 1) * stride, min(yi + 2, height - 1) * stride
            for channel in range(3):
                if dy == 0.0:  # the vertical cubic returns row yi exactly
                    row = r1 + channel
                    value = _taps(source, row + c0, row + c1, row + c2, row + c3, dx)
                elif dx == 0.0:  # every horizontal cubic returns column xi exactly
                    column = c1 + channel
                    value = _taps(source, r0 + column, r1 + column, r2 + column, r3 + column, dy)
                else:
                    v1 = _taps(source, r0 + channel + c0, r0 + channel + c1, r0 + channel + c2, r0 + channel + c3, dx)
                    v2 = _taps(source, r1 + channel + c0, r1 + channel + c1, r1 + channel + c2, r1 + channel + c3, dx)
                    v3 = _taps(source, r2 + channel + c0, r2 + channel + c1, r2 + channel + c2, r2 + channel + c3, dx)
                    v4 = _taps(source, r3 + channel + c0, r3 + channel + c1, r3 + channel + c2, r3 + channel + c3, dx)
                    value = _cubic(v1, v2, v3, v4, dy)
                out[numba.uint64(at + channel)] = 0 if value <= 0.0 else (255 if value >= 255.0 else int(value))


def affine_bicubic(image: np.ndarray, matrix: Sequence[float], fill: Sequence[int]) -> np.ndarray:
    """``Image.transform(size, Image.AFFINE, matrix, resample=BICUBIC, fillcolor=fill)`` on RGB pixels.

    Args:
        image: (H, W, 3) uint8 RGB pixels.
        matrix: Pillow's affine coefficients ``(a0, a1, a2, a3, a4, a5)``: output pixel centre -> source point.
        fill: The (r, g, b) colour of output pixels whose source point lies outside the image.

    Returns:
        (H, W, 3) uint8, bit-identical to Pillow's result. The first call in a process compiles the kernel, or
        loads it from numba's cache (``__pycache__`` beside this file, else ``NUMBA_CACHE_DIR``).
    """
    _check_rgb(image, "affine_bicubic")
    if len(fill) != 3 or len(matrix) != 6:
        raise OptionError(f"affine_bicubic needs 6 coefficients and an (r, g, b) fill; got {matrix} and {fill}.")
    height, width, _ = image.shape
    source = image.reshape(-1).astype(np.float64)  # (H * W * 3,)
    out = np.empty(source.shape, dtype=np.uint8)  # (H * W * 3,)
    _affine_bicubic(source, height, width, np.asarray(matrix, dtype=np.float64), np.asarray(fill, dtype=np.uint8), out)
    return out.reshape(height, width, 3)


def rotation_matrix(width: int, height: int, degrees: float) -> Matrix:
    """The coefficients ``Image.rotate(degrees)`` hands to ``Image.transform``: about the centre, no expand.

    Pillow transposes instead for multiples of 90 degrees; callers leave those angles to Pillow.
    """
    angle = -math.radians(degrees % 360.0)
    a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
    d, e = round(-math.sin(angle), 15), round(math.cos(angle), 15)
    center_x, center_y = width / 2, height / 2
    c = a * -center_x + b * -center_y + 0.0 + center_x  # Pillow's order of operations, for identical doubles
    f = d * -center_x + e * -center_y + 0.0 + center_y
    return a, b, c, d, e, f


@numba.njit(cache=True, nogil=True)
def _smooth(source, height, width, out):  # pragma: no cover - compiled
    """Pillow's ``ImagingFilter3x3`` with the SMOOTH kernel on flat RGB ``source`` -> ``out`` (N,) uint8."""
    side, middle = FLOAT32(SMOOTH_SIDE), FLOAT32(SMOOTH_CENTRE)  # Pillow's kernel over its scale, in float
    stride = width * 3
    out[:] = source  # border rows and columns are copied; images under 3 x 3 are copied whole
    for y in range(1, height - 1):
        for at in range(y * stride + 3, (y + 1) * stride - 3):
            up, down = at - stride, at + stride
            total = FLOAT32(0.5)  # Pillow's offset 0 plus 0.5 for rounding; rows summed below, centre, above
            total += (
                FLOAT32(source[numba.uint64(down - 3)]) * side
                + FLOAT32(source[numba.uint64(down)]) * side
                + FLOAT32(source[numba.uint64(down + 3)]) * side
            )
            total += (
                FLOAT32(source[numba.uint64(at - 3)]) * side
                + FLOAT32(source[numba.uint64(at)]) * middle
                + FLOAT32(source[numba.uint64(at + 3)]) * side
            )
            total += (
                FLOAT32(source[numba.uint64(up - 3)]) * side
                + FLOAT32(source[numba.uint64(up)]) * side
                + FLOAT32(source[numba.uint64(up + 3)]) * side
            )
            total = FLOAT32(0.0) if total < FLOAT32(0.0) else total
            total = FLOAT32(255.0) if total > FLOAT32(255.0) else total
            out[numba.uint64(at)] = numba.uint8(total)


@numba.njit(cache=True, nogil=True)
def _blend(degenerate, image, alpha, out):  # pragma: no cover - compiled
    """Pillow's ``ImagingBlend``: ``degenerate + alpha * (image - degenerate)`` per value in float32, truncated."""
    factor = FLOAT32(alpha)  # Pillow takes alpha as a C float
    clip = not (factor >= 0 and factor <= 1.0)  # extrapolation can leave [0, 255]
    for at in range(out.size):
        low = numba.int32(degenerate[numba.uint64(at)])
        value = FLOAT32(low) + factor * FLOAT32(numba.int32(image[numba.uint64(at)]) - low)
        if clip:
            value = FLOAT32(0.0) if value <= FLOAT32(0.0) else (FLOAT32(255.0) if value >= FLOAT32(255.0) else value)
        out[numba.uint64(at)] = numba.uint8(value)


def _check_rgb(image: np.ndarray, function: str) -> None:
    """ValueError unless ``image`` is (H, W, 3) uint8."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise OptionError(f"{function} needs (H, W, 3) uint8 RGB pixels; got {image.dtype} {image.shape}.")


def smooth(image: np.ndarray) -> np.ndarray:
    """``Image.filter(ImageFilter.SMOOTH)`` on (H, W, 3) uint8 RGB pixels, bit-identical: (H, W, 3) uint8."""
    _check_rgb(image, "smooth")
    height, width, _ = image.shape
    source = np.ascontiguousarray(image).reshape(-1)  # (N,)
    out = np.empty_like(source)  # (N,)
    _smooth(source, height, width, out)
    return out.reshape(image.shape)


def blend(degenerate: np.ndarray, image: np.ndarray, alpha: float) -> np.ndarray:
    """``Image.blend(degenerate, image, alpha)`` on two (H, W, 3) uint8 RGB arrays, bit-identical: (H, W, 3) uint8."""
    _check_rgb(image, "blend")
    if degenerate.shape != image.shape or degenerate.dtype != np.uint8:
        raise OptionError(
            f"blend needs two arrays of one shape; got {degenerate.dtype} {degenerate.shape} and {image.shape}."
        )
    out = np.empty(image.size, dtype=np.uint8)  # (N,)
    _blend(np.ascontiguousarray(degenerate).reshape(-1), np.ascontiguousarray(image).reshape(-1), alpha, out)
    return out.reshape(image.shape)
