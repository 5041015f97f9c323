"""Optimizer helpers: decay / no-decay parameter groups and per-step lr factors for ``LambdaLR``."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn


def parameter_groups(net: nn.Module, decay_everything: bool = False) -> list[dict]:
    """Parameter groups ``decay`` and ``no_decay`` (weight decay 0): biases, norms and ``net.no_weight_decay()``.

    The timm / nanoGPT rule: every parameter with at most one dimension (biases, norm scales) and every name
    that ``net.no_weight_decay()`` returns (position embeddings, class tokens) goes without weight decay. The
    group names show in ``LearningRateMonitor`` tags. Frozen parameters are left out.

    Args:
        net: the network.
        decay_everything: one group ``all`` with every trainable parameter instead.
    """
    if decay_everything:
        return [{"params": [p for p in net.parameters() if p.requires_grad], "name": "all"}]
    skip = net.no_weight_decay() if hasattr(net, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, param in net.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 or name in skip else decay).append(param)
    return [{"params": decay, "name": "decay"}, {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]


def warmup_cosine(
    total: int, warmup: int, start: float = 0.0, floor: float = 0.0, warmup_offset: int = 0
) -> Callable[[int], float]:
    """LambdaLR factor: linear warm-up over ``warmup`` steps, then cosine decay to ``floor`` at step ``total``.

    During the warm-up (``step < warmup``) the factor is ``start + (1 - start) * (step + warmup_offset) / warmup``:
    DeiT's ramp from ``warmup_lr / lr`` with ``warmup_offset=0``; ``start=0, warmup_offset=1`` trains step 0 at
    ``lr / warmup`` already (the language model's ramp). Then ``floor + (1 - floor) (1 + cos(pi p)) / 2`` with
    ``p = (step - warmup) / (total - warmup)``, held at ``floor`` after ``total``.

    Args:
        total: optimizer steps of the whole run.
        warmup: warm-up steps (0: none).
        start: factor at the first warm-up step (for ``warmup_offset=0``).
        floor: final factor.
        warmup_offset: added to the step inside the warm-up ramp.
    """

    def factor(step: int) -> float:
        if step < warmup:
            return start + (1.0 - start) * (step + warmup_offset) / warmup
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def polynomial(total: int, power: float, floor: float = 0.0) -> Callable[[int], float]:
    """LambdaLR factor ``(1 - floor) (1 - step / total) ** power + floor``, held at ``floor`` after ``total``.

    mmsegmentation's ``PolyLR`` with ``eta_min = floor * lr`` (Segmenter: power 0.9).
    """

    def factor(step: int) -> float:
        return (1.0 - floor) * (1.0 - min(step, total) / total) ** power + floor

    return factor
