"""The ``data.train`` option group: the options of the training input path, and the one check of them.

In a config file::

    data:
      train:
        input: turbo
        augment_on: device
        re_prob: 0.25

and on the command line ``--data.train.re_prob=0.1``.

* ``data.train.input``: which code turns files into training images. ``turbo`` (the default): DataLoader workers
  decode with libjpeg-turbo (``simplejpeg``) and crop, resize and flip with torch
  (:mod:`kpca.vision_cls.input.workers`). ``timm``: DataLoader workers run timm's own PIL transform, bit-identical to
  timm: the reference the other paths are measured against. ``dali``: NVIDIA DALI reads, decodes and augments
  (:mod:`kpca.vision_cls.input.dali`).
* ``data.train.augment_on``: where the training transform finishes (:data:`AUGMENT_ON`, the one table of what each
  value moves to the device). ``device`` (the default): the loader hands over uint8 images, converted to float and
  randomly erased batched on the device after transfer. ``workers``: the DataLoader workers do both per image.
  ``device_randaugment``: the workers stop after crop and flip, and timm's RandAugment also runs batched on the
  device, before the float conversion and erasing (timm's policy and Pillow's pixels, other random draws).

:class:`TrainData` holds the group and checks it when built: :func:`check_input_options` refuses every combination
the paths cannot run. The path also reads ``data.image_size`` and ``data.interpolation``, which evaluation shares,
and is refused with ``data.builtin`` where it needs a folder (:func:`check_input_source`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.data.auto_augment import augment_and_mix_transform, auto_augment_transform, rand_augment_transform

from kpca.training.choices import check_choice, keyed_by_choices
from kpca.training.data_checks.bad_files import BadFilesMode, check_bad_files_options
from kpca.training.errors import OptionError
from kpca.vision_cls.data_checks import TRAIN_GROUP
from kpca.vision_cls.input.policy import parse_rand_augment

InputPath = Literal["turbo", "timm", "dali"]
AugmentOn = Literal["device", "workers", "device_randaugment"]
ErasingMode = Literal["pixel", "rand", "const"]
"""timm's random erasing fills (``data.train.re_mode``): per-pixel normal noise, one normal colour per box, or zero."""
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
    """What one ``data.train.augment_on`` value moves from the DataLoader workers to the batched device tail.

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
WORKER_PATHS = "data.train.input=turbo (the default) or data.train.input=timm"


MEAN: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN
"""Per-channel mean the model normalises with (timm's ImageNet values): RandAugment's fill, erasing's space."""
STD: tuple[float, float, float] = IMAGENET_DEFAULT_STD
"""Per-channel std the model normalises with (timm's ImageNet values)."""


@dataclass(frozen=True)
class TrainData:
    """The training input of the ``fit`` stage: which path reads the training set, and DeiT's augmentation.

    Checked when built: each refusal is an :class:`~kpca.training.errors.OptionError` naming the option
    (``data.train.<name>``), the value and the fix (:func:`check_input_options` for the combinations; the one with
    ``data.builtin`` is :func:`check_input_source`'s, when the path is built).

    Args:
        input: The training input path. ``"turbo"``: DataLoader workers decode with libjpeg-turbo (``simplejpeg``;
            PIL for non-JPEG, CMYK or damaged files), crop, resize and flip uint8 tensors with torch, and run timm's
            RandAugment with its slow ops compiled (:mod:`kpca.vision_cls.input.workers.turbo`): the same random
            draws, pixels within interpolation noise of timm's, about twice the images/s per core. ``"timm"``:
            DataLoader workers run timm's PIL transform exactly, for bit-exact reproduction (the reference).
            ``"dali"``: NVIDIA DALI (:mod:`kpca.vision_cls.input.dali`, the extra
            ``pip install 'kpca-vision-cls[dali]'``) reads, decodes (nvJPEG on a GPU trainer, CPU operators
            otherwise), crops, resizes, flips and RandAugments in ``data.num_workers`` threads, in the order of the
            sampler the workers would have; it needs ``data.root`` (not ``data.builtin``), a ``rand-...`` or no
            ``auto_augment``, ``augment_on="device"`` and ``bad_files="error"``. Evaluation loaders decode with PIL on
            every path.
        augment_on: Where the training transform finishes (:data:`AUGMENT_ON`). ``"device"``: the loader yields
            uint8 (3, H, W) images and the float conversion and random erasing run batched after transfer
            (:mod:`kpca.vision_cls.input.device.tail`, the same distributions). ``"workers"``: the DataLoader workers
            do both per image. Either way the training step sees float32 pixel-space images. With ``re_prob=0`` (the
            digits demo) both give identical batches. ``"device_randaugment"``: the workers stop after crop and flip,
            and timm's RandAugment (a ``rand-...`` ``auto_augment``) runs batched on the device before the float
            conversion and erasing (:mod:`kpca.vision_cls.input.device.rand_augment`: timm's policy and Pillow's
            pixels, drawn from torch's generator instead of Python's ``random``), which takes about a third of the
            workers' CPU time per image off them.
        scale: Area range of timm's random resized crop (DeiT: 0.08-1).
        hflip: Probability of a horizontal flip (DeiT: 0.5; 0 for digits, which flips change).
        auto_augment: timm auto-augment policy (DeiT: ``"rand-m9-mstd0.5-inc1"``); None disables.
        color_jitter: Brightness/contrast/saturation jitter; as in timm it is ignored while ``auto_augment`` is set.
        re_prob: Random-erasing probability (DeiT: 0.25); 0 disables.
        re_mode: Random-erasing fill, drawn in normalised space as in timm
            (:class:`~kpca.vision_cls.input.workers.random_erasing.PixelSpaceRandomErasing`).
        repeated_aug: Copies of each training sample per epoch spread over the ranks (DeiT: 3); 1 disables.
        bad_files: What a damaged training image does: ``error`` stops the fit with an error naming the file (the
            default); ``skip`` trains on the next image instead, logs each damaged file once as a WARNING and counts
            them (``data/bad_files`` in TensorBoard and the HParams summary). Evaluation sets never skip. The
            ``check-data`` subcommand lists every damaged file before a run.
        max_bad_fraction: With ``bad_files=skip``, the fit stops with an error once more than this fraction of the
            training set is damaged (default 0.001: 1,281 ImageNet images).
    """

    input: InputPath = "turbo"
    augment_on: AugmentOn = "device"
    scale: tuple[float, float] = (0.08, 1.0)
    hflip: float = 0.5
    auto_augment: str | None = "rand-m9-mstd0.5-inc1"
    color_jitter: float = 0.3
    re_prob: float = 0.25
    re_mode: ErasingMode = "pixel"
    repeated_aug: int = 3
    bad_files: BadFilesMode = "error"
    max_bad_fraction: float = 0.001

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", tuple(self.scale))  # a list from Python callers
        if not 0.0 < self.scale[0] <= self.scale[1] <= 1.0:
            raise OptionError(f"data.train.scale={self.scale!r} must satisfy 0 < low <= high <= 1 (DeiT: (0.08, 1.0))")
        if not 0.0 <= self.hflip <= 1.0:
            raise OptionError(f"data.train.hflip={self.hflip} must be a probability in [0, 1]")
        if not 0.0 <= self.re_prob <= 1.0:
            raise OptionError(
                f"data.train.re_prob={self.re_prob} must be a probability in [0, 1]; 0 disables random erasing."
            )
        check_choice("data.train.re_mode", self.re_mode, ErasingMode, "choose one of timm's RandomErasing fills")
        if self.repeated_aug < 1:
            raise OptionError(
                f"data.train.repeated_aug={self.repeated_aug} must be at least 1; 1 disables repeated augmentation."
            )
        if self.color_jitter < 0:
            raise OptionError(f"data.train.color_jitter={self.color_jitter} must be 0 (none) or more (DeiT: 0.3)")
        if self.auto_augment is not None:
            check_timm_policy(self.auto_augment)
        check_bad_files_options(self.bad_files, self.max_bad_fraction, TRAIN_GROUP)
        check_input_options(
            self.input,
            self.augment_on,
            auto_augment=self.auto_augment,
            color_jitter=self.color_jitter,
            bad_files=self.bad_files,
        )

    @property
    def on_device(self) -> OnDevice:
        """What ``augment_on`` moves to the device (:data:`AUGMENT_ON`)."""
        return AUGMENT_ON[self.augment_on]


def check_timm_policy(policy: str) -> None:
    """Refuse an ``auto_augment`` string that timm's transforms cannot build (they assert on the first image).

    Built as timm's ``transforms_imagenet_train`` does: ``rand-...`` RandAugment, ``augmix-...`` AugMix, otherwise
    an AutoAugment policy by name.

    Raises:
        OptionError: naming ``data.train.auto_augment``, timm's reason and the accepted forms.
    """
    params = {"translate_const": 100, "img_mean": (124, 116, 104)}
    if policy.startswith("rand"):
        build = rand_augment_transform
    elif policy.startswith("augmix"):
        build = augment_and_mix_transform
    else:
        build = auto_augment_transform
    try:
        build(policy, params)
    except (AssertionError, ValueError, KeyError, IndexError) as error:
        raise OptionError(
            f"data.train.auto_augment={policy!r} is no timm policy ({error or type(error).__name__}); use "
            "'rand-m9-mstd0.5-inc1' (DeiT), another 'rand-...', 'augmix-...', 'original', 'v0', or null for none"
        ) from error


def check_input_source(input: InputPath, builtin: str | None) -> None:
    """Refuse ``data.train.input=dali`` with ``data.builtin``: DALI reads an ImageFolder root only."""
    if input == "dali" and builtin is not None:
        raise OptionError(
            f"data.train.input=dali reads an ImageFolder root (root/train/<class>/*.JPEG), not "
            f"data.builtin={builtin!r}; set data.root, or use {WORKER_PATHS} for the built-in digits."
        )


def check_input_options(
    input: InputPath,
    augment_on: AugmentOn,
    *,
    auto_augment: str | None,
    color_jitter: float,
    bad_files: str,
) -> None:
    """Refuse a training input path that cannot run with the other data options.

    Each refusal is a ValueError naming the value and the fix. DALI being importable is checked when the DALI path is
    built (:func:`kpca.vision_cls.input.dali.loader.require_dali`), after these checks.

    Args:
        input: ``data.train.input``: ``"turbo"``, ``"timm"`` or ``"dali"``.
        augment_on: ``data.train.augment_on``: ``"device"``, ``"workers"`` or ``"device_randaugment"``.
        auto_augment: ``data.train.auto_augment``; DALI mirrors timm's ``rand-...`` policies only.
        color_jitter: ``data.train.color_jitter``; as in timm it only acts without ``auto_augment``, and DALI has no
            mirror of timm's ColorJitter.
        bad_files: ``data.train.bad_files``; DALI cannot skip a damaged file.
    """
    check_choice(
        "data.train.input", input, InputPath, f"choose the input path by what it runs: {_described(INPUT_PATHS)}"
    )
    finishing = {name: on_device.description for name, on_device in AUGMENT_ON.items()}
    check_choice("data.train.augment_on", augment_on, AugmentOn, f"choose where to finish: {_described(finishing)}")
    if augment_on == "device_randaugment":
        check_device_randaugment(input, auto_augment)
    if input != "dali":
        return
    if auto_augment:
        check_dali_policy(auto_augment)
    elif color_jitter:
        raise OptionError(
            f"data.train.color_jitter={color_jitter} with auto_augment=None: the DALI path has no mirror of timm's "
            f"ColorJitter; set data.train.color_jitter=0 or use {WORKER_PATHS}."
        )
    if augment_on != "device":
        raise OptionError(
            f"data.train.augment_on={augment_on} keeps float conversion and random erasing in the DataLoader "
            "workers, which the DALI path does not have (it always finishes on the device); set "
            f"data.train.augment_on=device or use {WORKER_PATHS}."
        )
    if bad_files == "skip":
        raise OptionError(
            "data.train.bad_files=skip needs DataLoader workers: DALI decodes inside its own pipeline, where a damaged "
            "file cannot be replaced; run `vision-cls check-data` first and keep data.train.bad_files=error, or use "
            f"{WORKER_PATHS}."
        )


def _described(descriptions: dict[str, str]) -> str:
    """``'a' (what a does), 'b' (what b does)`` for an error message."""
    return ", ".join(f"{name!r} ({what})" for name, what in descriptions.items())


def check_dali_policy(auto_augment: str) -> None:
    """Refuse a ``data.train.auto_augment`` that DALI has no mirror of: it runs timm's ``rand-...`` policies only."""
    try:
        parse_rand_augment(auto_augment)
    except OptionError as error:
        raise OptionError(
            f"data.train.input=dali mirrors timm's RandAugment only, and {str(error).rstrip('.')}; use "
            "data.train.input=turbo (the default) or data.train.input=timm for other policies."
        ) from None


def check_device_randaugment(input: str, auto_augment: str | None) -> None:
    """Refuse ``data.train.augment_on=device_randaugment`` where there is no worker RandAugment to move there."""
    if input == "dali":
        raise OptionError(
            "data.train.augment_on=device_randaugment moves RandAugment out of the DataLoader workers, and "
            "data.train.input=dali has none: DALI runs RandAugment in its own pipeline, on the GPU. Set "
            f"data.train.augment_on=device, or use {WORKER_PATHS}."
        )
    if not auto_augment or not auto_augment.startswith("rand"):
        raise OptionError(
            f"data.train.augment_on=device_randaugment runs timm's RandAugment (a 'rand-...' policy such as DeiT's "
            f"'rand-m9-mstd0.5-inc1') on the device, but data.train.auto_augment={auto_augment!r}; set such a policy, "
            "or data.train.augment_on=device."
        )
