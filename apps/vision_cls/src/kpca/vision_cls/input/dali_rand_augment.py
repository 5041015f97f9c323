"""timm's RandAugment (DeiT's ``rand-m9-mstd0.5-inc1``) as parameter tables for the DALI path; no DALI import.

timm's ``AugmentOp`` turns a magnitude m (0-10) into each op's argument with a level function
(``timm.data.auto_augment.LEVEL_TO_ARG``) and negates some of them at random. DALI looks arguments up per sample, so
each op here gets a table: the argument of every magnitude from 0 to ``magnitude_max`` in steps of 0.01
(:data:`BINS_PER_LEVEL`), each in both signs, at index ``2 * bin + negated``. The formulas are timm's, one function
each below; :mod:`kpca.vision_cls.input.dali_graph` applies the ops.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kpca.attention.errors import OptionError

LEVEL_DENOM = 10.0  # timm's _LEVEL_DENOM: magnitude m maps to the fraction m / 10 of each op's range
TRANSLATE_PCT = 0.45  # timm's default translate_pct of TranslateXRel / TranslateYRel
BINS_PER_LEVEL = 100  # magnitude resolution of the tables: 0.01 of timm's magnitude unit
DATA_DEVICE_OPS = ("Posterize", "Solarize", "SolarizeAdd", "Sharpness")  # arguments combined with the pixels


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

    @property
    def bins(self) -> int:
        """Magnitude bins of the tables: 0 to ``magnitude_max`` by ``1 / BINS_PER_LEVEL``."""
        return round(self.magnitude_max * BINS_PER_LEVEL) + 1


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
        ValueError: For policies other than ``rand`` (AutoAugment, AugMix), timm's ``t`` op sets, or an unknown
            section; the message names the value and the fix.
    """
    sections = config.split("-")
    if sections[0] != "rand":
        raise OptionError(
            f"auto_augment={config!r}: the DALI path mirrors timm's RandAugment ('rand-...', e.g. DeiT's "
            "'rand-m9-mstd0.5-inc1') only; use data.input=turbo (the default) or data.input=timm for other policies."
        )
    fields: dict[str, Any] = {}
    for section in sections[1:]:
        key, value = (re.split(r"(\d.*)", section) + [""])[:2]
        if key not in _SECTIONS or not value:
            raise OptionError(
                f"auto_augment={config!r}: section {section!r} has no DALI mirror; timm's RandAugment sections "
                "m, n, mstd, mmax, inc and p are (e.g. 'rand-m9-mstd0.5-inc1'), op sets 't...' are not."
            )
        name, convert = _SECTIONS[key]
        fields[name] = convert(value)
    return RandAugmentConfig(**fields)


def rotate_degrees(level: float) -> float:
    """Rotate's angle in timm: +-30 degrees at m = 10."""
    return level / LEVEL_DENOM * 30.0


def shear_x(level: float) -> list[float]:
    """ShearX's factor in timm (0.3 at m = 10) as DALI's shear, negated: DALI maps source to destination, PIL back."""
    return [-level / LEVEL_DENOM * 0.3, 0.0]


def shear_y(level: float) -> list[float]:
    """ShearY's factor in timm, negated as in :func:`shear_x`."""
    return [0.0, -level / LEVEL_DENOM * 0.3]


def translate_x(level: float) -> list[float]:
    """TranslateXRel in timm (0.45 of the width at m = 10) as a fraction (x, y), negated as in :func:`shear_x`."""
    return [-level / LEVEL_DENOM * TRANSLATE_PCT, 0.0]


def translate_y(level: float) -> list[float]:
    """TranslateYRel in timm (0.45 of the height at m = 10), negated as in :func:`shear_x`."""
    return [0.0, -level / LEVEL_DENOM * TRANSLATE_PCT]


def enhance_increasing(level: float) -> float:
    """The factor of timm's ColorIncreasing, ContrastIncreasing, BrightnessIncreasing, SharpnessIncreasing."""
    return max(0.1, 1.0 + level / LEVEL_DENOM * 0.9)


def enhance(level: float) -> float:
    """The factor of timm's Color, Contrast, Brightness and Sharpness: 0.1 + 1.8 m / 10."""
    return level / LEVEL_DENOM * 1.8 + 0.1


def sharpness_kernel(factor: float) -> np.ndarray:
    """3x3 kernel of PIL's ``ImageEnhance.Sharpness(factor)``: blend of the image and PIL's SMOOTH filter."""
    smooth = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / 13  # PIL's ImageFilter.SMOOTH
    identity = np.zeros((3, 3), dtype=np.float32)
    identity[1, 1] = 1.0
    return (factor * identity + (1.0 - factor) * smooth).astype(np.float32)


def posterize_mask(bits: int) -> np.ndarray:
    """The uint8 mask that keeps the ``bits`` high bits, as Pillow 11's ``ImageOps.posterize`` (0 bits: black)."""
    bits = min(8, max(0, bits))
    return np.array(0xFF ^ (2 ** (8 - bits) - 1), dtype=np.uint8)


def posterize_increasing(level: float) -> np.ndarray:
    """PosterizeIncreasing in timm: keep 4 - int(4 m / 10) bits."""
    return posterize_mask(4 - int(level / LEVEL_DENOM * 4))


def posterize(level: float) -> np.ndarray:
    """Posterize in timm: keep int(4 m / 10) bits."""
    return posterize_mask(int(level / LEVEL_DENOM * 4))


def solarize_increasing(level: float) -> np.ndarray:
    """SolarizeIncreasing's threshold in timm: 256 - min(256, int(256 m / 10)); pixels at or above it invert."""
    return np.array(256 - min(256, int(level / LEVEL_DENOM * 256)), dtype=np.int32)


def solarize(level: float) -> np.ndarray:
    """Solarize's threshold in timm: min(256, int(256 m / 10))."""
    return np.array(min(256, int(level / LEVEL_DENOM * 256)), dtype=np.int32)


def solarize_add(level: float) -> np.ndarray:
    """SolarizeAdd's shift in timm: min(128, int(110 m / 10)), added to pixels below 128."""
    return np.array(min(128, int(level / LEVEL_DENOM * 110)), dtype=np.uint8)


@dataclass(frozen=True)
class OpSpec:
    """One RandAugment op: its timm name, the DALI operation that applies it and its argument table.

    Attributes:
        name: timm's op name, e.g. ``"PosterizeIncreasing"``.
        kind: The operation in :mod:`kpca.vision_cls.input.dali_graph` (timm's name without ``Increasing``).
        table: (2 * bins, ...) argument per signed magnitude bin (index ``2 * bin + negated``), or None for ops
            without an argument.
    """

    name: str
    kind: str
    table: np.ndarray | None = None

    @property
    def on_data_device(self) -> bool:
        """Whether the argument is combined with the pixels (so it lives on their device)."""
        return self.kind in DATA_DEVICE_OPS


def argument_table(config: RandAugmentConfig, to_argument: Callable[[float], Any], negate: bool) -> np.ndarray:
    """The (2 * bins, ...) arguments of every magnitude bin: unsigned at ``2 * bin``, negated at ``2 * bin + 1``.

    The negated entries equal the unsigned ones for ops timm never negates. Floats are stored as float32.
    """
    levels = np.linspace(0.0, config.magnitude_max, config.bins)  # (bins,)
    signed = np.stack([levels, -levels if negate else levels], axis=1).reshape(-1)  # (2 * bins,)
    table = np.stack([np.asarray(to_argument(float(level))) for level in signed])
    return table.astype(np.float32) if table.dtype == np.float64 else table


def rand_augment_specs(config: RandAugmentConfig) -> list[OpSpec]:
    """The op set of timm (``_RAND_INCREASING_TRANSFORMS`` with ``inc1``, else ``_RAND_TRANSFORMS``), in its order.

    ``Identity`` ends the list: what a layer applies when its probability ``prob`` says no.
    """
    inc = config.increasing
    suffix = "Increasing" if inc else ""
    factor = enhance_increasing if inc else enhance

    def spec(name: str, to_argument: Callable[[float], Any], negate: bool = False) -> OpSpec:
        kind = name.removesuffix("Increasing").removesuffix("Rel")
        return OpSpec(name, kind, argument_table(config, to_argument, negate))

    return [
        OpSpec("AutoContrast", "AutoContrast"),
        OpSpec("Equalize", "Equalize"),
        OpSpec("Invert", "Invert"),
        spec("Rotate", rotate_degrees, negate=True),
        spec("Posterize" + suffix, posterize_increasing if inc else posterize),
        spec("Solarize" + suffix, solarize_increasing if inc else solarize),
        spec("SolarizeAdd", solarize_add),
        spec("Color" + suffix, factor, negate=inc),
        spec("Contrast" + suffix, factor, negate=inc),
        spec("Brightness" + suffix, factor, negate=inc),
        spec("Sharpness" + suffix, lambda level: sharpness_kernel(factor(level)), negate=inc),
        spec("ShearX", shear_x, negate=True),
        spec("ShearY", shear_y, negate=True),
        spec("TranslateXRel", translate_x, negate=True),
        spec("TranslateYRel", translate_y, negate=True),
        OpSpec("Identity", "Identity"),
    ]
