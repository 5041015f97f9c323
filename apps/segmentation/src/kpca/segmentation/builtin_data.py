"""Built-in data: a synthetic ADE20K of textured shapes, in the real ADE20K folder layout, generated once.

Each image holds a few shapes on a textured background. A shape's class is the pair (outline, texture): 4 outlines
(disc, square, triangle, ring) x 2 textures (stripes, checkerboard) = 8 classes, written as ADE20K labels 1..8
(``wall`` ... ``bed``; the names do not matter). Each class has its own hue (jittered per shape; neighbouring
classes have close hues), so colour, texture and outline all carry the label, and a model learns it in a few
hundred steps. The background is a greyish smooth-noise texture with label 0 ("other"). With
``reduce_zero_label`` (as for ADE20K) the background becomes 255 (ignored) and class k becomes k - 1.

Layout, exactly as ADE20K (``ADEChallengeData2016``)::

    <root>/images/{training,validation}/*.jpg        RGB
    <root>/annotations/{training,validation}/*.png   uint8, 0 = other, 1..150 classes
"""

from __future__ import annotations

import colorsys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image

from kpca.training.errors import OptionError
from kpca.training.files import write_tree_atomic

OUTLINES = ("disc", "square", "triangle", "ring")
TEXTURES = ("stripes", "checker")
NUM_SHAPE_CLASSES = len(OUTLINES) * len(TEXTURES)
SPLITS = {"training": "train", "validation": "val"}
_MARKER = ".kpca-ade20k-synthetic-complete"


@dataclass(frozen=True)
class SyntheticADE20K:
    """Parameters of the synthetic set; :attr:`folder_name` encodes them, so each setting has its own cache folder.

    Attributes:
        num_train: training images.
        num_val: validation images.
        image_size: side of the square images, in pixels.
        max_shapes: at most this many shapes per image (at least 1).
        seed: base seed; the set is a deterministic function of these parameters.
    """

    num_train: int = 400
    num_val: int = 50
    image_size: int = 96
    max_shapes: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.image_size < 32:
            raise OptionError(f"image_size must be >= 32 (corruptions need it), got {self.image_size}")
        if min(self.num_train, self.num_val, self.max_shapes) < 1:
            raise OptionError(f"num_train, num_val and max_shapes must be >= 1, got {asdict(self)}")

    @property
    def folder_name(self) -> str:
        """``ade20k-synthetic-<train>x<val>-<size>px-<shapes>shapes-seed<seed>``."""
        return (
            f"ade20k-synthetic-{self.num_train}x{self.num_val}-{self.image_size}px-"
            f"{self.max_shapes}shapes-seed{self.seed}"
        )


def _texture(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """A (size, size) float pattern in [0, 1]: ``stripes`` (random angle and period), ``checker`` or ``noise``."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)  # (S, S) each
    if kind == "stripes":
        angle, period = rng.uniform(0, np.pi), rng.uniform(5, 9)
        phase = (xx * np.cos(angle) + yy * np.sin(angle)) / period
        return (np.floor(phase) % 2).astype(np.float32)
    if kind == "checker":
        cell = rng.uniform(4, 7)
        return ((np.floor(xx / cell) + np.floor(yy / cell)) % 2).astype(np.float32)
    coarse = rng.random((size // 8 + 2, size // 8 + 2)).astype(np.float32)  # smooth noise: upsampled coarse grid
    return np.asarray(Image.fromarray(coarse).resize((size, size), Image.Resampling.BICUBIC)).clip(0, 1)


def _outline(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """A (size, size) bool mask of one outline with random centre, radius and rotation."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)  # (S, S) each
    radius = rng.uniform(0.14, 0.26) * size
    cy, cx = rng.uniform(radius, size - radius, 2)
    dy, dx = yy - cy, xx - cx
    if kind == "disc":
        return dy**2 + dx**2 <= radius**2
    if kind == "ring":
        dist = np.sqrt(dy**2 + dx**2)
        return (dist <= radius) & (dist >= 0.55 * radius)
    angle = rng.uniform(0, np.pi / 2)
    u, v = dx * np.cos(angle) + dy * np.sin(angle), -dx * np.sin(angle) + dy * np.cos(angle)
    if kind == "square":
        return (np.abs(u) <= 0.8 * radius) & (np.abs(v) <= 0.8 * radius)
    # Triangle: inside three half-planes 120 degrees apart.
    normals = [(np.cos(a), np.sin(a)) for a in (np.pi / 2, np.pi / 2 + 2 * np.pi / 3, np.pi / 2 + 4 * np.pi / 3)]
    return np.all([u * nx + v * ny <= 0.5 * radius for nx, ny in normals], axis=0)


def _colours(rng: np.random.Generator, cls: int | None) -> np.ndarray:
    """The (2, 3) RGB colours in [0, 1] of a texture's two phases: class ``cls``'s jittered hue, or greys (None)."""
    if cls is None:
        grey = rng.uniform(0.2, 0.8)
        return np.clip(grey + rng.uniform(-0.25, 0.25, (2, 1)) + rng.uniform(-0.05, 0.05, (2, 3)), 0, 1)
    hue = (cls / NUM_SHAPE_CLASSES + rng.uniform(-0.04, 0.04)) % 1.0
    base = np.array([colorsys.hsv_to_rgb(hue, rng.uniform(0.6, 1.0), rng.uniform(0.7, 1.0))])  # (1, 3)
    return np.concatenate([base, base * rng.uniform(0.3, 0.55)])  # bright and dark phases


def render(params: SyntheticADE20K, index: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Image ``index`` of ``split`` (``"training"`` or ``"validation"``): (S, S, 3) uint8 RGB, (S, S) uint8 labels."""
    rng = np.random.default_rng([params.seed, list(SPLITS).index(split), index])
    size = params.image_size
    colours = _colours(rng, None)  # (2, 3)
    pattern = _texture("noise", size, rng)[..., None]  # (S, S, 1)
    image = colours[0] * (1 - pattern) + colours[1] * pattern  # (S, S, 3)
    label = np.zeros((size, size), dtype=np.uint8)
    for _ in range(rng.integers(1, params.max_shapes + 1)):
        cls = int(rng.integers(NUM_SHAPE_CLASSES))
        mask = _outline(OUTLINES[cls % len(OUTLINES)], size, rng)  # (S, S)
        pattern = _texture(TEXTURES[cls // len(OUTLINES)], size, rng)[..., None]  # (S, S, 1)
        colours = _colours(rng, cls)
        image[mask] = (colours[0] * (1 - pattern) + colours[1] * pattern)[mask]
        label[mask] = cls + 1  # ADE20K labels: 0 = other, classes from 1
    image = image + rng.normal(0, 0.03, image.shape)  # sensor noise
    return np.round(image.clip(0, 1) * 255).astype(np.uint8), label


def write_synthetic_ade20k(cache_dir: Path, params: SyntheticADE20K = SyntheticADE20K()) -> Path:  # noqa: B008
    """Write the synthetic set into ``cache_dir / params.folder_name`` once, atomically, and return that folder.

    The tree is written into a temporary folder beside the target and renamed into place, so a crash never leaves
    half a set; an existing complete set is reused (concurrent writers: the first rename wins). About 1 s per 100
    images of 96 px.

    Raises:
        ValueError: If the target exists but is not a complete set.
    """
    root = Path(cache_dir) / params.folder_name

    def write(tmp: Path) -> None:
        for split, count in (("training", params.num_train), ("validation", params.num_val)):
            (tmp / "images" / split).mkdir(parents=True)
            (tmp / "annotations" / split).mkdir(parents=True)
            for i in range(count):
                image, label = render(params, i, split)
                name = f"ADE_{SPLITS[split]}_{i:08d}"
                Image.fromarray(image).save(tmp / "images" / split / f"{name}.jpg", quality=95)
                Image.fromarray(label).save(tmp / "annotations" / split / f"{name}.png")

    if not write_tree_atomic(root, _MARKER, write, what="synthetic ADE20K set"):
        return root
    rank_zero_info(f"Wrote the synthetic ADE20K set ({params.num_train} train, {params.num_val} val) to {root}")
    return root
