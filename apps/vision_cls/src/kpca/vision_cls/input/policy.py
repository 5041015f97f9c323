"""timm's RandAugment policy, written once: its ops, each op's argument at a magnitude, and Pillow's constants.

timm's ``AugmentOp`` turns a magnitude m (0-10, after its noise) into its op's argument with a level function
(``timm.data.auto_augment.LEVEL_TO_ARG``), negates some arguments at random, and hands them to Pillow. Three
executors run that policy, and each reads it from here:

* the DataLoader workers (``data.train.input: turbo``): timm's own RandAugment object, whose slow ops compute Pillow's
  pixels with compiled kernels (:mod:`kpca.vision_cls.input.workers.compiled_rand_augment`) that read
  :data:`AFFINE`, :data:`SMOOTH` and :func:`cubic`;
* NVIDIA DALI (``data.train.input: dali``): one argument table per op over the magnitude bins, from :func:`arguments`
  (:mod:`kpca.vision_cls.input.dali.tables`);
* the device (``data.train.augment_on: device_randaugment``): each image's argument from its draws with
  :func:`arguments`, and Pillow's ops in torch with these constants (:mod:`kpca.vision_cls.input.device`).

The policy's string, timm's ``rand-m9-mstd0.5-inc1``, is parsed here too (:func:`parse_rand_augment`): DALI's
tables and the option checks read its settings; the workers and the device hand the string to timm's own
``rand_augment_transform``, which this parse matches. tests/vision_cls/test_rand_augment_policy.py holds
:data:`LEVELS` and every executor to timm's own ops.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from timm.data import IMAGENET_DEFAULT_MEAN
from timm.data.auto_augment import rand_augment_transform
from timm.data.transforms import str_to_pil_interp
from torch import Tensor

from kpca.training.errors import OptionError

LEVEL_DENOM = 10.0
"""timm's ``_LEVEL_DENOM``: magnitude m gives the fraction m / 10 of each op's range."""
HPARAM_DEFAULTS = {"translate_pct": 0.45}
"""timm's default of an hparam a level reads, where timm has one (``translate_const`` has none)."""


@dataclass(frozen=True)
class Level:
    """One of timm's level functions, step by step in timm's order: magnitude m -> the op's argument.

    ``m / 10 * scale``; truncated if ``integer``; capped at ``at_most``; subtracted from ``subtract_from``; negated
    with probability 1/2 if ``negates``; plus ``plus``; raised to ``at_least``.

    Attributes:
        scale: The argument at m = 10 before those steps; a string names the hparam holding it.
    """

    scale: float | str
    negates: bool = False
    integer: bool = False
    at_most: float | None = None
    subtract_from: float | None = None
    plus: float | None = None
    at_least: float | None = None

    def scale_in(self, hparams: dict) -> float:
        """The scale, read from ``hparams`` (or timm's default) where it names one."""
        if isinstance(self.scale, str):
            return float(hparams[self.scale] if self.scale in hparams else HPARAM_DEFAULTS[self.scale])
        return self.scale


ENHANCE_OPS = ("Color", "Contrast", "Brightness", "Sharpness")
"""The ``ImageEnhance`` ops: Pillow blends the image with a degenerate one by the argument."""
LEVELS: dict[str, Level | None] = {
    "AutoContrast": None,
    "Equalize": None,
    "Invert": None,
    "Rotate": Level(30.0, negates=True),  # degrees
    "Posterize": Level(4.0, integer=True),  # bits kept
    "PosterizeIncreasing": Level(4.0, integer=True, subtract_from=4.0),
    "PosterizeOriginal": Level(4.0, integer=True, plus=4.0),
    "Solarize": Level(256.0, integer=True, at_most=256.0),  # threshold: values at or above it are inverted
    "SolarizeIncreasing": Level(256.0, integer=True, at_most=256.0, subtract_from=256.0),
    "SolarizeAdd": Level(110.0, integer=True, at_most=128.0),  # added to values below 128
    **{name: Level(1.8, plus=0.1) for name in ENHANCE_OPS},  # blend factor
    **{f"{name}Increasing": Level(0.9, negates=True, plus=1.0, at_least=0.1) for name in ENHANCE_OPS},
    "ShearX": Level(0.3, negates=True),  # shear factor
    "ShearY": Level(0.3, negates=True),
    "TranslateX": Level("translate_const", negates=True),  # pixels
    "TranslateY": Level("translate_const", negates=True),
    "TranslateXRel": Level("translate_pct", negates=True),  # fraction of the side
    "TranslateYRel": Level("translate_pct", negates=True),
}
"""timm's level function of each op name (``LEVEL_TO_ARG``), None for ops without an argument."""


def fraction(magnitude: Tensor) -> Tensor:
    """``magnitude / 10`` rounded once, as Python divides, on any device: (...) float64 -> (...) float64.

    torch computes ``tensor / scalar`` on CUDA as ``tensor * (1 / scalar)``: a second rounding, enough to move a
    truncated argument by one.
    """
    return magnitude.div(torch.full_like(magnitude, LEVEL_DENOM))


def arguments(name: str, magnitude: Tensor, negate: Tensor, hparams: dict) -> Tensor:
    """The argument timm's level function of op ``name`` gives at each magnitude, computed in float64.

    Args:
        name: timm's op name, a key of :data:`LEVELS`.
        magnitude: (...) float64 magnitudes, after timm's noise and clip.
        negate: (...) bool, timm's sign coin (used by ops whose level negates).
        hparams: timm's hparams (``translate_const``, ``translate_pct``).

    Returns:
        (...) float64 arguments; zeros for an op without one.
    """
    level = LEVELS[name]
    if level is None:
        return torch.zeros_like(magnitude)
    value = fraction(magnitude) * level.scale_in(hparams)
    if level.integer:
        value = value.trunc()
    if level.at_most is not None:
        value = value.clamp(max=level.at_most)
    if level.subtract_from is not None:
        value = level.subtract_from - value
    if level.negates:
        value = torch.where(negate, -value, value)
    if level.plus is not None:
        value = value + level.plus
    if level.at_least is not None:
        value = value.clamp(min=level.at_least)
    return value


@dataclass(frozen=True)
class RandAugmentConfig:
    """timm's RandAugment settings, parsed from its config string (:func:`parse_rand_augment`).

    Attributes:
        num_layers: Ops applied per image (timm ``n``, default 2).
        magnitude: Magnitude m on timm's 0-10 scale (timm ``m``, default 10).
        magnitude_std: Std of the Gaussian noise on m per op (timm ``mstd``); ``inf`` draws m' ~ U(0, m).
        magnitude_max: Upper clip of the noisy magnitude (timm ``mmax``, default 10).
        increasing: timm's ``inc1`` op set, whose every op grows stronger with m.
        prob: Probability of applying each chosen op (timm ``p``, default 0.5).
    """

    num_layers: int = 2
    magnitude: float = 10.0
    magnitude_std: float = 0.0
    magnitude_max: float = LEVEL_DENOM
    increasing: bool = False
    prob: float = 0.5


_SECTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "m": ("magnitude", int),
    "n": ("num_layers", int),
    "mmax": ("magnitude_max", int),
    "inc": ("increasing", lambda value: bool(int(value))),
    "p": ("prob", float),
    "mstd": ("magnitude_std", lambda value: math.inf if float(value) > 100 else float(value)),
}


def parse_rand_augment(config: str) -> RandAugmentConfig:
    """Parse a timm RandAugment string such as DeiT's ``"rand-m9-mstd0.5-inc1"`` as timm does.

    Raises:
        ValueError: For policies other than ``rand`` (AutoAugment, AugMix), timm's ``t`` op sets (the executors run
            timm's default and ``inc1`` op sets), or an unknown section; the message names the value and the fix.
    """
    sections = config.split("-")
    if sections[0] != "rand":
        raise OptionError(
            f"auto_augment={config!r} is no RandAugment policy: those are 'rand-' and their sections (e.g. DeiT's "
            "'rand-m9-mstd0.5-inc1')."
        )
    fields: dict[str, Any] = {}
    for section in sections[1:]:
        key, value = (re.split(r"(\d.*)", section) + [""])[:2]
        if key not in _SECTIONS or not value:
            raise OptionError(
                f"auto_augment={config!r}: section {section!r} is not one the policy reads; timm's RandAugment "
                "sections m, n, mstd, mmax, inc and p are (e.g. 'rand-m9-mstd0.5-inc1'), op sets 't...' are not."
            )
        name, convert = _SECTIONS[key]
        fields[name] = convert(value)
    return RandAugmentConfig(**fields)


def rand_op_names(increasing: bool) -> list[str]:
    """The op names of timm's RandAugment, in its order: the ``inc1`` (increasing) set, or the default one."""
    return [op.name for op in rand_augment_transform("rand-inc1" if increasing else "rand", {}).ops]


def timm_train_hparams(
    img_size: int | Sequence[int] = 224, mean: Sequence[float] = IMAGENET_DEFAULT_MEAN, interpolation: str = "bicubic"
) -> dict:
    """The hparams timm's ``transforms_imagenet_train`` passes to ``rand_augment_transform`` (DeiT's by default).

    ``translate_const`` is 45 % of the shorter side, ``img_mean`` (the fill) the mean in 0-255 rounded, and the
    interpolation is fixed unless ``"random"`` (then timm picks bilinear or bicubic per geometric op).
    """
    size_min = min(img_size) if isinstance(img_size, Sequence) else img_size
    hparams = {"translate_const": int(size_min * 0.45), "img_mean": tuple(min(255, round(255 * x)) for x in mean)}
    if interpolation and interpolation != "random":
        hparams["interpolation"] = str_to_pil_interp(interpolation)
    return hparams


# ---- Pillow: what timm's ops compute ---------------------------------------------------------------------------

AFFINE: dict[str, Callable[[Any, int, int], tuple]] = {
    "ShearX": lambda factor, width, height: (1.0, factor, 0.0, 0.0, 1.0, 0.0),
    "ShearY": lambda factor, width, height: (1.0, 0.0, 0.0, factor, 1.0, 0.0),
    "TranslateX": lambda pixels, width, height: (1.0, 0.0, pixels, 0.0, 1.0, 0.0),
    "TranslateY": lambda pixels, width, height: (1.0, 0.0, 0.0, 0.0, 1.0, pixels),
    "TranslateXRel": lambda part, width, height: (1.0, 0.0, part * width, 0.0, 1.0, 0.0),
    "TranslateYRel": lambda part, width, height: (1.0, 0.0, 0.0, 0.0, 1.0, part * height),
}
"""Pillow's affine coefficients ``(a0, ..., a5)`` (output pixel centre -> source point) that timm's shear and
translate ops hand to ``Image.transform``, from the argument (a float, or a tensor of one per image) and the image's
width and height. Rotate goes through ``Image.rotate``, whose coefficients each executor computes."""

SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / np.float32(13)
"""Pillow's ``ImageFilter.SMOOTH`` over its scale 13, in float32 as Pillow's filter holds it: (3, 3)."""
SMOOTH_SIDE, SMOOTH_CENTRE = SMOOTH[0, 0], SMOOTH[1, 1]  # np.float32

LUMA_WEIGHTS = (19595, 38470, 7471)
"""Pillow's ``convert("L")``: ``(19595 R + 38470 G + 7471 B + 2**15) >> 16`` (ITU-R 601-2, ``Convert.c``'s L24)."""
LUMA_ROUND, LUMA_SHIFT = 1 << 15, 16


def cubic(v1: Any, v2: Any, v3: Any, v4: Any, d: Any) -> Any:
    """Pillow's ``BICUBIC`` (a = -1) through v1..v4 at fraction ``d`` between v2 and v3, in Pillow's operation order.

    Plain arithmetic, so that it runs on floats, on tensors, and compiled by numba, with the same rounding.
    """
    p1 = v2
    p2 = -v1 + v3
    p3 = 2 * (v1 - v2) + v3 - v4
    p4 = -v1 + v2 - v3 + v4
    return p1 + d * (p2 + d * (p3 + d * p4))


def linear(v1: Any, v2: Any, d: Any) -> Any:
    """Pillow's ``BILINEAR``: ``v1 + (v2 - v1) * d``."""
    return v1 + (v2 - v1) * d
