"""The DALI path's training recipe in timm's terms; no DALI import.

:class:`DaliTrainRecipe` is what :mod:`kpca.vision_cls.input.dali.graph` builds its pipeline from and what
:class:`kpca.vision_cls.input.dali.loader.DaliTrainLoader` carries; its RandAugment settings are the policy's own
parse of timm's string (:func:`kpca.vision_cls.input.policy.parse_rand_augment`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kpca.vision_cls.input.policy import RandAugmentConfig, parse_rand_augment, timm_train_hparams


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
