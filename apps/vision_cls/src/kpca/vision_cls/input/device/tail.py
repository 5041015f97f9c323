"""The batched tail of DeiT's training transform, run on the device after transfer: uint8 -> float, random erasing.

With ``data.train.augment_on: device`` (or ``device_randaugment``, which adds RandAugment before) the workers stop at
uint8 (3, H, W) tensors (4x fewer bytes to collate, pin and copy) and skip the per-image float conversion and erasing,
as timm's ``PrefetchLoader`` does on the GPU. Mixup/CutMix already run batched on the device
(:class:`~kpca.vision_cls.module.ClassificationModule`).

Legend: B batch, C channels (3), H x W image, A erasing attempts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from kpca.training.choices import check_choice
from kpca.vision_cls.input.device.rand_augment import BatchRandAugment
from kpca.vision_cls.input.options import MEAN, STD, ErasingMode, Interpolation, TrainData
from kpca.vision_cls.input.policy import timm_train_hparams

ERASING_ATTEMPTS = 10  # timm's RandomErasing tries this many boxes before giving up on an image

# ToTensor's value for every uint8 level, computed once on the CPU as ToTensor does (float32(v) / 255), so the
# device path gives bit-identical floats whatever the device's division does.
_UINT8_TO_UNIT = torch.arange(256, dtype=torch.float32).div(255)  # (256,)


def uint8_to_unit(images: Tensor) -> Tensor:
    """uint8 images (any shape) -> float32 in [0, 1], bit-identical to ``torchvision.transforms.ToTensor``."""
    if images.dtype != torch.uint8:
        raise TypeError(f"uint8_to_unit expects uint8 images, got {images.dtype}; float images are already converted.")
    return _UINT8_TO_UNIT.to(images.device)[images.int()]


class BatchRandomErasing:
    """:class:`~kpca.vision_cls.input.workers.random_erasing.PixelSpaceRandomErasing` for a whole batch, on its device.

    Per image, the same distribution as timm's ``RandomErasing`` with one box (DeiT's setting): erase with
    ``probability``; try up to 10 boxes of area ``U(min_area, max_area) * H * W`` and aspect ``exp(U(log min_aspect,
    log 1/min_aspect))``, sides rounded (half to even, like Python's ``round``), and keep the first that fits strictly
    inside the image (none fits: no erasing); its top-left corner is uniform over the positions that fit. The fill is
    DeiT's normalised-space noise mapped to pixel space, ``mean + std * z``, with z ~ N(0, 1) per pixel (``"pixel"``),
    per channel (``"rand"``) or z = 0 (``"const"``), not clipped. Random numbers come from torch's generator of the
    batch's device instead of Python's ``random``, so the draws differ, not their distribution.

    Args:
        probability: Probability of erasing an image.
        mean: Per-channel normalisation mean of the model.
        std: Per-channel normalisation std of the model.
        mode: Fill mode, as timm's ``RandomErasing``: ``"pixel"``, ``"rand"`` or ``"const"``.
        min_area: Smallest box area, as a fraction of the image (timm: 0.02).
        max_area: Largest box area, as a fraction of the image (timm: 1/3).
        min_aspect: Smallest box aspect ratio h / w; the largest is its inverse (timm: 0.3).
    """

    def __init__(
        self,
        probability: float,
        mean: Sequence[float],
        std: Sequence[float],
        mode: ErasingMode = "pixel",
        min_area: float = 0.02,
        max_area: float = 1 / 3,
        min_aspect: float = 0.3,
    ) -> None:
        check_choice("mode", mode, ErasingMode, "choose one of timm's RandomErasing modes")
        self.probability = probability
        self.mode = mode
        self.area_range = (min_area, max_area)
        self.log_aspect_range = (math.log(min_aspect), math.log(1 / min_aspect))
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)  # (1, C, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)  # (1, C, 1, 1)

    def boxes(self, batch: int, height: int, width: int, device: torch.device) -> tuple[Tensor, ...]:
        """Draw one box per image: ``(erase, top, left, box_h, box_w)``, each (B,); ``erase`` is bool."""
        shape = (batch, ERASING_ATTEMPTS)
        area = torch.empty(shape, device=device).uniform_(*self.area_range) * (height * width)  # (B, A)
        aspect = torch.empty(shape, device=device).uniform_(*self.log_aspect_range).exp()  # (B, A)
        box_h = torch.sqrt(area * aspect).round()  # (B, A)
        box_w = torch.sqrt(area / aspect).round()  # (B, A)
        fits = (box_h < height) & (box_w < width)  # (B, A)
        first = fits.int().argmax(dim=1, keepdim=True)  # (B, 1): the first attempt that fits
        box_h = box_h.gather(1, first).squeeze(1)  # (B,)
        box_w = box_w.gather(1, first).squeeze(1)  # (B,)
        erase = (torch.rand(batch, device=device) < self.probability) & fits.any(dim=1)  # (B,)
        top = _uniform_integer(height - box_h + 1)  # (B,) in [0, H - box_h]
        left = _uniform_integer(width - box_w + 1)  # (B,) in [0, W - box_w]
        return erase, top, left, box_h, box_w

    def __call__(self, images: Tensor) -> Tensor:
        """Erase boxes of (B, C, H, W) float pixel-space images; returns a new tensor."""
        batch, channels, height, width = images.shape
        erase, top, left, box_h, box_w = self.boxes(batch, height, width, images.device)
        rows = torch.arange(height, device=images.device)  # (H,)
        cols = torch.arange(width, device=images.device)  # (W,)
        in_rows = (rows >= top[:, None]) & (rows < (top + box_h)[:, None])  # (B, H)
        in_cols = (cols >= left[:, None]) & (cols < (left + box_w)[:, None])  # (B, W)
        mask = erase[:, None, None, None] & in_rows[:, None, :, None] & in_cols[:, None, None, :]  # (B, 1, H, W)
        fill = self.mean.to(images) + self.std.to(images) * self._noise(images, batch, channels)  # (B, C, H|1, W|1)
        return torch.where(mask, fill, images)

    def _noise(self, images: Tensor, batch: int, channels: int) -> Tensor:
        """DeiT's normalised-space fill z: (B, C, H, W) per pixel, (B, C, 1, 1) per channel, or zeros."""
        if self.mode == "pixel":
            return torch.randn_like(images)
        if self.mode == "rand":
            return torch.randn(batch, channels, 1, 1, dtype=images.dtype, device=images.device)
        return torch.zeros(1, channels, 1, 1, dtype=images.dtype, device=images.device)

    def __repr__(self) -> str:
        """Show the probability and fill mode."""
        return f"{type(self).__name__}(p={self.probability}, mode={self.mode})"


def _uniform_integer(counts: Tensor) -> Tensor:
    """One integer uniform in ``[0, count)`` per entry of the float tensor ``counts`` (B,), as float (B,)."""
    draws = torch.rand(counts.shape, device=counts.device) * counts  # (B,)
    return draws.floor().clamp_max(counts - 1)


class DeviceTail:
    """The device tail of the training transform: what ``data.train.augment_on`` moved out of the workers, batched.

    RandAugment where it moved here, then uint8 -> float in [0, 1] and random erasing where those moved here; nothing
    with ``augment_on: workers``, whose batches arrive finished.

    Args:
        rand_augment: The batched RandAugment (:class:`~kpca.vision_cls.input.device.rand_augment.BatchRandAugment`,
            uint8 -> uint8), or None where the workers run it.
        to_float: Whether batches arrive as uint8 and are converted here.
        erasing: The batched eraser, or None (random erasing off, or run by the workers).
    """

    def __init__(
        self,
        rand_augment: Callable[[Tensor], Tensor] | None = None,
        to_float: bool = True,
        erasing: BatchRandomErasing | None = None,
    ) -> None:
        self.rand_augment = rand_augment
        self.to_float = to_float
        self.erasing = erasing

    @classmethod
    def from_options(cls, train: TrainData, image_size: int, interpolation: Interpolation) -> DeviceTail:
        """The tail of ``train.augment_on`` (:data:`kpca.vision_cls.input.options.AUGMENT_ON`) at ``image_size``."""
        on_device = train.on_device
        rand_augment = None
        if on_device.rand_augment:
            hparams = timm_train_hparams(image_size, MEAN, interpolation)
            rand_augment = BatchRandAugment(train.auto_augment, hparams)
        erasing = None
        if on_device.float_and_erasing and train.re_prob > 0:
            erasing = BatchRandomErasing(train.re_prob, MEAN, STD, mode=train.re_mode)
        return cls(rand_augment, on_device.float_and_erasing, erasing)

    def __call__(self, images: Tensor) -> Tensor:
        """(B, C, H, W) training batch -> (B, C, H, W) float32 pixel-space images, finished as the recipe says."""
        if self.rand_augment is not None:
            images = self.rand_augment(images)  # (B, C, H, W) uint8
        if self.to_float:
            images = uint8_to_unit(images)  # (B, C, H, W) float32
        return images if self.erasing is None else self.erasing(images)

    def __repr__(self) -> str:
        """Show the stages."""
        return (
            f"{type(self).__name__}(rand_augment={self.rand_augment!r}, to_float={self.to_float}, "
            f"erasing={self.erasing!r})"
        )
