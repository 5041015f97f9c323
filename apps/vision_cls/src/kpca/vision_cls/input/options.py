"""The options of the training input path, and the one check of them.

* ``data.input``: which code turns files into training images. ``turbo`` (the default): DataLoader workers decode
  with libjpeg-turbo (``simplejpeg``) and crop, resize and flip with torch (:mod:`kpca.vision_cls.input.workers`).
  ``timm``: DataLoader workers run timm's own PIL transform, bit-identical to timm: the reference the other paths
  are measured against. ``dali``: NVIDIA DALI reads, decodes and augments (:mod:`kpca.vision_cls.input.dali`).
* ``data.augment_on``: where the training transform finishes (:data:`AUGMENT_ON`, the one table of what each value
  moves to the device). ``device`` (the default): the loader hands over uint8 images, converted to float and
  randomly erased batched on the device after transfer. ``workers``: the DataLoader workers do both per image.
  ``device_randaugment``: the workers stop after crop and flip, and timm's RandAugment also runs batched on the
  device, before the float conversion and erasing (timm's policy and Pillow's pixels, other random draws).

:class:`TrainOptions` holds every ``data`` option the input path reads and checks them when built:
:func:`check_input_options` refuses every combination the paths cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from kpca.training.choices import check_choice, keyed_by_choices
from kpca.training.data_checks.bad_files import BadFilesMode, check_bad_files_options
from kpca.training.errors import OptionError
from kpca.vision_cls.input.policy import parse_rand_augment

InputPath = Literal["turbo", "timm", "dali"]
AugmentOn = Literal["device", "workers", "device_randaugment"]
ErasingMode = Literal["pixel", "rand", "const"]
"""timm's random erasing fills (``data.re_mode``): per-pixel normal noise, one normal colour per erased box, or zero."""
Interpolation = Literal["bicubic", "bilinear", "nearest"]


INPUT_PATHS: dict[str, str] = keyed_by_choices(
    InputPath,
    {
        "turbo": "DataLoader workers, libjpeg-turbo decode and torch crop/resize",
        "timm": "DataLoader workers, timm's PIL transform exactly",
        "dali": "NVIDIA DALI",
    },
)
"""What each :data:`InputPath` runs, for the error refusing another."""


@dataclass(frozen=True)
class OnDevice:
    """What one ``data.augment_on`` value moves from the DataLoader workers to the batched device tail.

    Attributes:
        rand_augment: timm's RandAugment runs on the device (the workers leave it out).
        float_and_erasing: The float conversion and random erasing run on the device (the workers hand over uint8).
        description: What the value does, for the error refusing another.
    """

    rand_augment: bool
    float_and_erasing: bool
    description: str


AUGMENT_ON: dict[str, OnDevice] = keyed_by_choices(
    AugmentOn,
    {
        "device": OnDevice(False, True, "float conversion and random erasing batched on the device"),
        "workers": OnDevice(False, False, "float conversion and random erasing per image in the DataLoader workers"),
        "device_randaugment": OnDevice(
            True, True, "RandAugment, float conversion and random erasing batched on the device"
        ),
    },
)
"""What each :data:`AugmentOn` value moves to the device: the one place that decides it."""
WORKER_PATHS = "data.input=turbo (the default) or data.input=timm"


@dataclass(frozen=True)
class TrainOptions:
    """The ``data`` options the training input path reads; built from ImageNetDataModule's, checked when built.

    Each refusal is a ValueError naming the value and the fix (:func:`check_input_options` for the combinations).
    ``mean`` and ``std`` are the model's normalisation (timm's ImageNet values), not options.
    """

    input: InputPath
    augment_on: AugmentOn
    builtin: str | None
    image_size: int
    scale: tuple[float, float]
    hflip: float
    auto_augment: str | None
    color_jitter: float
    re_prob: float
    re_mode: ErasingMode
    interpolation: Interpolation
    repeated_aug: int
    bad_files: BadFilesMode
    max_bad_fraction: float
    mean: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN
    std: tuple[float, float, float] = IMAGENET_DEFAULT_STD

    def __post_init__(self) -> None:
        if not 0.0 < self.scale[0] <= self.scale[1] <= 1.0:
            raise OptionError(f"scale={self.scale!r} must satisfy 0 < low <= high <= 1 (DeiT: (0.08, 1.0))")
        if not 0.0 <= self.hflip <= 1.0:
            raise OptionError(f"hflip={self.hflip} must be a probability in [0, 1]")
        if not 0.0 <= self.re_prob <= 1.0:
            raise OptionError(f"re_prob={self.re_prob} must be a probability in [0, 1]; 0 disables random erasing.")
        check_choice("data.re_mode", self.re_mode, ErasingMode, "choose one of timm's RandomErasing fills")
        check_choice("data.interpolation", self.interpolation, Interpolation)
        if self.repeated_aug < 1:
            raise OptionError(f"repeated_aug={self.repeated_aug} must be at least 1; 1 disables repeated augmentation.")
        check_bad_files_options(self.bad_files, self.max_bad_fraction)
        check_input_options(
            self.input,
            self.augment_on,
            builtin=self.builtin,
            auto_augment=self.auto_augment,
            color_jitter=self.color_jitter,
            bad_files=self.bad_files,
        )

    @property
    def on_device(self) -> OnDevice:
        """What ``augment_on`` moves to the device (:data:`AUGMENT_ON`)."""
        return AUGMENT_ON[self.augment_on]


def check_input_options(
    input: InputPath,
    augment_on: AugmentOn,
    *,
    builtin: str | None,
    auto_augment: str | None,
    color_jitter: float,
    bad_files: str,
) -> None:
    """Refuse a training input path that cannot run with the other data options.

    Each refusal is a ValueError naming the value and the fix. DALI being importable is checked when the DALI path is
    built (:func:`kpca.vision_cls.input.dali.loader.require_dali`), after these checks.

    Args:
        input: ``data.input``: ``"turbo"``, ``"timm"`` or ``"dali"``.
        augment_on: ``data.augment_on``: ``"device"``, ``"workers"`` or ``"device_randaugment"``.
        builtin: ``data.builtin``; the DALI path reads an ImageFolder ``root`` only.
        auto_augment: ``data.auto_augment``; DALI mirrors timm's ``rand-...`` policies only.
        color_jitter: ``data.color_jitter``; as in timm it only acts without ``auto_augment``, and DALI has no
            mirror of timm's ColorJitter.
        bad_files: ``data.bad_files``; DALI cannot skip a damaged file.
    """
    check_choice("data.input", input, InputPath, f"choose the input path by what it runs: {_described(INPUT_PATHS)}")
    finishing = {name: on_device.description for name, on_device in AUGMENT_ON.items()}
    check_choice("data.augment_on", augment_on, AugmentOn, f"choose where to finish: {_described(finishing)}")
    if augment_on == "device_randaugment":
        check_device_randaugment(input, auto_augment)
    if input != "dali":
        return
    if builtin is not None:
        raise OptionError(
            f"data.input=dali reads an ImageFolder root (root/train/<class>/*.JPEG), not builtin={builtin!r}; set "
            f"data.root, or use {WORKER_PATHS} for the built-in digits."
        )
    if auto_augment:
        check_dali_policy(auto_augment)
    elif color_jitter:
        raise OptionError(
            f"data.color_jitter={color_jitter} with auto_augment=None: the DALI path has no mirror of timm's "
            f"ColorJitter; set data.color_jitter=0 or use {WORKER_PATHS}."
        )
    if augment_on != "device":
        raise OptionError(
            f"data.augment_on={augment_on} keeps float conversion and random erasing in the DataLoader workers, "
            f"which the DALI path does not have (it always finishes on the device); set data.augment_on=device or "
            f"use {WORKER_PATHS}."
        )
    if bad_files == "skip":
        raise OptionError(
            "data.bad_files=skip needs DataLoader workers: DALI decodes inside its own pipeline, where a damaged file "
            f"cannot be replaced; run `vision-cls check-data` first and keep bad_files=error, or use {WORKER_PATHS}."
        )


def _described(descriptions: dict[str, str]) -> str:
    """``'a' (what a does), 'b' (what b does)`` for an error message."""
    return ", ".join(f"{name!r} ({what})" for name, what in descriptions.items())


def check_dali_policy(auto_augment: str) -> None:
    """Refuse a ``data.auto_augment`` that the DALI path has no mirror of: it runs timm's ``rand-...`` policies."""
    try:
        parse_rand_augment(auto_augment)
    except OptionError as error:
        raise OptionError(
            f"data.input=dali mirrors timm's RandAugment only, and {str(error).rstrip('.')}; use data.input=turbo "
            "(the default) or data.input=timm for other policies."
        ) from None


def check_device_randaugment(input: str, auto_augment: str | None) -> None:
    """Refuse ``augment_on=device_randaugment`` where there is no worker RandAugment to move to the device."""
    if input == "dali":
        raise OptionError(
            "data.augment_on=device_randaugment moves RandAugment out of the DataLoader workers, and data.input=dali "
            "has none: DALI runs RandAugment in its own pipeline, on the GPU. Set data.augment_on=device, or use "
            f"{WORKER_PATHS}."
        )
    if not auto_augment or not auto_augment.startswith("rand"):
        raise OptionError(
            f"data.augment_on=device_randaugment runs timm's RandAugment (a 'rand-...' policy such as DeiT's "
            f"'rand-m9-mstd0.5-inc1') on the device, but data.auto_augment={auto_augment!r}; set such a policy, or "
            "data.augment_on=device."
        )
