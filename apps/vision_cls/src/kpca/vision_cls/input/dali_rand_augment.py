"""timm's RandAugment (DeiT's ``rand-m9-mstd0.5-inc1``) as parameter tables for the DALI path; no DALI import.

timm's ``AugmentOp`` turns a magnitude m (0-10) into each op's argument with a level function and negates some of
them at random (:mod:`kpca.vision_cls.input.policy`). DALI looks arguments up per sample, so each op here gets a
table: the argument of every magnitude from 0 to ``magnitude_max`` in steps of 0.01 (:data:`BINS_PER_LEVEL`), each in
both signs, at index ``2 * bin + negated``, in the form DALI's operation takes it (:data:`TO_DALI`);
:mod:`kpca.vision_cls.input.dali_graph` applies the ops.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kpca.attention.errors import OptionError
from kpca.vision_cls.input.policy import LEVEL_DENOM, LEVELS, SMOOTH, arguments, rand_op_names

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


def shift(argument: float) -> list[float]:
    """A shear factor or translate fraction along x, (x, y), negated: DALI maps source to destination, PIL back."""
    return [-argument, 0.0]


def shift_y(argument: float) -> list[float]:
    """As :func:`shift`, along y."""
    return [0.0, -argument]


def sharpness_kernel(factor: float) -> np.ndarray:
    """3x3 kernel of PIL's ``ImageEnhance.Sharpness(factor)``: blend of the image and PIL's SMOOTH filter."""
    identity = np.zeros((3, 3), dtype=np.float32)
    identity[1, 1] = 1.0
    return (factor * identity + (1.0 - factor) * SMOOTH).astype(np.float32)


def posterize_mask(bits: float) -> np.ndarray:
    """The uint8 mask that keeps the ``bits`` high bits, as Pillow 11's ``ImageOps.posterize`` (0 bits: black)."""
    bits = min(8, max(0, int(bits)))
    return np.array(0xFF ^ (2 ** (8 - bits) - 1), dtype=np.uint8)


def threshold(argument: float) -> np.ndarray:
    """Solarize's threshold as DALI's operation takes it."""
    return np.array(int(argument), dtype=np.int32)


def added(argument: float) -> np.ndarray:
    """SolarizeAdd's shift as DALI's operation takes it."""
    return np.array(int(argument), dtype=np.uint8)


TO_DALI: dict[str, Callable[[float], Any]] = {
    "Rotate": float,
    "Posterize": posterize_mask,
    "Solarize": threshold,
    "SolarizeAdd": added,
    "Color": float,
    "Contrast": float,
    "Brightness": float,
    "Sharpness": sharpness_kernel,
    "ShearX": shift,
    "ShearY": shift_y,
    "TranslateX": shift,
    "TranslateY": shift_y,
}
"""timm's argument (:func:`kpca.vision_cls.input.policy.arguments`) -> the argument of each DALI operation kind."""


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


def argument_table(config: RandAugmentConfig, name: str, kind: str) -> np.ndarray:
    """The (2 * bins, ...) DALI arguments of op ``name`` at every magnitude bin, floats as float32.

    Unsigned at ``2 * bin``, negated at ``2 * bin + 1`` (equal for ops timm never negates).
    """
    levels = torch.from_numpy(np.linspace(0.0, config.magnitude_max, config.bins)).repeat_interleave(2)  # (2 * bins,)
    negate = torch.arange(2 * config.bins) % 2 == 1  # (2 * bins,)
    timm_arguments = arguments(name, levels, negate, {})  # (2 * bins,) float64
    table = np.stack([np.asarray(TO_DALI[kind](argument)) for argument in timm_arguments.tolist()])
    return table.astype(np.float32) if table.dtype == np.float64 else table


def rand_augment_specs(config: RandAugmentConfig) -> list[OpSpec]:
    """The op set of timm (:func:`kpca.vision_cls.input.policy.rand_op_names`), in its order, with their tables.

    ``Identity`` ends the list: what a layer applies when its probability ``prob`` says no.
    """
    specs = []
    for name in rand_op_names(config.increasing):
        kind = name.removesuffix("Increasing").removesuffix("Rel")
        table = argument_table(config, name, kind) if LEVELS[name] is not None else None
        specs.append(OpSpec(name, kind, table))
    return [*specs, OpSpec("Identity", "Identity")]
