"""The training transform of the DataLoader workers (``data.input: turbo | timm``) and the file loader it expects.

timm's ``transforms_imagenet_train`` builds DeiT's stages (random resized crop, horizontal flip, RandAugment or
colour jitter) on PIL images: with ``input="timm"`` they run as they are, on PIL-decoded images, bit-identical to
timm (the reference). With ``input="turbo"`` they become their tensor equivalents
(:func:`kpca.vision_cls.input.workers.turbo.turbo_stages`), on the file bytes the training ImageFolder reads. timm's own
tensor stage is replaced (it would normalise; the model normalises inside), so both paths end in a uint8
(3, S, S) tensor. With ``augment_on="device"`` the workers stop there
(:class:`kpca.vision_cls.input.device.tail.DeviceTrainAugment` finishes after transfer); with ``"workers"`` the
float conversion and :class:`~kpca.vision_cls.input.workers.random_erasing.PixelSpaceRandomErasing` follow, per
image; with ``"device_randaugment"`` the workers also leave RandAugment out (it runs batched on the device).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from timm.data.auto_augment import RandAugment
from timm.data.transforms_factory import transforms_imagenet_train
from torchvision import transforms
from torchvision.datasets.folder import default_loader

from kpca.vision_cls.input.device.tail import uint8_to_unit
from kpca.vision_cls.input.options import UINT8_LOADER, AugmentOn
from kpca.vision_cls.input.workers.random_erasing import PixelSpaceRandomErasing
from kpca.vision_cls.input.workers.turbo import read_image_bytes, turbo_stages


def timm_train_stages(
    image_size: int,
    scale: Sequence[float],
    hflip: float,
    color_jitter: float,
    auto_augment: str | None,
    interpolation: str,
    mean: Sequence[float],
) -> list[Callable]:
    """The DeiT training stages of timm's ``transforms_imagenet_train`` on PIL images, without its tensor stage.

    Args:
        image_size: Side S of the square crop, in pixels.
        scale: Area range of the random resized crop.
        hflip: Probability of a horizontal flip.
        color_jitter: Colour jitter strength; as in timm it is ignored while ``auto_augment`` is set; 0 disables.
        auto_augment: timm auto-augment policy (DeiT: ``"rand-m9-mstd0.5-inc1"``); None disables.
        interpolation: Resampling filter of the crop and of RandAugment.
        mean: Per-channel mean (RandAugment's fill colour).
    """
    primary, secondary, _ = transforms_imagenet_train(
        img_size=image_size,
        scale=scale,
        hflip=hflip,
        color_jitter=color_jitter or None,
        auto_augment=auto_augment or None,
        interpolation=interpolation,
        mean=mean,
        separate=True,
    )
    return [*primary.transforms, *secondary.transforms]


def worker_train_transform(
    input: Literal["turbo", "timm"],
    augment_on: AugmentOn,
    timm_stages: Sequence[Callable],
    erasing: PixelSpaceRandomErasing | None,
) -> transforms.Compose:
    """The workers' training transform of ``input``: a uint8 (3, S, S) tensor on the device path, else float.

    Args:
        input: ``"turbo"`` (file bytes in, tensor stages) or ``"timm"`` (PIL images in, timm's stages).
        augment_on: ``"device"`` stops at uint8; ``"workers"`` adds the float conversion and ``erasing``;
            ``"device_randaugment"`` stops at uint8 without timm's RandAugment stage.
        timm_stages: timm's stages (:func:`timm_train_stages`).
        erasing: The per-image eraser for ``augment_on="workers"``, or None when random erasing is off.
    """
    if augment_on == "device_randaugment":
        timm_stages = [stage for stage in timm_stages if not isinstance(stage, RandAugment)]
    if input == "turbo":
        stages = turbo_stages(timm_stages)  # ends in a uint8 (3, S, S) tensor
        if augment_on == "workers":
            stages.append(uint8_to_unit)  # bit-identical to ToTensor
    else:
        stages = [*timm_stages, transforms.PILToTensor() if augment_on in UINT8_LOADER else transforms.ToTensor()]
    if augment_on == "workers" and erasing is not None:
        stages.append(erasing)
    return transforms.Compose(stages)


def train_image_loader(input: Literal["turbo", "timm"]) -> Callable[[str], object]:
    """The training ImageFolder's loader: file bytes for ``"turbo"`` (decoded in the transform), PIL for ``"timm"``."""
    return read_image_bytes if input == "turbo" else default_loader
