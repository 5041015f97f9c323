"""The compiled Pillow kernels and timm's RandAugment with its slow ops compiled, against Pillow bit for bit."""

import math
import random

import numpy as np
import pytest
from PIL import Image, ImageFilter
from sklearn.datasets import load_sample_images
from timm.data import auto_augment as timm_ops
from timm.data.auto_augment import rand_augment_transform

from kpca.vision_cls.input.workers.compiled_rand_augment import (
    COMPILED_OPS,
    CompiledEnhanceOp,
    CompiledGeometricOp,
    with_compiled_ops,
)
from kpca.vision_cls.input.workers.pil_kernels import affine_bicubic, blend, rotation_matrix, smooth

FILL = (124, 116, 104)  # DeiT's img_mean, the fill timm's RandAugment uses
DEIT_HPARAMS = {"translate_const": 100, "img_mean": FILL, "interpolation": Image.BICUBIC}


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    """A real photograph at the size RandAugment sees in DeiT's recipe."""
    return Image.fromarray(load_sample_images().images[0]).resize((224, 224), Image.BICUBIC)


def pillow_affine(image: Image.Image, matrix: tuple) -> np.ndarray:
    return np.asarray(image.transform(image.size, Image.AFFINE, matrix, resample=Image.BICUBIC, fillcolor=FILL))


def rotation(degrees: float, width: int, height: int) -> tuple:
    """A rotation about the centre (both fractions non-zero: the kernel's full 4 x 4 filter)."""
    angle = math.radians(degrees)
    cos, sin = math.cos(angle), math.sin(angle)
    return (
        cos,
        sin,
        width / 2 - cos * width / 2 - sin * height / 2,
        -sin,
        cos,
        height / 2 + sin * width / 2 - cos * height / 2,
    )


MATRICES = [
    (1, 0.27, 0, 0, 1, 0),  # ShearX
    (1, -0.3, 0, 0, 1, 0),
    (1, 0, 0, 0.123, 1, 0),  # ShearY
    (1, 0, 81.37, 0, 1, 0),  # TranslateX
    (1, 0, -90.0, 0, 1, 0),  # a whole number of pixels
    (1, 0, 0, 0, 1, 67.5),  # TranslateY
    (1, 0, 500.0, 0, 1, 0),  # everything outside: all fill
    (1, 0, 0, 0, 1, 0),  # identity
    (0.9, 0.2, 3.3, -0.15, 1.1, -7.9),  # general
]


@pytest.mark.parametrize("size", [(224, 224), (57, 31)])
@pytest.mark.parametrize("matrix", [*MATRICES, "rotation"])
def test_affine_bicubic_is_bit_identical_to_pillow(photo: Image.Image, size: tuple, matrix):
    image = photo.resize(size, Image.BICUBIC)
    matrix = rotation(23.7, *size) if matrix == "rotation" else matrix
    np.testing.assert_array_equal(affine_bicubic(np.asarray(image), matrix, FILL), pillow_affine(image, matrix))


def test_affine_bicubic_refuses_what_it_does_not_cover():
    with pytest.raises(ValueError, match=r"\(H, W, 3\) uint8 RGB.*float32 \(4, 4, 3\)"):
        affine_bicubic(np.zeros((4, 4, 3), np.float32), MATRICES[0], FILL)
    with pytest.raises(ValueError, match=r"\(4, 4\)"):
        affine_bicubic(np.zeros((4, 4), np.uint8), MATRICES[0], FILL)


def test_rand_augment_gives_timms_images_and_draws(photo: Image.Image):
    timm = rand_augment_transform("rand-m9-mstd0.5-inc1", DEIT_HPARAMS)
    compiled = with_compiled_ops(timm)
    compiled_types = (CompiledGeometricOp, CompiledEnhanceOp)
    swapped = [op.name for op in compiled.ops if isinstance(op.aug_fn, compiled_types)]
    assert swapped == [
        "Rotate",
        "ColorIncreasing",
        "ContrastIncreasing",
        "BrightnessIncreasing",
        "SharpnessIncreasing",
        "ShearX",
        "ShearY",
        "TranslateXRel",
        "TranslateYRel",
    ]
    assert not any(isinstance(op.aug_fn, compiled_types) for op in timm.ops), "timm's object is unchanged"
    for seed in range(100):
        random.seed(seed)
        np.random.seed(seed)
        expected = np.asarray(timm(photo))
        state = random.getstate(), np.random.get_state()[1].tolist()
        random.seed(seed)
        np.random.seed(seed)
        np.testing.assert_array_equal(np.asarray(compiled(photo)), expected)
        assert (random.getstate(), np.random.get_state()[1].tolist()) == state


@pytest.mark.parametrize(
    ("mode", "resample"), [("RGB", Image.BILINEAR), ("RGB", (Image.BILINEAR, Image.BICUBIC)), ("L", Image.BICUBIC)]
)
def test_what_the_kernel_does_not_cover_goes_to_timm(photo: Image.Image, mode: str, resample):
    image = photo.convert(mode)
    fill = FILL if mode == "RGB" else 120
    op = CompiledGeometricOp(timm_ops.shear_x, lambda factor, width, height: (1, factor, 0, 0, 1, 0))
    random.seed(1)
    expected = np.asarray(timm_ops.shear_x(image, 0.2, resample=resample, fillcolor=fill))
    random.seed(1)
    np.testing.assert_array_equal(np.asarray(op(image, 0.2, resample=resample, fillcolor=fill)), expected)


@pytest.mark.parametrize("degrees", [23.7, -13.1, 0.0, 360.0, 29.999, -30.0, 90.0, 180.0, -90.0])
def test_rotate_is_pillows_rotate(photo: Image.Image, degrees: float):
    # Multiples of 90 degrees (but 0) are Pillow's transposes: the compiled op hands them to timm.
    op = with_compiled_ops(timm_ops.RandAugment([timm_ops.AugmentOp("Rotate", 1.0, 10, DEIT_HPARAMS)])).ops[0]
    rotate = op.aug_fn
    expected = np.asarray(photo.rotate(degrees, resample=Image.BICUBIC, fillcolor=FILL))
    np.testing.assert_array_equal(np.asarray(rotate(photo, degrees, resample=Image.BICUBIC, fillcolor=FILL)), expected)
    tall = photo.resize((61, 97))
    expected = np.asarray(tall.rotate(degrees, resample=Image.BICUBIC, fillcolor=FILL))
    if degrees % 90.0 or degrees % 360.0 == 0.0:
        matrix = rotation_matrix(*tall.size, degrees)
        np.testing.assert_array_equal(affine_bicubic(np.asarray(tall), matrix, FILL), expected)


@pytest.mark.parametrize("size", [(224, 224), (31, 17), (2, 5), (1, 1)])  # under 3 x 3 Pillow copies the image
def test_smooth_and_blend_are_pillows(photo: Image.Image, size: tuple):
    image = photo.resize(size, Image.BICUBIC)
    pixels = np.asarray(image)
    np.testing.assert_array_equal(smooth(pixels), np.asarray(image.filter(ImageFilter.SMOOTH)))
    other = np.asarray(photo.rotate(40).resize(size))
    for alpha in (0.0, 0.37, 1.0, 1.9, -0.5, 3.0):
        expected = np.asarray(Image.blend(Image.fromarray(other), image, alpha))
        np.testing.assert_array_equal(blend(other, pixels, alpha), expected)


def test_enhance_ops_leave_non_rgb_images_to_timm(photo: Image.Image):
    gray = photo.convert("L")
    op = COMPILED_OPS["Sharpness"]
    np.testing.assert_array_equal(np.asarray(op(gray, 1.7)), np.asarray(timm_ops.sharpness(gray, 1.7)))
