"""build_vit: a timm DeiT with its attention chosen by an AttentionSpec."""

from __future__ import annotations

from typing import Literal

import timm
from torch import nn

from kpca.attention import AttentionSpec, swap_attention

Arch = Literal["deit_tiny", "deit_small", "deit_base"]
ARCHS: dict[str, str] = {
    "deit_tiny": "deit_tiny_patch16_224",
    "deit_small": "deit_small_patch16_224",
    "deit_base": "deit_base_patch16_224",
}


def build_vit(
    arch: str,
    attention: AttentionSpec,
    embed_dim: int | None = None,
    depth: int | None = None,
    num_heads: int | None = None,
    **timm_kwargs,
) -> nn.Module:
    """A randomly initialised timm DeiT (``arch`` in :data:`ARCHS`) with ``attention`` swapped in.

    ``embed_dim``, ``depth`` and ``num_heads`` override the architecture's when given; ``timm_kwargs``
    (``num_classes``, ``img_size``, ``patch_size``, ``drop_path_rate``, ...) go to ``timm.create_model``.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {sorted(ARCHS)}, got {arch!r}")
    overrides = {"embed_dim": embed_dim, "depth": depth, "num_heads": num_heads}
    vit = timm.create_model(
        ARCHS[arch], pretrained=False, **{k: v for k, v in overrides.items() if v is not None}, **timm_kwargs
    )
    if attention.kind != "softmax":
        swap_attention(vit, attention)
    return vit
