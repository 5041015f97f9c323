"""The training input path of ImageNetDataModule: files in, training images on the device out.

``data.input`` names the path and ``data.augment_on`` where its transform finishes. :func:`build_train_input` turns
the checked options into one :class:`TrainInput` (``setup``, ``loader``, ``device_tail``), the only thing the
datamodule holds of the path. The folder shows the split:

* :mod:`.options`: the path's options (:class:`TrainOptions`) and the one check of them.
* :mod:`.policy`: timm's RandAugment policy (op -> level -> argument) and Pillow's constants, read by every executor.
* :mod:`.train_input`: what every path offers (:class:`TrainInput`).
* :mod:`.workers`: the DataLoader workers' path (``turbo`` and ``timm``).
* :mod:`.device`: the batched tail after transfer (float conversion, random erasing, RandAugment where it moved).
* :mod:`.dali`: the DALI path (``input: dali``); only its ``graph`` and ``loader`` import ``nvidia.dali``, lazily.
* :mod:`.samplers`: DeiT's repeated-augmentation sampler, and the sampler of the DALI loader.

Evaluation loaders never take these paths: they decode with PIL and resize and crop per image.
"""

from kpca.vision_cls.input.dali.train_input import DaliInput
from kpca.vision_cls.input.options import AugmentOn, ErasingMode, InputPath, Interpolation, TrainOptions
from kpca.vision_cls.input.train_input import TrainInput
from kpca.vision_cls.input.workers.train_input import WorkerInput

__all__ = ["AugmentOn", "ErasingMode", "InputPath", "Interpolation", "TrainInput", "TrainOptions", "build_train_input"]


def build_train_input(options: TrainOptions) -> TrainInput:
    """The training input path ``options.input`` names: DALI's, or the DataLoader workers'.

    Raises:
        ImportError: ``data.input=dali`` without NVIDIA DALI; the message gives the install command.
    """
    return DaliInput(options) if options.input == "dali" else WorkerInput(options)
