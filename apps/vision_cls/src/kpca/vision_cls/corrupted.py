"""CorruptedDataset: an image dataset corrupted on the fly with ``imagecorruptions``, reproducibly per item."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset
from torchvision import transforms

from kpca.training.images.corruptions import check_corruptions, corrupt_seeded


class CorruptedDataset(Dataset):
    """Wrap an image dataset and corrupt its images on the fly, reproducibly.

    The base dataset yields ``(image, label)`` with a PIL image (or an (H, W, 3) uint8 array) that is already resized
    and cropped; the corruption runs on the uint8 array and ``transform`` (default ``ToTensor``) follows. The seed of
    item ``index`` is a stable hash of ``(seed, corruption, severity, index)``, so the same item is always corrupted
    the same way, in any worker and any run.

    Args:
        base: Dataset of ``(PIL image or uint8 array, label)``.
        corruption: A name from ``imagecorruptions.get_corruption_names("all")``.
        severity: 1 to 5.
        transform: Applied to the corrupted (H, W, 3) uint8 array; default ``transforms.ToTensor()`` (float in [0, 1]).
        seed: Base seed, mixed into every item's seed.
    """

    def __init__(
        self,
        base: Dataset,
        corruption: str,
        severity: int,
        transform: Callable[[np.ndarray], Tensor] | None = None,
        seed: int = 0,
    ) -> None:
        check_corruptions([corruption], [severity])
        self.base = base
        self.corruption = corruption
        self.severity = severity
        self.transform = transform if transform is not None else transforms.ToTensor()
        self.seed = seed

    def __len__(self) -> int:
        """Length of the base dataset."""
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        """The corrupted, transformed image ``index`` and its label."""
        image, label = self.base[index]
        array = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image, dtype=np.uint8)
        seed = zlib.crc32(f"{self.seed}:{self.corruption}:{self.severity}:{index}".encode())
        return self.transform(corrupt_seeded(array, self.corruption, self.severity, seed)), label
