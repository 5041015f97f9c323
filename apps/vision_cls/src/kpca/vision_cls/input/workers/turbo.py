"""The workers' turbo training transform (``data.train.input: turbo``): libjpeg-turbo decode, torch crop and resize.

timm's DeiT transform decodes with PIL and crops, resizes and flips PIL images. The turbo path draws the same random
numbers from the same generators in the same order, and changes only how the pixels are computed:

* decode: ``simplejpeg`` (libjpeg-turbo with the accurate integer DCT and fancy upsampling, as Pillow's decoder),
  bit-identical to ``PIL.Image.open(...).convert("RGB")`` on YCbCr and grayscale JPEGs. Everything else (PNG or GIF
  under a .JPEG name, CMYK JPEGs, truncated files, anything libjpeg-turbo refuses) goes to PIL, as before.
* crop and resize: the box comes from timm's own ``RandomResizedCropAndInterpolation.get_params`` (Python's
  ``random``); the pixels from ``torch.nn.functional.interpolate`` on channels-last uint8 with antialiasing, which
  implements Pillow's resampling filters: bicubic and bilinear at most 1 grey level from PIL's result, mean well
  under 0.01; nearest equal, except that when upsampling, a sample exactly halfway between two pixels may take the
  other one.
* flip: ``torch.rand(1) < p`` as torchvision's ``RandomHorizontalFlip``, applied to the tensor.

The remaining stages (RandAugment, or colour jitter) are timm's own objects, run on a PIL image made from the
224 x 224 crop; RandAugment's slow ops (rotations, shears, translations, sharpness, contrast, colour, brightness)
compute their pixels with compiled copies of Pillow's loops (:mod:`kpca.vision_cls.input.workers.compiled_rand_augment`,
bit-identical).

Legend: H x W decoded image, h x w crop box, S output side, C channels (3).
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Sequence

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data.auto_augment import RandAugment
from timm.data.transforms import RandomResizedCropAndInterpolation, interp_mode_to_str
from torch import Tensor
from torchvision import transforms
from torchvision.transforms import InterpolationMode

from kpca.training.errors import OptionError
from kpca.vision_cls.input.workers.compiled_rand_augment import with_compiled_ops

# Pillow's filter for each mode timm may pick, as torch names it: "nearest-exact" samples pixel centres as PIL does.
TORCH_INTERPOLATION = {
    InterpolationMode.BICUBIC: "bicubic",
    InterpolationMode.BILINEAR: "bilinear",
    InterpolationMode.NEAREST: "nearest-exact",
}
TURBO_COLORSPACES = ("YCbCr", "Gray")  # decoded bit-identically to PIL; CMYK differs by a level and goes to PIL


def read_image_bytes(path: str) -> bytes:
    """The ImageFolder loader of the turbo path: the file's bytes, decoded later by :class:`DecodeRGB`."""
    with open(path, "rb") as file:
        return file.read()


def decode_rgb(data: bytes) -> np.ndarray:
    """Decode an image file's bytes to (H, W, 3) uint8 RGB, equal to ``Image.open(...).convert("RGB")``.

    YCbCr and grayscale JPEGs are decoded by libjpeg-turbo (``simplejpeg``), anything else by PIL, which also raises
    its usual error for files that are not images or are damaged.
    """
    if simplejpeg.is_jpeg(data):
        try:
            colorspace = simplejpeg.decode_jpeg_header(data)[2]
            if colorspace in TURBO_COLORSPACES:
                return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False)
        except ValueError:
            pass  # libjpeg-turbo refused it (e.g. corrupt data it is strict about): PIL decodes it or says why not
    with Image.open(io.BytesIO(data)) as image:
        return np.array(image.convert("RGB"))  # (H, W, 3)


class DecodeRGB:
    """Bytes of an image file (or an already decoded PIL image) -> (H, W, 3) uint8 RGB tensor."""

    def __call__(self, image: bytes | Image.Image) -> Tensor:
        """Decode bytes with :func:`decode_rgb`; convert PIL images to RGB."""
        array = decode_rgb(image) if isinstance(image, bytes) else np.array(image.convert("RGB"))
        return torch.from_numpy(array)  # (H, W, 3)

    def __repr__(self) -> str:
        """Name the decoder."""
        return f"{type(self).__name__}(simplejpeg for YCbCr/gray JPEG, else PIL)"


class TensorRandomResizedCrop:
    """timm's ``RandomResizedCropAndInterpolation`` on (H, W, 3) uint8 tensors, with torch's antialiased resize.

    Args:
        crop: The timm transform whose size, scale, ratio and interpolation (or random choice of interpolations,
            drawn with ``random.choice`` as timm does) are used.
    """

    def __init__(self, crop: RandomResizedCropAndInterpolation) -> None:
        modes = crop.interpolation if isinstance(crop.interpolation, (tuple, list)) else (crop.interpolation,)
        unsupported = [interp_mode_to_str(mode) for mode in modes if mode not in TORCH_INTERPOLATION]
        if unsupported:
            raise OptionError(
                f"interpolation {unsupported} has no torch resize on the turbo path; use one of bicubic, bilinear, "
                "nearest, or set data.train.input=timm for timm's PIL transform."
            )
        self.crop = crop

    def __call__(self, image: Tensor) -> Tensor:
        """(H, W, 3) uint8 -> (S, S, 3) uint8: timm's random box, resized as PIL resizes it."""
        top, left, height, width = self.crop.get_params(image.permute(2, 0, 1), self.crop.scale, self.crop.ratio)
        mode = self.crop.interpolation
        if isinstance(mode, (tuple, list)):
            mode = random.choice(mode)
        box = image[top : top + height, left : left + width]  # (h, w, 3)
        box = box.permute(2, 0, 1)[None].contiguous(memory_format=torch.channels_last)  # (1, 3, h, w) channels last
        name = TORCH_INTERPOLATION[mode]
        antialias = {"antialias": True} if name != "nearest-exact" else {}
        resized = F.interpolate(box, size=self.crop.size, mode=name, **antialias)  # (1, 3, S, S) channels last
        return resized[0].permute(1, 2, 0)  # (S, S, 3) contiguous

    def __repr__(self) -> str:
        """Show the timm crop it reproduces."""
        return f"{type(self).__name__}({self.crop!r})"


class TensorHorizontalFlip:
    """torchvision's ``RandomHorizontalFlip`` (one ``torch.rand(1)`` draw per image) on (H, W, 3) tensors.

    Args:
        p: Probability of flipping an image.
    """

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, image: Tensor) -> Tensor:
        """(H, W, 3) -> (H, W, 3), mirrored left to right with probability ``p``."""
        return image.flip(1) if torch.rand(1) < self.p else image

    def __repr__(self) -> str:
        """Show the probability."""
        return f"{type(self).__name__}(p={self.p})"


def hwc_to_pil(image: Tensor) -> Image.Image:
    """(H, W, 3) uint8 tensor -> PIL RGB image, for the PIL stages (RandAugment, colour jitter)."""
    return Image.fromarray(image.contiguous().numpy())


def hwc_to_chw(image: Tensor) -> Tensor:
    """(H, W, 3) uint8 tensor -> contiguous (3, H, W), what ``PILToTensor`` returns (numpy transposes 3x faster)."""
    return torch.from_numpy(image.numpy().transpose(2, 0, 1).copy())  # (3, H, W)


def pil_to_chw(image: Image.Image) -> Tensor:
    """PIL RGB image -> contiguous (3, H, W) uint8 tensor, equal to ``PILToTensor`` and about 2x faster."""
    return torch.from_numpy(np.asarray(image).transpose(2, 0, 1).copy())  # (3, H, W)


def turbo_stages(timm_stages: Sequence[Callable]) -> list[Callable]:
    """The turbo equivalent of timm's PIL training stages, ending in a uint8 (3, S, S) tensor.

    Args:
        timm_stages: timm's training stages (``transforms_imagenet_train(..., separate=True)``, primary then
            secondary): a ``RandomResizedCropAndInterpolation``, optionally a ``RandomHorizontalFlip``, then PIL
            stages (RandAugment or colour jitter), kept as they are (RandAugment with its slow ops compiled).

    Returns:
        ``[DecodeRGB, TensorRandomResizedCrop, TensorHorizontalFlip?, hwc_to_pil, *PIL stages, pil_to_chw]``, or
        ``[..., hwc_to_chw]`` when there are no PIL stages. Applied in order to file bytes (or a PIL image).
    """
    crop, *rest = timm_stages
    if not isinstance(crop, RandomResizedCropAndInterpolation):
        raise TypeError(f"the turbo path starts from timm's RandomResizedCropAndInterpolation, got {crop!r}")
    stages: list[Callable] = [DecodeRGB(), TensorRandomResizedCrop(crop)]
    if rest and isinstance(rest[0], transforms.RandomHorizontalFlip):
        stages.append(TensorHorizontalFlip(rest.pop(0).p))
    if not rest:
        return [*stages, hwc_to_chw]
    rest = [with_compiled_ops(stage) if isinstance(stage, RandAugment) else stage for stage in rest]
    return [*stages, hwc_to_pil, *rest, pil_to_chw]
