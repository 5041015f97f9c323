"""Combining causal, key-padding and user masks into the one mask an SDPA call takes, and that call."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def combine_masks(
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
    n: int,
    device: torch.device,
) -> tuple[torch.Tensor | None, bool]:
    """Return ``(mask, is_causal)`` for ``F.scaled_dot_product_attention``.

    A lone causal flag or a lone user mask is passed through, so SDPA keeps its fused kernels.
    Otherwise the masks are merged into one: bool (True = attend) unless the user mask is an
    additive float mask. A padded query row (all of whose keys could be masked, e.g. causal
    left padding) is allowed to attend to itself so that no row is empty and outputs stay finite;
    padded rows never influence valid rows, because padded keys are masked for every query.

    Args:
        attn_mask: bool (True = attend) or float additive mask broadcastable to (B, H, N, N), or None.
        key_padding_mask: (B, N) bool, True = padded key, or None.
        is_causal: whether query t may only attend to keys <= t.
        n: sequence length N.
        device: device of the attention inputs.
    """
    if key_padding_mask is None and not (is_causal and attn_mask is not None):
        return attn_mask, is_causal
    allowed = torch.ones(1, 1, n, n, dtype=torch.bool, device=device)  # (1, 1, N, N)
    if is_causal:
        allowed = allowed.tril()
    if key_padding_mask is not None:
        padded_key = key_padding_mask[:, None, None, :]  # (B, 1, 1, N)
        padded_query = key_padding_mask[:, None, :, None]  # (B, 1, N, 1)
        diagonal = torch.eye(n, dtype=torch.bool, device=device)  # (N, N)
        allowed = (allowed & ~padded_key) | (diagonal & padded_query)  # (B, 1, N, N)
    if attn_mask is None:
        return allowed, False
    if attn_mask.dtype == torch.bool:
        return allowed & attn_mask, False
    return attn_mask.masked_fill(~allowed, float("-inf")), False


def masked_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    scale: float | None,
) -> torch.Tensor:
    """One ``F.scaled_dot_product_attention`` call with the masks combined by :func:`combine_masks`: (B, H, N, D).

    No argument checks (``softmax_attention`` checks, then calls this; TorchScript compiles it as it is).

    Args:
        q, k, v: (B, H, N, D).
        attn_mask, key_padding_mask, is_causal: as in :func:`combine_masks`.
        dropout_p: dropout on the attention probabilities.
        scale: softmax scale, None for 1 / sqrt(D).
    """
    mask, causal = combine_masks(attn_mask, key_padding_mask, is_causal, q.shape[2], q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=scale)
