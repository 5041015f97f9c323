"""Built-in data: scikit-learn's handwritten digits written once as an ImageFolder tree (no download)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image

from kpca.training.files import write_tree_atomic

DIGITS_CLASSES = [str(d) for d in range(10)]
_DIGITS_MARKER = ".kpca-digits-complete"


def write_digits_imagefolder(root: Path, image_size: int = 32) -> Path:
    """Write scikit-learn's handwritten digits as an ImageFolder tree, once.

    ``load_digits()`` holds 1797 8×8 images with values 0-16 in 10 classes. They are split 80/20, stratified, with a
    fixed seed, scaled to uint8, upscaled to ``image_size`` (bicubic), made 3-channel and written as
    ``root/train/<0..9>/<index>.png`` and ``root/val/<0..9>/<index>.png`` (``index`` into ``load_digits()``). The tree
    is written into a temporary folder beside ``root`` and renamed into place, so a crash never leaves half a tree;
    when ``root`` already holds a complete tree, nothing is written.

    Args:
        root: Folder to create.
        image_size: Side of the written square images, in pixels.

    Returns:
        ``root``.

    Raises:
        ValueError: If ``root`` exists but is not a complete digits tree.
    """
    root = Path(root)
    if (root / _DIGITS_MARKER).is_file():
        return root
    from sklearn.datasets import load_digits  # imported here: scikit-learn is slow to import and only needed once
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    indices = np.arange(len(digits.target))
    train, val = train_test_split(indices, test_size=0.2, stratify=digits.target, random_state=0)

    def write(tmp: Path) -> None:
        for split, split_indices in (("train", train), ("val", val)):
            for label in DIGITS_CLASSES:
                (tmp / split / label).mkdir(parents=True)
            for i in split_indices:
                pixels = np.round(digits.images[i] * (255.0 / 16.0)).astype(np.uint8)  # (8, 8)
                image = Image.fromarray(pixels).resize((image_size, image_size), Image.Resampling.BICUBIC)
                image.convert("RGB").save(tmp / split / str(digits.target[i]) / f"{i:04d}.png")

    if not write_tree_atomic(root, _DIGITS_MARKER, write, what="digits tree"):
        return root
    rank_zero_info(f"Wrote the digits tree ({len(train)} train, {len(val)} val images, {image_size}px) to {root}")
    return root
