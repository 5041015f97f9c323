"""DeiT's random erasing per image, in pixel space: the workers' eraser (``data.train.augment_on: workers``).

The batched eraser of ``data.train.augment_on: device`` is
:class:`kpca.vision_cls.input.device.tail.BatchRandomErasing`.

Legend: H x W image.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.data.random_erasing import RandomErasing
from torch import Tensor

from kpca.vision_cls.input.options import ErasingMode


class PixelSpaceRandomErasing:
    """timm's ``RandomErasing`` for pixel-space images, with the fill DeiT draws in normalised space.

    DeiT erases *normalised* images and fills the box with z ~ N(0, 1) per pixel (mode ``"pixel"``), per channel
    (``"rand"``) or z = 0 (``"const"``). Our images are normalised later, inside the model, so the same fill in pixel
    space is ``mean + std * z`` per channel. It is not clipped (it leaves [0, 1] on purpose): after the model's
    normalisation the erased box holds exactly timm's values. The boxes are drawn by timm's own ``RandomErasing`` (same
    parameters, same random calls) on a NaN canvas; the pixels it filled are copied, mapped to pixel space, into the
    image, and the other pixels are left untouched.

    Args:
        probability: Probability of erasing an image.
        mean: Per-channel normalisation mean of the model.
        std: Per-channel normalisation std of the model.
        mode: Fill mode of timm's ``RandomErasing``: ``"pixel"``, ``"rand"`` or ``"const"``.
        max_count: Maximum number of boxes per image.
    """

    def __init__(
        self,
        probability: float,
        mean: Sequence[float],
        std: Sequence[float],
        mode: ErasingMode = "pixel",
        max_count: int = 1,
    ) -> None:
        self.erasing = RandomErasing(probability, mode=mode, max_count=max_count, device="cpu")
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)  # (3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)  # (3, 1, 1)

    def __call__(self, image: Tensor) -> Tensor:
        """Erase boxes of a (3, H, W) float image in [0, 1]; returns a new tensor."""
        canvas = self.erasing(torch.full_like(image, float("nan")))  # (3, H, W): NaN where not erased
        erased = ~torch.isnan(canvas)
        return torch.where(erased, self.mean + self.std * canvas, image)

    def __repr__(self) -> str:
        """Show the wrapped timm transform."""
        return f"{type(self).__name__}({self.erasing!r})"
