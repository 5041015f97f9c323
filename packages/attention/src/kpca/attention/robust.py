"""The robust-attention family beside RPC-Attention: Twicing, NeuTRENO and Elliptical attention on (B, H, N, D).

Legend: B batch, H heads, N tokens, D head dim. Each kind stays on fused ``F.scaled_dot_product_attention``
(no N x N tensor where SDPA has a fused kernel) and takes masks as ``softmax_attention`` does:

- Twicing (Abdullaev & Nguyen, ICLR 2025, arXiv 2503.00687): ``(2A - A²) V`` as two SDPA calls,
  ``u1 = A V``, ``u2 = A (V - u1)``, out = u1 + u2.
- NeuTRENO (Nguyen et al., NeurIPS 2023, arXiv 2312.00751): ``A V + lambd (v_first - V)``, with ``v_first`` the
  first block's values (gradients flow into it).
- Elliptical (Nielsen et al., NeurIPS 2024, arXiv 2406.13770): softmax attention on ``q * m``, m the per-dimension
  mean of ``|V - V_prev|`` over tokens divided by its maximum over D (no gradient through m).
"""

from __future__ import annotations

import math
from numbers import Real

import torch
import torch.nn.functional as F

from kpca.attention import _checks
from kpca.attention._checks import EllipticalConvention
from kpca.attention._masks import combine_masks, masked_sdpa
from kpca.attention.errors import AttentionOptionError


def twicing_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """Twicing attention ``(2A - A²) v`` with ``A = softmax(q kᵀ · scale + mask)``, as two SDPA calls.

    ``u1 = A v``, ``u2 = A (v - u1)``, out = ``u1 + u2``: exact because both calls see the same A. Rows of
    ``2A - A²`` sum to 1 and may have negative entries; with ``is_causal`` A² stays lower-triangular, so the
    output is strictly causal.

    Args:
        q, k, v: (B, H, N, D) tensors of one dtype and device.
        attn_mask: bool (True = attend) or float additive mask broadcastable to (B, H, N, N), used in both calls.
        key_padding_mask: (B, N) bool, True marks padded keys; outputs at padded positions are unspecified (finite).
        is_causal: query t attends to keys <= t only.
        dropout_p: must be 0.0: the two calls would draw different dropout masks, so their sum would not be
            ``(2A - A²) v`` of one dropped-out A (the papers train with attention dropout 0).
        scale: softmax scale, default 1 / sqrt(D).

    Returns:
        (B, H, N, D) output in the dtype of v.
    """
    b, h, n, _ = _checks.check_qkv(q=q, k=k, v=v)
    _checks.check_call_options(attn_mask, key_padding_mask, dropout_p, scale, b, h, n)
    if dropout_p != 0.0:
        raise AttentionOptionError(
            f"twicing_attention takes no attention dropout, got dropout_p={dropout_p!r}: its two SDPA calls would "
            "draw different masks, so the output would not be (2A - A²) v; pass dropout_p=0.0 (the papers' setting)"
        )
    mask, causal = combine_masks(attn_mask, key_padding_mask, is_causal, n, q.device)
    u1 = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)  # (B, H, N, D)
    u2 = F.scaled_dot_product_attention(q, k, v - u1, attn_mask=mask, is_causal=causal, scale=scale)  # (B, H, N, D)
    return u1 + u2


def neutreno_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_first: torch.Tensor,
    *,
    lambd: float,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """NeuTRENO attention ``softmax(q kᵀ · scale + mask) v + lambd (v_first - v)``.

    The added term is per token, so causality and masks are those of the SDPA call. ``v_first`` is not
    detached: gradients flow into the first block's values, as in the authors' code.

    Args:
        q, k, v: (B, H, N, D) tensors of one dtype and device.
        v_first: (B, H, N, D) values of the first attention block in the same forward pass.
        lambd: weight lambda >= 0 of the fidelity term (the papers: 0.6 for vision, 0.4 for language); 0 is
            softmax attention.
        attn_mask: bool (True = attend) or float additive mask broadcastable to (B, H, N, N).
        key_padding_mask: (B, N) bool, True marks padded keys; outputs at padded positions are unspecified (finite).
        is_causal: query t attends to keys <= t only.
        dropout_p: dropout on the attention probabilities (the added term is not dropped out).
        scale: softmax scale, default 1 / sqrt(D).

    Returns:
        (B, H, N, D) output in the dtype of v.
    """
    b, h, n, _ = _checks.check_qkv(q=q, k=k, v=v, v_first=v_first)
    _checks.check_call_options(attn_mask, key_padding_mask, dropout_p, scale, b, h, n)
    _check_lambd(lambd)
    out = masked_sdpa(q, k, v, attn_mask, key_padding_mask, is_causal, dropout_p, scale)  # (B, H, N, D)
    return out + lambd * (v_first - v)


def elliptical_scale(
    v: torch.Tensor,
    v_prev: torch.Tensor,
    *,
    is_causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Elliptical attention's per-dimension query scale m, without gradient.

    ``s_d = mean_n |v - v_prev|_{n,d}`` over the tokens, ``m = s / max_d s`` per sample and head, so m lies in
    [0, 1] with maximum 1. The reference code divides the difference by a step ``delta`` first; it cancels in the
    max-normalisation, so there is none here. Where the difference is zero in every dimension (``max_d s`` below
    the smallest normal float of the accumulation dtype) m is all ones: plain softmax attention, not 0/0.

    Non-causal, the mean runs over every non-padded token (CLS included), as the reference code computes it.
    Causal, it is a prefix mean, ``s_{t,d} = (1 / t) sum_{n <= t} |v - v_prev|_{n,d}`` over the non-padded tokens
    up to t, normalised per position, so m at t depends on tokens <= t only (the reference's LM code takes the
    mean over the whole segment, which sees future tokens). ``attn_mask`` plays no part in the estimate.

    Args:
        v: (B, H, N, D) values of this block.
        v_prev: (B, H, N, D) values of the previous block.
        is_causal: prefix means (see above).
        key_padding_mask: (B, N) bool, True = padded: padded tokens are left out of the mean (sum and count).

    Returns:
        m: (B, H, 1, D), or (B, H, N, D) when causal, in the dtype of v (accumulated in float32, float64 for
        float64 input), detached.
    """
    b, _, n, _ = _checks.check_qkv(v=v, v_prev=v_prev)
    _checks.check_key_padding_mask(key_padding_mask, b, n)
    return query_scale(v, v_prev, is_causal, key_padding_mask)


def query_scale(
    v: torch.Tensor, v_prev: torch.Tensor, is_causal: bool, key_padding_mask: torch.Tensor | None
) -> torch.Tensor:
    """:func:`elliptical_scale` without argument checks, in the form TorchScript compiles: (B, H, 1 | N, D)."""
    accumulate = torch.float64 if v.dtype == torch.float64 else torch.float32
    diff = (v.detach().to(accumulate) - v_prev.detach().to(accumulate)).abs()  # (B, H, N, D)
    valid = torch.ones_like(diff[:1, :1, :, :1])  # (1, 1, N, 1)
    if key_padding_mask is not None:
        valid = (~key_padding_mask)[:, None, :, None].to(accumulate)  # (B, 1, N, 1)
    if is_causal:
        total = (diff * valid).cumsum(dim=2)  # (B, H, N, D)
        count = valid.cumsum(dim=2)  # (B | 1, 1, N, 1)
    else:
        total = (diff * valid).sum(dim=2, keepdim=True)  # (B, H, 1, D)
        count = valid.sum(dim=2, keepdim=True)  # (B | 1, 1, 1, 1)
    s = total / count.clamp_min(1.0)  # (B, H, 1 | N, D)
    return _normalise_by_max(s).to(v.dtype)


def elliptical_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_prev: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    convention: EllipticalConvention = "causal",
) -> torch.Tensor:
    """Elliptical attention ``softmax((q * m) kᵀ · scale + mask) v`` with m = :func:`elliptical_scale`.

    m rescales each query (per position when causal), so the attention stays one SDPA call with the same
    causality and masks. m carries no gradient (the reference treats it as a constant): q, k and v get the
    gradients of softmax attention on the rescaled queries, ``v_prev`` gets none.

    ``convention="reference"`` is the authors' code. Non-causal (their vision models) it is the same as ours. Causal
    (their WikiText-103 model, lmtool-fwms ``mem_transformer.py`` 378, 397, 513-514) m is the mean over the whole
    segment, so every position's queries depend on later tokens of the segment, and the scores are not scaled by
    1/sqrt(D) (``scale`` None means 1 there): the output at t is not causal in the tokens, only the attention mask is.

    Args:
        q, k, v: (B, H, N, D) tensors of one dtype and device.
        v_prev: (B, H, N, D) values of the previous attention block.
        attn_mask: bool (True = attend) or float additive mask broadcastable to (B, H, N, N).
        key_padding_mask: (B, N) bool, True marks padded keys, left out of attention and of m; outputs at padded
            positions are unspecified (finite).
        is_causal: causal attention and a prefix-mean m (strictly causal).
        dropout_p: dropout on the attention probabilities.
        scale: softmax scale, default 1 / sqrt(D) (1 for ``convention="reference"`` with ``is_causal``).
        convention: ``causal`` (ours) or ``reference`` (the authors' code, see above).

    Returns:
        (B, H, N, D) output in the dtype of v.
    """
    b, h, n, _ = _checks.check_qkv(q=q, k=k, v=v, v_prev=v_prev)
    _checks.check_call_options(attn_mask, key_padding_mask, dropout_p, scale, b, h, n)
    _checks.check_elliptical_convention(convention)
    return rescaled_sdpa(q, k, v, v_prev, attn_mask, key_padding_mask, is_causal, dropout_p, scale, convention)


def rescaled_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_prev: torch.Tensor,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    scale: float | None,
    convention: str,
) -> torch.Tensor:
    """:func:`elliptical_attention` without argument checks, in the form TorchScript compiles: (B, H, N, D)."""
    authors_lm = convention == "reference" and is_causal
    m = query_scale(v, v_prev, is_causal and not authors_lm, key_padding_mask)  # (B, H, 1 | N, D)
    if authors_lm and scale is None:
        scale = 1.0
    return masked_sdpa(q * m, k, v, attn_mask, key_padding_mask, is_causal, dropout_p, scale)


def _normalise_by_max(s: torch.Tensor) -> torch.Tensor:
    """``s / max_d s`` over the last dimension, all ones where the maximum is (numerically) zero: same shape."""
    top = s.amax(dim=-1, keepdim=True)  # (..., 1)
    # torch.finfo(s.dtype).tiny of float64 or float32, the dtypes s accumulates in, as literals (TorchScript has no
    # torch.finfo and reads no module-level numbers)
    tiny = 2.2250738585072014e-308 if s.dtype == torch.float64 else 1.1754943508222875e-38
    return torch.where(top > tiny, s / top.clamp_min(tiny), torch.ones_like(s))


def _check_lambd(lambd: float) -> None:
    """Check NeuTRENO's lambda: a finite float >= 0."""
    if isinstance(lambd, bool) or not isinstance(lambd, Real) or not math.isfinite(lambd) or lambd < 0:
        raise AttentionOptionError(
            f"lambd must be a finite float >= 0 (the papers use 0.6 for vision, 0.4 for language), got {lambd!r}"
        )
