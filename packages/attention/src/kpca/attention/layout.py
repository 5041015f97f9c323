"""The row layout of a qkv projection: ``[Q;K;V]`` (asymmetric, timm) or ``[K;V]`` (symmetric and RPC).

Legend: B batch, N tokens, H heads, D head dim, A = H * D rows in each of Q, K and V.

The one place that knows the layout. :func:`kpca.attention.capture.project_qkv` splits a projection with
:func:`split_qkv`, and the modules' forward, which knows its layout from construction, with :func:`split_heads`;
``swap_attention`` and the ViT weight conversion move rows with :func:`convert_qkv_rows`; and they ask an attention
layer for its layout (:func:`attention_dim`, :func:`has_symmetric_qkv`) rather than guess it from row counts (384
rows are ``[K;V]`` of width 192 and ``[Q;K;V]`` of width 128).
"""

from __future__ import annotations

import torch
from torch import nn

_ASYMMETRIC_BLOCKS, _SYMMETRIC_BLOCKS = 3, 2  # [Q;K;V], [K;V]


def qkv_rows(attn_dim: int, symmetric: bool) -> int:
    """Output rows of a qkv projection: 2 * ``attn_dim`` for ``[K;V]`` (symmetric), else 3 * ``attn_dim``."""
    return (_SYMMETRIC_BLOCKS if symmetric else _ASYMMETRIC_BLOCKS) * attn_dim


def attention_dim(attn: nn.Module) -> int:
    """A = H * D of an attention layer in timm's layout (``num_heads``, ``head_dim``, timm's ``attn_dim`` if set)."""
    return getattr(attn, "attn_dim", None) or attn.head_dim * attn.num_heads


def is_attention_layer(module: nn.Module) -> bool:
    """Whether ``module`` has timm's attention layout: ``num_heads``, ``head_dim``, a 2 or 3 x A rows ``qkv`` Linear."""
    qkv, heads = getattr(module, "qkv", None), getattr(module, "num_heads", None)
    if not isinstance(qkv, nn.Linear) or not isinstance(heads, int) or not hasattr(module, "head_dim"):
        return False
    attn_dim = attention_dim(module)
    return qkv.out_features in (qkv_rows(attn_dim, symmetric=True), qkv_rows(attn_dim, symmetric=False))


def is_symmetric_qkv(rows: torch.Tensor, attn_dim: int) -> bool:
    """Whether qkv ``rows`` are in the symmetric ``[K;V]`` layout rather than the asymmetric ``[Q;K;V]`` one.

    Args:
        rows: qkv weight (out, in) or bias (out,) whose dim 0 is ``[Q;K;V]`` (3 * attn_dim rows) or
            ``[K;V]`` (2 * attn_dim rows).
        attn_dim: rows in each of Q, K and V (heads * head dim).

    Raises:
        ValueError: if dim 0 of ``rows`` is neither 3 nor 2 times ``attn_dim``.
    """
    symmetric, asymmetric = qkv_rows(attn_dim, symmetric=True), qkv_rows(attn_dim, symmetric=False)
    if attn_dim < 1 or rows.shape[:1] not in ((asymmetric,), (symmetric,)):
        raise ValueError(
            f"qkv rows of shape {tuple(rows.shape)} fit no layout for attn_dim={attn_dim}: dim 0 must be "
            f"3 * attn_dim = {asymmetric} ([Q;K;V], asymmetric / timm) or 2 * attn_dim = {symmetric} "
            "([K;V], symmetric)"
        )
    return rows.shape[0] == symmetric


def has_symmetric_qkv(attn: nn.Module) -> bool:
    """Whether the attention layer ``attn`` projects ``[K;V]`` (SymViT, RPC) rather than ``[Q;K;V]`` (timm, DeiT).

    Raises:
        ValueError: if its ``qkv`` rows fit neither layout for its :func:`attention_dim`.
    """
    return is_symmetric_qkv(attn.qkv.weight, attention_dim(attn))


def convert_qkv_rows(rows: torch.Tensor, attn_dim: int, symmetric: bool) -> torch.Tensor:
    """A qkv weight or bias in the layout asked for, such that the model computes the same function.

    ``[Q;K;V]`` -> ``[K;V]`` drops the Q rows; ``[K;V]`` -> ``[Q;K;V]`` initialises Q as a copy of K
    (symmetric attention is asymmetric attention with Q = K). The same layout in and out returns ``rows``.

    Args:
        rows: qkv weight (out, in) or bias (out,) whose dim 0 is ``[Q;K;V]`` (3 * attn_dim rows,
            timm / asymmetric) or ``[K;V]`` (2 * attn_dim rows, symmetric).
        attn_dim: rows in each of Q, K and V (heads * head dim).
        symmetric: True for the ``[K;V]`` layout, False for ``[Q;K;V]``.

    Returns:
        (2 * attn_dim, ...) ``[K;V]`` if ``symmetric``, else (3 * attn_dim, ...) ``[Q;K;V]``. It shares
        memory with ``rows`` unless Q rows were added.

    Raises:
        ValueError: if dim 0 of ``rows`` is neither 3 nor 2 times ``attn_dim``.
    """
    if is_symmetric_qkv(rows, attn_dim) == symmetric:
        return rows
    if symmetric:
        return rows[attn_dim:]  # (3 A, ...) [Q;K;V] -> (2 A, ...) [K;V]
    return torch.cat([rows[:attn_dim], rows])  # (2 A, ...) [K;V] -> (3 A, ...) [K;K;V]


def split_qkv(
    projected: torch.Tensor, num_heads: int, head_dim: int
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Queries, keys and values of a qkv projection, split into heads.

    Args:
        projected: (B, N, 3 * A) ``[Q;K;V]`` or (B, N, 2 * A) ``[K;V]`` output of a qkv Linear, A = H * D.
        num_heads: H.
        head_dim: D.

    Returns:
        ``(q, k, v)``, each (B, H, N, D); q is None for the symmetric ``[K;V]`` layout (the keys are the queries).

    Raises:
        ValueError: if the last dim of ``projected`` is neither 3 nor 2 times H * D.
    """
    attn_dim = num_heads * head_dim
    width = projected.shape[-1]
    if projected.dim() != 3 or width not in (qkv_rows(attn_dim, symmetric=False), qkv_rows(attn_dim, symmetric=True)):
        raise ValueError(
            f"a qkv projection of shape {tuple(projected.shape)} fits no layout for num_heads={num_heads}, "
            f"head_dim={head_dim}: it must be (B, N, 3 * {attn_dim}) ([Q;K;V]) or (B, N, 2 * {attn_dim}) ([K;V])"
        )
    return split_heads(projected, width == qkv_rows(attn_dim, symmetric=True), num_heads, head_dim)


def split_heads(
    projected: torch.Tensor, symmetric: bool, num_heads: int, head_dim: int
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """:func:`split_qkv` for a layer that knows its layout: no checks, so TorchScript and torch.fx take it.

    Args:
        projected: (B, N, 2 * A) ``[K;V]`` if ``symmetric``, else (B, N, 3 * A) ``[Q;K;V]``; A = H * D.
        symmetric: the layout, as the layer was built.
        num_heads: H.
        head_dim: D.

    Returns:
        ``(q, k, v)``, each (B, H, N, D); q is None if ``symmetric``.
    """
    b, n, _ = projected.shape
    qkv = projected.reshape(b, n, -1, num_heads, head_dim).permute(2, 0, 3, 1, 4)  # (3 | 2, B, H, N, D)
    if symmetric:
        k, v = qkv.unbind(0)  # (B, H, N, D) each
        return None, k, v
    q, k, v = qkv.unbind(0)  # (B, H, N, D) each
    return q, k, v
