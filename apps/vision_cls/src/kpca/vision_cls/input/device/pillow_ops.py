"""Pillow's pixels of timm's RandAugment ops, on uint8 batches on any device, each image with its own argument.

What :class:`kpca.vision_cls.input.device.rand_augment.BatchRandAugment` runs. Pixels follow Pillow 11 (what timm's
ops call) in Pillow's own arithmetic, with Pillow's constants from :mod:`kpca.vision_cls.input.policy`:

* Integer ops, bit-exact: Invert, Posterize, Solarize, SolarizeAdd (timm's LUT), AutoContrast (Pillow's float64
  LUT from each channel's min and max, truncated), Equalize (Pillow's integer LUT from each channel's histogram).
* ``ImageEnhance`` ops, bit-exact: ``Image.blend(degenerate, image, factor)`` in float32, truncated and clipped.
  Color's degenerate is Pillow's integer grey (``policy.LUMA_WEIGHTS``); Contrast's the mean of that grey rounded
  as ``ImageStat`` does; Brightness's black; Sharpness's the SMOOTH filter (``policy.SMOOTH``, summed in float32 in
  Pillow's order, rounded, border copied).
* Geometric ops (Rotate about the centre as ``Image.rotate``, ShearX/Y, TranslateX/Y(Rel), ``policy.AFFINE``):
  Pillow's affine inverse mapping, output pixel centre -> source point in float64; a source point outside the image
  takes the fill colour; bilinear and bicubic (``policy.linear``, ``policy.cubic``) with repeated edges, in float64,
  clipped and truncated; nearest as Pillow's generic path. Bicubic and bilinear match Pillow bit for bit but for
  one-ulp differences of ``cos``/``sin`` between libm and torch's device (absorbed by Pillow's rounding of the
  rotation to 15 decimals almost always). Pillow's nearest affine has fixed-point and incremental fast paths that this
  float formula only approximates.

Hand-written, not library: torchvision's v2 geometric ops take one angle per call and resample through
``grid_sample``, and so would kornia's ``warp_affine``; ``grid_sample``'s bicubic is the a = -0.75 kernel (Pillow's
is a = -1), it pads taps rather than testing the source point (Pillow's fill rule), and returns rounded floats
(Pillow truncates): several grey levels off at edges. The gather sampler here has Pillow's kernel, edge rule, fill
rule and truncation with per-image matrices and costs no extra dependency. torchvision's colour ops
(``adjust_contrast`` and friends) compute in float and round, and its grey is float ``0.2989 R + 0.587 G + 0.114 B``,
not Pillow's integer luma, so they too are one grey level off on many pixels; the pixel ops here are a few lines each.

Legend: N images, C channels (3), H x W image.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from torch import Tensor

from kpca.vision_cls.input.policy import AFFINE, LUMA_ROUND, LUMA_SHIFT, LUMA_WEIGHTS, SMOOTH, cubic, linear

PixelOp = Callable[[Tensor, Tensor], Tensor]  # (N, C, H, W) uint8, (N,) float64 argument -> (N, C, H, W) uint8
MatrixOp = Callable[[Tensor, int, int], Tensor]  # (N,) float64 argument, H, W -> (N, 6) float64 Pillow coefficients


def _true_divide(numerator: Tensor, denominator: float) -> Tensor:
    """``numerator / denominator`` rounded once, as Python divides (on CUDA ``tensor / scalar`` rounds twice)."""
    return numerator.div(torch.full_like(numerator, denominator))


# ---- pixel ops on (N, C, H, W) uint8 -----------------------------------------------------------------------------


def _per_image(values: Tensor) -> Tensor:
    """(N,) -> (N, 1, 1, 1), to broadcast one value per image."""
    return values.view(-1, 1, 1, 1)


def invert(images: Tensor, arg: Tensor | None = None) -> Tensor:
    """``ImageOps.invert``: ``255 - x``."""
    return 255 - images


def posterize(images: Tensor, bits: Tensor) -> Tensor:
    """``ImageOps.posterize`` per image: keep the top ``bits`` (N,) bits (8 or more: unchanged, 0 or less: black)."""
    shift = _per_image((8 - bits).clamp(0, 8).int())  # (N, 1, 1, 1)
    return ((images.int() >> shift) << shift).to(torch.uint8)


def solarize(images: Tensor, threshold: Tensor) -> Tensor:
    """``ImageOps.solarize`` per image: values at or above ``threshold`` (N,) are inverted."""
    return torch.where(images < _per_image(threshold), images, 255 - images)


def solarize_add(images: Tensor, add: Tensor, threshold: int = 128) -> Tensor:
    """As timm's ``solarize_add`` per image: ``min(255, x + add)`` for values below ``threshold``, others unchanged."""
    added = (images.int() + _per_image(add).int()).clamp(max=255).to(torch.uint8)  # (N, C, H, W)
    return torch.where(images < threshold, added, images)


def _apply_lut(images: Tensor, lut: Tensor) -> Tensor:
    """Map each channel of each image through its own table: (N, C, H, W) uint8, (N, C, 256) -> (N, C, H, W) uint8."""
    n, c, h, w = images.shape
    flat = images.reshape(n, c, h * w).long()  # (N, C, H * W)
    return lut.to(torch.uint8).gather(2, flat).view(n, c, h, w)


def auto_contrast(images: Tensor, arg: Tensor | None = None) -> Tensor:
    """``ImageOps.autocontrast`` (no cutoff): per channel, ``int(x * 255 / (hi - lo) - lo * scale)``, clipped."""
    low = images.amin(dim=(2, 3)).double()  # (N, C)
    high = images.amax(dim=(2, 3)).double()  # (N, C)
    stretch = high > low  # (N, C)
    scale = torch.full_like(low, 255.0).div(torch.where(stretch, high - low, 1.0))  # (N, C)
    offset = -low * scale  # (N, C)
    levels = torch.arange(256, dtype=torch.float64, device=images.device)  # (256,)
    lut = (levels * scale[..., None] + offset[..., None]).trunc().clamp(0, 255)  # (N, C, 256)
    return _apply_lut(images, torch.where(stretch[..., None], lut, levels))


def _histograms(images: Tensor) -> Tensor:
    """Per-channel histograms: (N, C, H, W) uint8 -> (N, C, 256) int64."""
    n, c = images.shape[:2]
    offsets = torch.arange(n * c, device=images.device).view(n, c, 1) * 256  # (N, C, 1)
    bins = images.reshape(n, c, -1).long() + offsets  # (N, C, H * W)
    return torch.bincount(bins.reshape(-1), minlength=n * c * 256).view(n, c, 256)


def equalize(images: Tensor, arg: Tensor | None = None) -> Tensor:
    """``ImageOps.equalize``: Pillow's integer LUT ``(step // 2 + count below i) // step`` per channel.

    ``step = (pixels - count of the highest level present) // 255``; a channel with step 0 (one level, or almost
    all pixels at the highest) is unchanged. Pillow's ``point`` clips the table to 255.
    """
    histogram = _histograms(images)  # (N, C, 256)
    high = images.amax(dim=(2, 3)).long()  # (N, C)
    total = images.shape[2] * images.shape[3]
    step = (total - histogram.gather(2, high[..., None]).squeeze(2)) // 255  # (N, C)
    below = histogram.cumsum(2) - histogram  # (N, C, 256): pixels under each level
    lut = ((step[..., None] // 2 + below) // step.clamp(min=1)[..., None]).clamp(max=255)  # (N, C, 256)
    levels = torch.arange(256, device=images.device)  # (256,)
    return _apply_lut(images, torch.where(step[..., None] > 0, lut, levels))


def _blend(degenerate: Tensor, images: Tensor, factor: Tensor) -> Tensor:
    """``Image.blend(degenerate, images, factor)`` per image: float32 ``d + f * (x - d)``, clipped, truncated.

    Args:
        degenerate: (N, C, H, W) or broadcastable uint8/integer image at factor 0.
        images: (N, C, H, W) uint8 image at factor 1.
        factor: (N,) float64; Pillow takes it as a C float.
    """
    low = degenerate.float()
    alpha = _per_image(factor.float())  # (N, 1, 1, 1)
    value = low + alpha * (images.float() - low)  # (N, C, H, W), Pillow's float32 arithmetic, no fused multiply-add
    return value.clamp(0, 255).to(torch.uint8)


def _luma(images: Tensor) -> Tensor:
    """Pillow's ``convert("L")``: (N, C, H, W) uint8 -> (N, 1, H, W) int32."""
    weights = torch.tensor(LUMA_WEIGHTS, dtype=torch.int32, device=images.device).view(1, 3, 1, 1)
    return ((images.int() * weights).sum(dim=1, keepdim=True) + LUMA_ROUND) >> LUMA_SHIFT


def color(images: Tensor, factor: Tensor) -> Tensor:
    """``ImageEnhance.Color(image).enhance(factor)`` per image: blend with the grey image."""
    return _blend(_luma(images), images, factor)


def contrast(images: Tensor, factor: Tensor) -> Tensor:
    """``ImageEnhance.Contrast(image).enhance(factor)`` per image: blend with the mean grey, ``int(mean + 0.5)``."""
    luma = _luma(images)  # (N, 1, H, W)
    total = luma.sum(dim=(1, 2, 3)).double()  # (N,)
    mean = _true_divide(total, float(luma[0].numel()))  # (N,), ImageStat's sum / count in float64
    return _blend(_per_image((mean + 0.5).floor().int()), images, factor)


def brightness(images: Tensor, factor: Tensor) -> Tensor:
    """``ImageEnhance.Brightness(image).enhance(factor)`` per image: blend with black."""
    return _blend(torch.zeros((), dtype=torch.uint8, device=images.device), images, factor)


def _smooth_row(rows: Tensor, weights: np.ndarray) -> Tensor:
    """One row of the 3 x 3 SMOOTH kernel in Pillow's float32 order: (N, C, h, W) -> (N, C, h, W - 2)."""
    left, middle, right = (float(weight) for weight in weights)
    return rows[..., :-2] * left + rows[..., 1:-1] * middle + rows[..., 2:] * right


def smooth(images: Tensor) -> Tensor:
    """``Image.filter(ImageFilter.SMOOTH)``: (N, C, H, W) uint8 -> (N, C, H, W) uint8, border pixels copied.

    Pillow sums 0.5 + the row below + the row itself + the row above, each left to right, in float32, then clips
    and truncates.
    """
    if images.shape[2] < 3 or images.shape[3] < 3:
        return images.clone()
    source = images.float()  # (N, C, H, W)
    total = _smooth_row(source[:, :, 2:], SMOOTH[2]) + 0.5  # (N, C, H - 2, W - 2)
    total = total + _smooth_row(source[:, :, 1:-1], SMOOTH[1])
    total = total + _smooth_row(source[:, :, :-2], SMOOTH[0])
    out = images.clone()
    out[:, :, 1:-1, 1:-1] = total.clamp(0, 255).to(torch.uint8)
    return out


def sharpness(images: Tensor, factor: Tensor) -> Tensor:
    """``ImageEnhance.Sharpness(image).enhance(factor)`` per image: blend with the smoothed image."""
    return _blend(smooth(images), images, factor)


# ---- geometric ops: Pillow's AFFINE transform with per-image matrices -------------------------------------------


def rotate_matrix(degrees: Tensor, height: int, width: int) -> Tensor:
    """The coefficients ``Image.rotate(degrees)`` hands to ``Image.transform``: (N,) -> (N, 6) float64.

    As Pillow: angle modulo 360, ``-radians``, cos and sin rounded to 15 decimals, about the centre ``(W/2, H/2)``.
    """
    angle = -(degrees.remainder(360.0) * (math.pi / 180.0))  # (N,), math.radians' constant
    cos, sin = angle.cos().round(decimals=15), angle.sin().round(decimals=15)  # (N,)
    centre_x, centre_y = width / 2, height / 2
    c = cos * -centre_x + sin * -centre_y + 0.0 + centre_x  # Pillow's order of operations
    f = -sin * -centre_x + cos * -centre_y + 0.0 + centre_y
    return torch.stack([cos, sin, c, -sin, cos, f], dim=1)


def affine_matrix(name: str, argument: Tensor, height: int, width: int) -> Tensor:
    """The coefficients timm's shear or translate op ``name`` hands to Pillow (``policy.AFFINE``): (N,) -> (N, 6)."""
    coefficients = AFFINE[name](argument, width, height)  # six floats or (N,) float64
    columns = [c if isinstance(c, Tensor) else torch.full_like(argument, c) for c in coefficients]  # 6 x (N,)
    return torch.stack(columns, dim=1)  # (N, 6)


def _source_points(matrix: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
    """Pillow's ``affine_transform``: the source point of each output pixel centre, two (N, H, W) float64."""
    xs = torch.arange(width, dtype=torch.float64, device=matrix.device) + 0.5  # (W,)
    ys = (torch.arange(height, dtype=torch.float64, device=matrix.device) + 0.5)[:, None]  # (H, 1)
    a = matrix[:, :, None, None]  # (N, 6, 1, 1)
    x_in = a[:, 0] * xs + a[:, 1] * ys + a[:, 2]  # (N, H, W)
    y_in = a[:, 3] * xs + a[:, 4] * ys + a[:, 5]  # (N, H, W)
    return x_in, y_in


def _gather(flat: Tensor, rows: Tensor, columns: Tensor, width: int) -> Tensor:
    """Pixels at (rows, columns), indices already clamped: (N, C, H * W) uint8, (N, H, W) -> (N, C, H, W) uint8."""
    n, c = flat.shape[:2]
    index = (rows * width + columns).view(n, 1, -1).expand(n, c, -1)  # (N, C, H * W)
    return flat.gather(2, index).view(n, c, *rows.shape[1:])


def _fixed(value: Tensor) -> Tensor:
    """Pillow's ``FIX``: 16.16 fixed point, ``floor(v * 65536 + 0.5)``, as int64."""
    return (value * 65536.0 + 0.5).floor().long()


def _nearest_points(matrix: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
    """The source pixel (column, row) of each output pixel as Pillow's nearest affine picks it: two (N, H, W) int64.

    Pillow skips its generic path for nearest: a matrix without rotation or shear (a1 = a3 = 0) runs
    ``ImagingScaleAffine`` (``COORD`` of ``a2 + a0 / 2 + x a0`` in float64; Pillow adds a0 per pixel, equal but
    within an ulp of an integer), any other ``affine_fixed`` in 16.16 fixed point (exact in integers here; Pillow
    takes it for coordinates under 32768 px).
    """
    a0, a1, a2, a3, a4, a5 = (matrix[:, k, None, None] for k in range(6))  # (N, 1, 1) each
    x = torch.arange(width, device=matrix.device)  # (W,)
    y = torch.arange(height, device=matrix.device)[:, None]  # (H, 1)
    column_scaled = (a2 + a0 * 0.5 + x * a0).floor().long()  # (N, 1, W); negative is outside like COORD's -1
    row_scaled = (a5 + a4 * 0.5 + y * a4).floor().long()  # (N, H, 1)
    column_fixed = (_fixed(a2 + a0 * 0.5 + a1 * 0.5) + x * _fixed(a0) + y * _fixed(a1)) >> 16  # (N, H, W)
    row_fixed = (_fixed(a5 + a3 * 0.5 + a4 * 0.5) + x * _fixed(a3) + y * _fixed(a4)) >> 16  # (N, H, W)
    scaling = (a1 == 0) & (a3 == 0)  # (N, 1, 1)
    return torch.where(scaling, column_scaled, column_fixed), torch.where(scaling, row_scaled, row_fixed)


def _filter(samples: list[Tensor], d: Tensor, mode: str) -> Tensor:
    """Pillow's 1-D filter through ``samples`` at fraction ``d``; one sample (a fraction of 0 everywhere) is exact."""
    if len(samples) == 1:
        return samples[0]
    return linear(*samples, d) if mode == "bilinear" else cubic(*samples, d)


def _taps(start: Tensor, count: int, size: int) -> list[Tensor]:
    """``count`` neighbouring indices from ``start``, clamped to the image (Pillow repeats edge pixels)."""
    return [(start + k).clamp(0, size - 1) for k in range(count)]


def _interpolate(flat: Tensor, x_in: Tensor, y_in: Tensor, mode: str, height: int, width: int) -> Tensor:
    """Pillow's bilinear or bicubic filter at (N, H, W) source points -> (N, C, H, W) uint8, in float64.

    Where a fraction is 0 for every point (rows for shears and translations along x, columns along y), Pillow's
    filter returns the sample at the floor exactly, so only that row (column) of taps is read.
    """
    x, y = x_in - 0.5, y_in - 0.5  # (N, H, W)
    x_floor, y_floor = x.floor(), y.floor()
    dx, dy = (x - x_floor)[:, None], (y - y_floor)[:, None]  # (N, 1, H, W)
    taps, first = (2, 0) if mode == "bilinear" else (4, -1)
    columns = _taps(x_floor.long() + first, taps, width) if dx.any() else [x_floor.long().clamp(0, width - 1)]
    rows = _taps(y_floor.long() + first, taps, height) if dy.any() else [y_floor.long().clamp(0, height - 1)]
    across = [_filter([_gather(flat, row, column, width).double() for column in columns], dx, mode) for row in rows]
    value = _filter(across, dy, mode)  # (N, C, H, W) float64
    return value.clamp_(0, 255).to(torch.uint8)  # bilinear stays in [0, 255]; both truncate


def affine(images: Tensor, matrix: Tensor, fill: Tensor, mode: str) -> Tensor:
    """``Image.transform(size, Image.AFFINE, matrix, resample=mode, fillcolor=fill)`` per image.

    Args:
        images: (N, C, H, W) uint8.
        matrix: (N, 6) float64 Pillow coefficients: output pixel centre -> source point.
        fill: (C,) uint8 colour of output pixels whose source point lies outside the image.
        mode: ``"nearest"``, ``"bilinear"`` or ``"bicubic"``.

    Returns:
        (N, C, H, W) uint8.
    """
    n, c, height, width = images.shape
    flat = images.reshape(n, c, -1)  # (N, C, H * W)
    if mode == "nearest":
        columns, rows = _nearest_points(matrix, height, width)  # (N, H, W)
        inside = (columns >= 0) & (columns < width) & (rows >= 0) & (rows < height)  # (N, H, W)
        sampled = _gather(flat, rows.clamp(0, height - 1), columns.clamp(0, width - 1), width)  # (N, C, H, W)
    else:
        x_in, y_in = _source_points(matrix, height, width)  # (N, H, W)
        inside = (x_in >= 0) & (x_in < width) & (y_in >= 0) & (y_in < height)  # (N, H, W)
        sampled = _interpolate(flat, x_in, y_in, mode, height, width)  # (N, C, H, W)
    return torch.where(inside[:, None], sampled, fill.view(1, c, 1, 1))


# ---- timm's op names ----------------------------------------------------------------------------------------------


_ENHANCE = {"Color": color, "Contrast": contrast, "Brightness": brightness, "Sharpness": sharpness}
PIXEL_OPS: dict[str, PixelOp] = {
    "AutoContrast": auto_contrast,
    "Equalize": equalize,
    "Invert": invert,
    "Posterize": posterize,
    "PosterizeIncreasing": posterize,
    "PosterizeOriginal": posterize,
    "Solarize": solarize,
    "SolarizeIncreasing": solarize,
    "SolarizeAdd": solarize_add,
    **{name + increasing: op for name, op in _ENHANCE.items() for increasing in ("", "Increasing")},
}
"""The pixels of each of timm's op names that maps pixel values or blends."""
MATRIX_OPS: dict[str, MatrixOp] = {"Rotate": rotate_matrix, **{name: partial(affine_matrix, name) for name in AFFINE}}
"""The Pillow coefficients of each of timm's geometric op names, resampled by :func:`affine`."""


def run_op(name: str, images: Tensor, argument: Tensor, fill: Tensor, mode: str) -> Tensor:
    """Run timm's op ``name`` at each image's argument as Pillow does: (N, C, H, W) uint8 -> (N, C, H, W) uint8.

    Args:
        name: timm's op name (a key of :data:`PIXEL_OPS` or :data:`MATRIX_OPS`).
        images: (N, C, H, W) uint8.
        argument: (N,) float64, the op's argument (:func:`kpca.vision_cls.input.policy.arguments`).
        fill: (C,) uint8 colour of the pixels a geometric op uncovers.
        mode: The resampling of a geometric op: ``"nearest"``, ``"bilinear"`` or ``"bicubic"``.
    """
    if name in PIXEL_OPS:
        return PIXEL_OPS[name](images, argument)
    matrix = MATRIX_OPS[name](argument, images.shape[2], images.shape[3])  # (N, 6)
    return affine(images, matrix, fill, mode)
