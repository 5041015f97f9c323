"""timm's RandAugment on a whole uint8 batch on its device: per-image ops, magnitudes, signs and interpolation.

:class:`BatchRandAugment` lets the DataLoader workers stop at uint8 after crop and flip: DeiT's
``rand-m9-mstd0.5-inc1`` then runs on the batch after transfer, before random erasing
(:mod:`kpca.vision_cls.input.device.tail`) and mixup.

Policy: timm's own parser (``rand_augment_transform``) reads the config string and hparams; the op list, ``prob``,
magnitude, ``magnitude_std`` (``mstd``, > 100 means uniform), ``magnitude_max`` (``mmax``), the choice weights, the
fill and the interpolation are taken from the RandAugment object it returns, and each op's argument from
:func:`kpca.vision_cls.input.policy.arguments`. Per image and layer the draws follow
``RandAugment.__call__`` and ``AugmentOp.__call__``: an op uniformly with replacement (or by weight without
replacement), applied iff ``U < prob``, magnitude ``N(m, mstd)`` (``U(0, m)`` for infinite mstd) clipped to
``[0, mmax or 10]``, a sign negated iff ``U > 0.5`` for the ops whose level function negates, and one interpolation
drawn uniformly from timm's tuple (bilinear or bicubic) for geometric ops when hparams fix none. The random numbers
come from a ``torch.Generator`` instead of Python's ``random``: the draws differ, their distribution does not.

Pixels: Pillow's, bit for bit (:mod:`kpca.vision_cls.input.device.pillow_ops`).

Vectorised over the batch: per layer and op kind (at most 15), the images that drew that op are gathered, transformed
with their own parameters and written back; only the op kinds loop in Python. On CUDA each op kind costs one
host sync (the count of images that drew it). The geometric ops gather 16 (rotation) or 4 (shear, translation)
taps per pixel in float64: memory-bound passes that a GPU runs fast, but that make this path slower per image on a
CPU than Pillow's (about 6 ms against 1 ms per 224 px image on one busy core; see benchmarks/batch_rand_augment.py).

Legend: B batch, L layers (ops per image), N images that drew one op, C channels (3), H x W image, K op kinds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from timm.data import auto_augment as timm_aa
from timm.data.transforms import _pil_interpolation_to_str
from torch import Tensor

from kpca.training.errors import OptionError
from kpca.vision_cls.input.device.pillow_ops import MATRIX_OPS, PIXEL_OPS, run_op
from kpca.vision_cls.input.policy import LEVEL_DENOM, arguments, timm_train_hparams


@dataclass(frozen=True)
class RandAugmentDraws:
    """One batch's random choices, all (B, L): what timm draws per image and layer.

    Attributes:
        op: int64 index into :attr:`BatchRandAugment.names`.
        applied: bool, whether the op runs (timm's ``random() <= prob``).
        magnitude: float64, after the mstd noise and the clip to ``[0, mmax or 10]``.
        negate: bool, the sign coin (used by the ops whose level function negates).
        argument: float64, the op's argument (timm's ``level_fn`` output: degrees, factor, bits, ...).
        resample: int64 index into :attr:`BatchRandAugment.resamples` (used by geometric ops).
    """

    op: Tensor
    applied: Tensor
    magnitude: Tensor
    negate: Tensor
    argument: Tensor
    resample: Tensor

    def to(self, device: torch.device) -> RandAugmentDraws:
        """The same draws on ``device``."""
        return RandAugmentDraws(**{f.name: getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)})


class BatchRandAugment:
    """timm's RandAugment for a uint8 batch on any device, each image with its own ops and parameters.

    Args:
        config_str: timm's RandAugment config, e.g. DeiT's ``"rand-m9-mstd0.5-inc1"``.
        hparams: timm's hparams (``img_mean``, ``translate_const``, ``translate_pct``, ``interpolation``); default
            :func:`timm_train_hparams` (what timm's ``create_transform`` passes for DeiT at 224 px: fill
            (124, 116, 104), bicubic).

    Raises:
        ValueError: An op of the config that has no batched implementation (Desaturate, GaussianBlur*).
    """

    def __init__(self, config_str: str, hparams: dict | None = None) -> None:
        hparams = dict(timm_train_hparams() if hparams is None else hparams)
        policy = timm_aa.rand_augment_transform(config_str, dict(hparams))
        unsupported = sorted({op.name for op in policy.ops} - PIXEL_OPS.keys() - MATRIX_OPS.keys())
        if unsupported:
            raise OptionError(f"BatchRandAugment has no batched {unsupported} (config {config_str!r}).")
        self.names = tuple(op.name for op in policy.ops)
        self.num_layers = policy.num_layers
        self.choice_weights = None if policy.choice_weights is None else torch.as_tensor(policy.choice_weights)
        self.hparams = policy.ops[0].hparams
        self._prob = torch.tensor([op.prob for op in policy.ops], dtype=torch.float64)  # (K,)
        self._magnitude = torch.tensor([float(op.magnitude) for op in policy.ops], dtype=torch.float64)  # (K,)
        self._std = torch.tensor([float(op.magnitude_std) for op in policy.ops], dtype=torch.float64)  # (K,)
        upper = [op.magnitude_max or LEVEL_DENOM for op in policy.ops]  # timm's `magnitude_max or 10`
        self._upper = torch.tensor(upper, dtype=torch.float64)  # (K,)
        kwargs = policy.ops[0].kwargs
        self.fill = torch.tensor(kwargs["fillcolor"], dtype=torch.uint8)  # (C,)
        resample = kwargs["resample"]
        resample = resample if isinstance(resample, (list, tuple)) else (resample,)
        self.resamples = tuple(_pil_interpolation_to_str[r] for r in resample)
        if not set(self.resamples) <= {"nearest", "bilinear", "bicubic"}:
            raise OptionError(f"BatchRandAugment resamples with nearest, bilinear or bicubic, not {self.resamples}.")

    def __repr__(self) -> str:
        """The policy in timm's terms."""
        return (
            f"{type(self).__name__}(n={self.num_layers}, ops={list(self.names)}, p={self._prob[0].item()}, "
            f"m={self._magnitude[0].item()}, mstd={self._std[0].item()}, fill={self.fill.tolist()}, "
            f"resample={self.resamples})"
        )

    def sample(
        self, batch: int, generator: torch.Generator | None = None, device: torch.device | str | None = None
    ) -> RandAugmentDraws:
        """Draw every image's ops and parameters, as timm's RandAugment does per image.

        Args:
            batch: Number of images B.
            generator: Source of the random numbers; its device is where they are drawn.
            device: Where to draw without a generator (default CPU).

        Returns:
            The (B, L) draws, on the generator's device (or ``device``).
        """
        device = generator.device if generator is not None else torch.device(device or "cpu")
        shape = (batch, self.num_layers)

        def uniform() -> Tensor:
            return torch.rand(shape, generator=generator, device=device, dtype=torch.float64)

        op = self._choose_ops(batch, generator, device)  # (B, L)
        applied = uniform() <= self._prob.to(device)[op]
        magnitude = self._magnitudes(op, generator, device)
        negate = uniform() > 0.5
        resample = torch.randint(len(self.resamples), shape, generator=generator, device=device)
        argument = self._arguments(op, magnitude, negate)
        return RandAugmentDraws(op, applied, magnitude, negate, argument, resample)

    def _choose_ops(self, batch: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
        """(B, L) op indices: uniform with replacement, or by weight without (numpy's ``choice`` as timm calls it)."""
        if self.choice_weights is None:
            return torch.randint(len(self.names), (batch, self.num_layers), generator=generator, device=device)
        weights = self.choice_weights.to(device).expand(batch, -1)  # (B, K)
        return torch.multinomial(weights, self.num_layers, replacement=False, generator=generator)

    def _magnitudes(self, op: Tensor, generator: torch.Generator | None, device: torch.device) -> Tensor:
        """(B, L) magnitudes: ``N(m, mstd)`` (or ``U(0, m)`` for infinite mstd, m for 0) clipped to [0, upper]."""
        mean, std, upper = (values.to(device)[op] for values in (self._magnitude, self._std, self._upper))
        gauss = mean + std * torch.randn(op.shape, generator=generator, device=device, dtype=torch.float64)
        uniform = mean * torch.rand(op.shape, generator=generator, device=device, dtype=torch.float64)
        magnitude = torch.where(std.isinf(), uniform, torch.where(std > 0, gauss, mean))
        return torch.minimum(magnitude, upper).clamp(min=0.0)

    def _arguments(self, op: Tensor, magnitude: Tensor, negate: Tensor) -> Tensor:
        """(B, L) op arguments through each op's level function (:func:`kpca.vision_cls.input.policy.arguments`)."""
        argument = torch.zeros_like(magnitude)
        for index, name in enumerate(self.names):
            argument = torch.where(op == index, arguments(name, magnitude, negate, self.hparams), argument)
        return argument

    def apply(self, images: Tensor, draws: RandAugmentDraws) -> Tensor:
        """Run ``draws`` on ``images``: (B, C, H, W) uint8 -> a new (B, C, H, W) uint8 tensor."""
        _check_images(images)
        draws = draws.to(images.device)
        fill = self.fill.to(images.device)
        out = images.clone()
        for layer in range(self.num_layers):
            for index, name in enumerate(self.names):
                rows = ((draws.op[:, layer] == index) & draws.applied[:, layer]).nonzero().squeeze(1)  # (N,)
                if len(rows):
                    argument, resample = draws.argument[rows, layer], draws.resample[rows, layer]  # (N,)
                    out[rows] = self._run(name, out[rows], argument, resample, fill)
        return out

    def _run(self, name: str, images: Tensor, argument: Tensor, resample: Tensor, fill: Tensor) -> Tensor:
        """Op ``name`` on the N images that drew it, each with its resampling: (N, C, H, W) uint8 -> same."""
        if len(self.resamples) == 1:
            return run_op(name, images, argument, fill, self.resamples[0])
        out = torch.empty_like(images)
        for code, mode in enumerate(self.resamples):
            rows = (resample == code).nonzero().squeeze(1)  # (n,)
            if len(rows):
                out[rows] = run_op(name, images[rows], argument[rows], fill, mode)
        return out

    def __call__(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """RandAugment each image of a (B, C, H, W) uint8 batch independently -> (B, C, H, W) uint8.

        Draws on the generator's device (without one: on the images' device, from torch's default generator).
        """
        _check_images(images)
        device = None if generator is not None else images.device
        return self.apply(images, self.sample(len(images), generator, device))


def _check_images(images: Tensor) -> None:
    """TypeError / ValueError unless ``images`` is a (B, 3, H, W) uint8 batch."""
    if images.dtype != torch.uint8:
        raise TypeError(f"BatchRandAugment expects uint8 images, got {images.dtype}.")
    if images.ndim != 4 or images.shape[1] != 3:
        raise OptionError(f"BatchRandAugment expects (B, 3, H, W) RGB images, got {tuple(images.shape)}.")
