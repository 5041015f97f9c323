"""The DALI operator graph of the training path: timm's RandAugment ops and the pipeline. Imports ``nvidia.dali``.

Only :mod:`kpca.vision_cls.input.dali.loader` imports this module, lazily, when a DALI loader starts an epoch.
Argument tables are built before the pipeline is defined (:mod:`kpca.vision_cls.input.dali.tables`): the pipeline
definition is traced by DALI's autograph (``enable_conditionals``, which per-sample op choice needs), and Python
work inside it is slow there.

Legend: B batch, C channels (3), H x W image, S output side (``image_size``), L RandAugment layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nvidia.dali import Pipeline, fn, pipeline_def, types
from nvidia.dali import math as dali_math
from nvidia.dali.auto_aug import augmentations
from nvidia.dali.auto_aug.core import select
from nvidia.dali.data_node import DataNode

from kpca.vision_cls.input.dali.recipe import DaliTrainRecipe
from kpca.vision_cls.input.dali.tables import OpSpec, magnitude_bins, rand_augment_specs
from kpca.vision_cls.input.policy import RandAugmentConfig

READER_NAME = "train_reader"
CROP_ATTEMPTS = 10  # timm's RandomResizedCrop tries this many windows before its fallback
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)  # timm's default aspect-ratio range (width / height) of the crop
RESIZE_INTERP = {"bicubic": types.INTERP_CUBIC, "bilinear": types.INTERP_LINEAR, "nearest": types.INTERP_NN}


@dataclass(frozen=True)
class WarpSettings:
    """How rotate, shear and translate resample: output side, fill gray level, interpolation."""

    size: int
    fill: int
    interp_type: types.DALIInterpType


def _warp(images: DataNode, matrix: DataNode, warp: WarpSettings) -> DataNode:
    """Affine warp with ``matrix`` mapping source to destination pixels."""
    return fn.warp_affine(images, matrix=matrix, fill_value=warp.fill, interp_type=warp.interp_type, inverse_map=False)


def _rotate(images: DataNode, degrees: DataNode, warp: WarpSettings) -> DataNode:
    return fn.rotate(images, angle=degrees, fill_value=warp.fill, interp_type=warp.interp_type, keep_size=True)


def _shear(images: DataNode, factors: DataNode, warp: WarpSettings) -> DataNode:
    return _warp(images, fn.transforms.shear(shear=factors), warp)


def _translate(images: DataNode, fractions: DataNode, warp: WarpSettings) -> DataNode:
    return _warp(images, fn.transforms.translation(offset=fractions * warp.size), warp)


def _equalize(images: DataNode, _: None, __: WarpSettings) -> DataNode:
    return fn.equalize(images)


def _sharpness(images: DataNode, kernel: DataNode, _: WarpSettings) -> DataNode:
    return fn.filter(images, kernel)


def _color(images: DataNode, factor: DataNode, _: WarpSettings) -> DataNode:
    return fn.saturation(images, saturation=factor)


def _brightness(images: DataNode, factor: DataNode, _: WarpSettings) -> DataNode:
    return fn.brightness(images, brightness=factor)


def _posterize(images: DataNode, mask: DataNode, _: WarpSettings) -> DataNode:
    return images & mask


def _library_op(augmentation: object) -> Callable[[DataNode, DataNode | None, WarpSettings], DataNode]:
    """One of DALI's own auto-augment operations that matches PIL (AutoContrast, Contrast, Solarize, ...)."""
    operation = augmentation.op
    return lambda images, argument, _: operation(images, argument)


OPERATIONS: dict[str, Callable[[DataNode, DataNode | None, WarpSettings], DataNode]] = {
    "AutoContrast": _library_op(augmentations.auto_contrast),
    "Equalize": _equalize,
    "Invert": _library_op(augmentations.invert),
    "Rotate": _rotate,
    "Posterize": _posterize,
    "Solarize": _library_op(augmentations.solarize),
    "SolarizeAdd": _library_op(augmentations.solarize_add),
    "Color": _color,
    "Contrast": _library_op(augmentations.contrast),
    "Brightness": _brightness,
    "Sharpness": _sharpness,
    "ShearX": _shear,
    "ShearY": _shear,
    "TranslateX": _translate,
    "TranslateY": _translate,
    "Identity": lambda images, _, __: images,
}


class TimmOp:
    """One RandAugment op inside a pipeline: looks its argument up per sample and applies it.

    Args:
        spec: The op and its argument table.
        warp: Resampling settings of the geometric ops.
        data_device: Device of the images (``"cpu"`` or ``"gpu"``): tables combined with pixels live there.
    """

    def __init__(self, spec: OpSpec, warp: WarpSettings, data_device: str) -> None:
        self.spec = spec
        self.operation = OPERATIONS[spec.kind]
        self.warp = warp
        self.table_device = data_device if spec.on_data_device else "cpu"

    def __call__(self, images: DataNode, signed_bin: DataNode) -> DataNode:
        """Apply the op to (S, S, C) uint8 images at the per-sample signed magnitude bin (``2 * bin + negated``)."""
        argument = None
        if self.spec.table is not None:
            argument = types.Constant(self.spec.table, device=self.table_device)[signed_bin]
        return self.operation(images, argument, self.warp)


def rand_augment(images: DataNode, config: RandAugmentConfig, ops: Sequence[TimmOp]) -> DataNode:
    """RandAugment as timm applies it, on a batch of (S, S, C) uint8 images; ``ops`` end with the identity.

    Per image and layer, as timm's ``RandAugment`` and ``AugmentOp``: an op drawn uniformly (with replacement);
    applied with probability ``prob``; magnitude m + N(0, mstd) (U(0, m) for infinite mstd) clipped to
    [0, magnitude_max] and rounded to the tables' 0.01 steps; negated with probability 1/2 (the tables ignore the
    sign for ops timm does not negate).
    """
    layers = (config.num_layers,)
    identity = len(ops) - 1
    chosen = fn.random.uniform(values=list(range(identity)), shape=layers, dtype=types.INT32)  # (L,)
    applied = fn.random.coin_flip(probability=config.prob, shape=layers, dtype=types.INT32)  # (L,)
    op_index = chosen * applied + identity * (1 - applied)  # (L,)
    if math.isinf(config.magnitude_std):
        magnitude = fn.random.uniform(range=[0.0, config.magnitude], shape=layers)  # (L,)
    else:
        magnitude = fn.random.normal(mean=config.magnitude, stddev=config.magnitude_std, shape=layers)  # (L,)
    magnitude = dali_math.clamp(magnitude, 0.0, config.magnitude_max)
    bins = fn.cast(magnitude * (magnitude_bins(config) - 1) / config.magnitude_max, dtype=types.INT32)  # (L,), rounded
    negated = fn.random.coin_flip(probability=0.5, shape=layers, dtype=types.INT32)  # (L,)
    signed_bins = 2 * bins + negated  # (L,)
    for layer in range(config.num_layers):
        images = select(ops, op_index[layer], images, signed_bin=signed_bins[layer])
    return images


def build_train_pipeline(
    files: Sequence[str],
    labels: Sequence[int],
    recipe: DaliTrainRecipe,
    batch_size: int,
    device_id: int | None,
    num_threads: int,
    seed: int,
) -> Pipeline:
    """The DALI training pipeline over ``files`` in the given order: (C, S, S) uint8 images and int32 labels (1,).

    Stages, as timm's ``transforms_imagenet_train``: the random-resized-crop window decoded as a region of interest
    (area ``recipe.scale``, aspect 3/4-4/3, 10 attempts), resized to S x S (antialiased), flipped with probability
    ``recipe.hflip``, RandAugment, then HWC -> CHW.

    Args:
        files: Image paths, read once each in this order (no shuffling: the caller's sampler ordered them).
        labels: Class index of each file.
        recipe: The transform (:class:`~kpca.vision_cls.input.dali.recipe.DaliTrainRecipe`).
        batch_size: Images per batch.
        device_id: CUDA device index: nvJPEG decoding (``mixed``) and GPU operators; None runs CPU operators.
        num_threads: CPU threads of the pipeline.
        seed: Seed of every random operator.

    Returns:
        An unbuilt pipeline whose reader is named :data:`READER_NAME`.
    """
    size = recipe.image_size
    nearest = recipe.interpolation == "nearest"
    gpu = device_id is not None
    warp = WarpSettings(size, recipe.fill, types.INTERP_NN if nearest else types.INTERP_LINEAR)
    augment = recipe.rand_augment
    ops = [TimmOp(spec, warp, "gpu" if gpu else "cpu") for spec in rand_augment_specs(augment)] if augment else []

    @pipeline_def(enable_conditionals=True)
    def train_pipeline() -> tuple[DataNode, DataNode]:
        encoded, label = fn.readers.file(files=list(files), labels=list(labels), name=READER_NAME)
        images = fn.decoders.image_random_crop(
            encoded,
            device="mixed" if gpu else "cpu",
            output_type=types.RGB,
            random_area=list(recipe.scale),
            random_aspect_ratio=list(CROP_RATIO),
            num_attempts=CROP_ATTEMPTS,
        )  # (H, W, C) uint8: the crop window only
        images = fn.resize(
            images,
            resize_x=size,
            resize_y=size,
            interp_type=RESIZE_INTERP[recipe.interpolation],
            antialias=not nearest,
        )  # (S, S, C)
        if recipe.hflip > 0:
            images = fn.flip(images, horizontal=fn.random.coin_flip(probability=recipe.hflip))  # (S, S, C)
        if augment is not None:
            images = rand_augment(images, augment, ops)  # (S, S, C)
        images = fn.transpose(images, perm=[2, 0, 1])  # (C, S, S)
        return images, label.gpu() if gpu else label

    return train_pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed)
