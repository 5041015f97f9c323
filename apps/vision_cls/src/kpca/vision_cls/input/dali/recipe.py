"""The DALI path's training recipe in timm's terms, and timm's RandAugment string parsed for it; no DALI import.

:class:`DaliTrainRecipe` is what :mod:`kpca.vision_cls.input.dali.graph` builds its pipeline from and what
:class:`kpca.vision_cls.input.dali.loader.DaliTrainLoader` carries; :func:`parse_rand_augment` also serves the check
of ``data.auto_augment`` with ``data.input: dali`` (:mod:`kpca.vision_cls.input.options`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kpca.attention.errors import OptionError
from kpca.vision_cls.input.policy import LEVEL_DENOM, timm_train_hparams

BINS_PER_LEVEL = 100  # magnitude resolution of the tables: 0.01 of timm's magnitude unit


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


@dataclass(frozen=True)
class DaliTrainRecipe:
    """The training transform the DALI pipeline applies, in the workers' terms (timm's options).

    Attributes:
        image_size: Side S of the square crop, in pixels.
        scale: Area range of the random crop, as fractions of the image (DeiT: 0.08-1).
        hflip: Probability of a horizontal flip.
        rand_augment: timm's RandAugment settings, or None for no RandAugment.
        interpolation: ``"bicubic"``, ``"bilinear"`` or ``"nearest"``: the resize filter (RandAugment's rotate,
            shear and translate are bilinear in DALI, nearest for ``"nearest"``).
        fill: Gray level of the pixels that rotate, shear and translate uncover.
    """

    image_size: int
    scale: tuple[float, float]
    hflip: float
    rand_augment: RandAugmentConfig | None
    interpolation: str = "bicubic"
    fill: int = 128

    @classmethod
    def from_timm(
        cls,
        image_size: int,
        scale: Sequence[float],
        hflip: float,
        auto_augment: str | None,
        interpolation: str,
        mean: Sequence[float],
    ) -> DaliTrainRecipe:
        """The recipe of ``transforms_imagenet_train`` with these settings (the datamodule's options).

        timm fills uncovered pixels with the dataset mean in uint8 (ImageNet: (124, 116, 104)); DALI's warps take
        one gray level, so the fill is that mean's channel average (ImageNet: 115).
        """
        channel_fill = timm_train_hparams(image_size, mean)["img_mean"]
        return cls(
            image_size=image_size,
            scale=(float(scale[0]), float(scale[1])),
            hflip=hflip,
            rand_augment=parse_rand_augment(auto_augment) if auto_augment else None,
            interpolation=interpolation,
            fill=round(sum(channel_fill) / len(channel_fill)),
        )
