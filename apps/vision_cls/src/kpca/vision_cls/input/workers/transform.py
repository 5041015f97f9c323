"""The training transform of the DataLoader workers (``data.train.input: turbo | timm``) and the file loader it expects.

timm's ``transforms_imagenet_train`` builds DeiT's stages (random resized crop, horizontal flip, RandAugment or
colour jitter) on PIL images: with ``input="timm"`` they run as they are, on PIL-decoded images, bit-identical to
timm (the reference). With ``input="turbo"`` they become their tensor equivalents
(:func:`kpca.vision_cls.input.workers.turbo.turbo_stages`), on the file bytes the training ImageFolder reads. timm's
own tensor stage is replaced (it would normalise; the model normalises inside), so both paths end in a uint8
(3, S, S) tensor. Where the transform ends is ``data.train.augment_on``'s
(:data:`kpca.vision_cls.input.options.AUGMENT_ON`): with ``"device"`` the workers stop there (the device tail,
:class:`kpca.vision_cls.input.device.tail.DeviceTail`, finishes after transfer); with ``"workers"`` the float
conversion and :class:`~kpca.vision_cls.input.workers.random_erasing.PixelSpaceRandomErasing` follow, per image;
with ``"device_randaugment"`` the workers also leave RandAugment out (it runs batched on the device).
"""

from __future__ import annotations

from collections.abc import Callable

from timm.data.auto_augment import RandAugment
from timm.data.transforms_factory import transforms_imagenet_train
from torchvision import transforms
from torchvision.datasets.folder import default_loader

from kpca.vision_cls.input.device.tail import uint8_to_unit
from kpca.vision_cls.input.options import MEAN, STD, InputPath, Interpolation, TrainData
from kpca.vision_cls.input.workers.random_erasing import PixelSpaceRandomErasing
from kpca.vision_cls.input.workers.turbo import read_image_bytes, turbo_stages


def timm_train_stages(train: TrainData, image_size: int, interpolation: Interpolation) -> list[Callable]:
    """The DeiT training stages of timm's ``transforms_imagenet_train`` on PIL images, without its tensor stage.

    The crop (``image_size``, ``train.scale``, ``interpolation``), the flip (``train.hflip``), then RandAugment
    (``train.auto_augment``, filling with :data:`~kpca.vision_cls.input.options.MEAN`) or, as in timm only without
    it, colour jitter (``train.color_jitter``; 0 disables).
    """
    primary, secondary, _ = transforms_imagenet_train(
        img_size=image_size,
        scale=train.scale,
        hflip=train.hflip,
        color_jitter=train.color_jitter or None,
        auto_augment=train.auto_augment or None,
        interpolation=interpolation,
        mean=MEAN,
        separate=True,
    )
    return [*primary.transforms, *secondary.transforms]


def worker_train_transform(train: TrainData, image_size: int, interpolation: Interpolation) -> transforms.Compose:
    """The workers' training transform of ``train.input``: a uint8 (3, S, S) tensor, or float32 finished here.

    timm's stages (:func:`timm_train_stages`) as they are (``"timm"``, on PIL images) or as their turbo equivalents
    (``"turbo"``, on file bytes), less RandAugment where ``augment_on`` moves it to the device; then, where
    ``augment_on`` keeps them in the workers, the float conversion and random erasing.
    """
    on_device = train.on_device
    stages = timm_train_stages(train, image_size, interpolation)
    if on_device.rand_augment:
        stages = [stage for stage in stages if not isinstance(stage, RandAugment)]
    if train.input == "turbo":
        stages = turbo_stages(stages)  # ends in a uint8 (3, S, S) tensor
        if not on_device.float_and_erasing:
            stages.append(uint8_to_unit)  # bit-identical to ToTensor
    else:
        stages = [*stages, transforms.PILToTensor() if on_device.float_and_erasing else transforms.ToTensor()]
    if not on_device.float_and_erasing and train.re_prob > 0:
        stages.append(PixelSpaceRandomErasing(train.re_prob, MEAN, STD, mode=train.re_mode))
    return transforms.Compose(stages)


def train_image_loader(input: InputPath) -> Callable[[str], object]:
    """The training ImageFolder's loader: file bytes for ``"turbo"`` (decoded in the transform), PIL for ``"timm"``."""
    return read_image_bytes if input == "turbo" else default_loader
