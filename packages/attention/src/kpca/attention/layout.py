"""The row layout of a qkv projection: ``[Q;K;V]`` (asymmetric, timm) or ``[K;V]`` (symmetric and RPC)."""

from __future__ import annotations

import torch


def is_symmetric_qkv(rows: torch.Tensor, attn_dim: int) -> bool:
    """Whether qkv ``rows`` are in the symmetric ``[K;V]`` layout rather than the asymmetric ``[Q;K;V]`` one.

    Args:
        rows: qkv weight (out, in) or bias (out,) whose dim 0 is ``[Q;K;V]`` (3 * attn_dim rows) or
            ``[K;V]`` (2 * attn_dim rows).
        attn_dim: rows in each of Q, K and V (heads * head dim).

    Raises:
        ValueError: if dim 0 of ``rows`` is neither 3 nor 2 times ``attn_dim``.
    """
    if attn_dim < 1 or rows.shape[:1] not in ((3 * attn_dim,), (2 * attn_dim,)):
        raise ValueError(
            f"qkv rows of shape {tuple(rows.shape)} fit no layout for attn_dim={attn_dim}: dim 0 must be "
            f"3 * attn_dim = {3 * attn_dim} ([Q;K;V], asymmetric / timm) or 2 * attn_dim = {2 * attn_dim} "
            "([K;V], symmetric)"
        )
    return rows.shape[0] == 2 * attn_dim


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
