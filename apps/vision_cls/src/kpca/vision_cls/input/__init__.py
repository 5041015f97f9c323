"""The training input path of ImageNetDataModule: files in, training images on the device out.

``data.train.input`` names the path and ``data.train.augment_on`` where its transform finishes.
:func:`build_train_input` turns the checked ``data.train`` group (:class:`TrainData`) and the image size and
interpolation it shares with evaluation into one :class:`TrainInput` (``setup``, ``loader``, ``device_tail``), the only
thing the datamodule holds of the path. The folder shows the split:

* :mod:`.options`: the path's options (:class:`TrainData`, the ``data.train`` group) and the one check of them.
* :mod:`.policy`: timm's RandAugment policy (op -> level -> argument) and Pillow's constants, read by every executor.
* :mod:`.train_input`: what every path offers (:class:`TrainInput`).
* :mod:`.workers`: the DataLoader workers' path (``turbo`` and ``timm``).
* :mod:`.device`: the batched tail after transfer (float conversion, random erasing, RandAugment where it moved).
* :mod:`.dali`: the DALI path (``data.train.input: dali``); only its ``graph`` and ``loader`` import ``nvidia.dali``,
  lazily.
* :mod:`.samplers`: DeiT's repeated-augmentation sampler, and the sampler of the DALI loader.

Evaluation loaders never take these paths: they decode with PIL and resize and crop per image.
"""

from kpca.training.choices import check_choice
from kpca.vision_cls.input.dali.train_input import DaliInput
from kpca.vision_cls.input.options import (
    AugmentOn,
    ErasingMode,
    InputPath,
    Interpolation,
    TrainData,
    check_input_source,
)
from kpca.vision_cls.input.train_input import TrainInput
from kpca.vision_cls.input.workers.train_input import WorkerInput

__all__ = ["AugmentOn", "ErasingMode", "InputPath", "Interpolation", "TrainData", "TrainInput", "build_train_input"]


def build_train_input(
    train: TrainData, *, builtin: str | None, image_size: int, interpolation: Interpolation
) -> TrainInput:
    """The training input path ``train.input`` names: DALI's, or the DataLoader workers'.

    Args:
        train: The checked ``data.train`` group.
        builtin: ``data.builtin``, refused with the DALI path (:func:`~.options.check_input_source`).
        image_size: ``data.image_size``, the side of the square training crop in pixels.
        interpolation: ``data.interpolation``, the resampling filter of the crop and of RandAugment.

    Raises:
        OptionError: ``data.interpolation`` is not one of :data:`Interpolation`, or DALI is asked for built-in data.
        ImportError: ``data.train.input=dali`` without NVIDIA DALI; the message gives the install command.
    """
    check_choice("data.interpolation", interpolation, Interpolation)
    check_input_source(train.input, builtin)
    path = DaliInput if train.input == "dali" else WorkerInput
    return path(train, image_size, interpolation)
