"""timm's RandAugment (DeiT's ``rand-m9-mstd0.5-inc1``) as parameter tables for the DALI path; no DALI import.

timm's ``AugmentOp`` turns a magnitude m (0-10) into each op's argument with a level function and negates some of
them at random (:mod:`kpca.vision_cls.input.policy`). DALI looks arguments up per sample, so each op here gets a
table: the argument of every magnitude from 0 to ``magnitude_max`` in steps of 0.01
(:data:`BINS_PER_LEVEL`, :func:`magnitude_bins`), each in both signs, at index ``2 * bin + negated``, in
the form DALI's operation takes it (:data:`TO_DALI`); :mod:`kpca.vision_cls.input.dali.graph` applies the ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kpca.vision_cls.input.policy import LEVELS, SMOOTH, RandAugmentConfig, arguments, rand_op_names

BINS_PER_LEVEL = 100  # magnitude resolution of the tables: 0.01 of timm's magnitude unit

DATA_DEVICE_OPS = ("Posterize", "Solarize", "SolarizeAdd", "Sharpness")  # arguments combined with the pixels


def magnitude_bins(config: RandAugmentConfig) -> int:
    """Magnitude bins of the tables: 0 to ``config.magnitude_max`` by ``1 / BINS_PER_LEVEL``."""
    return round(config.magnitude_max * BINS_PER_LEVEL) + 1


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
        kind: The operation in :mod:`kpca.vision_cls.input.dali.graph` (timm's name without ``Increasing``).
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
    bins = magnitude_bins(config)
    levels = torch.from_numpy(np.linspace(0.0, config.magnitude_max, bins)).repeat_interleave(2)  # (2 * bins,)
    negate = torch.arange(2 * bins) % 2 == 1  # (2 * bins,)
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
