"""Argument checks shared by the functional API: each error names the bad value and the fix."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Literal, get_args

import torch

from kpca.attention.errors import AttentionOptionError

Convention = Literal["reference", "pcp"]
"""PAP's conventions (RPC): the authors' mu and threshold, or textbook PCP's."""
CONVENTIONS: tuple[str, ...] = get_args(Convention)
EllipticalConvention = Literal["causal", "reference"]
"""Elliptical's: ours (a strictly causal estimate, 1/sqrt(D) kept) or the authors' code (``kpca.attention.robust``)."""
ELLIPTICAL_CONVENTIONS: tuple[str, ...] = get_args(EllipticalConvention)


def check_qkv(**tensors: torch.Tensor) -> tuple[int, int, int, int]:
    """Check that named tensors are (B, H, N, D) of one shape, dtype and device; return the shape."""
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (B, H, N, D), got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have rank 4, (B, H, N, D), got shape {tuple(t.shape)}; "
                "split heads first, e.g. x.view(B, N, H, D).transpose(1, 2)"
            )
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.shape != first.shape:
            raise ValueError(
                f"{name} shape {tuple(t.shape)} does not match {first_name} shape {tuple(first.shape)}; "
                "they must be equal (B, H, N, D)"
            )
        if t.dtype != first.dtype or t.device != first.device:
            raise TypeError(
                f"{name} is {t.dtype} on {t.device} but {first_name} is {first.dtype} on {first.device}; "
                "cast them to one dtype and device"
            )
    b, h, n, d = first.shape
    return b, h, n, d


def check_attn_mask(attn_mask: torch.Tensor | None, b: int, h: int, n: int) -> None:
    """Check an SDPA-style mask: bool (True = attend) or float (added), broadcastable to (B, H, N, N)."""
    if attn_mask is None:
        return
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(
            f"attn_mask dtype {attn_mask.dtype} is not supported; use bool (True = attend) or a float additive mask"
        )
    try:
        ok = attn_mask.dim() <= 4 and torch.broadcast_shapes(attn_mask.shape, (b, h, n, n)) == (b, h, n, n)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"attn_mask shape {tuple(attn_mask.shape)} does not broadcast to (B, H, N, N) = {(b, h, n, n)}; "
            "use (N, N), (B, 1, N, N) or (B, H, N, N)"
        )


def check_key_padding_mask(key_padding_mask: torch.Tensor | None, b: int, n: int) -> None:
    """Check a (B, N) bool key padding mask (True = padded key, as in nn.MultiheadAttention)."""
    if key_padding_mask is None:
        return
    if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
        got = key_padding_mask.dtype if isinstance(key_padding_mask, torch.Tensor) else type(key_padding_mask).__name__
        raise TypeError(f"key_padding_mask must be a bool tensor (True = padded), got {got}")
    if tuple(key_padding_mask.shape) != (b, n):
        raise ValueError(f"key_padding_mask shape {tuple(key_padding_mask.shape)} must be (B, N) = {(b, n)}")


def check_dropout(dropout_p: float) -> None:
    """Check a dropout probability in [0, 1)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, Real) or not 0.0 <= dropout_p < 1.0:
        raise AttentionOptionError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")


def check_scale(scale: float | None) -> None:
    """Check an optional positive finite softmax scale."""
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, Real) or not math.isfinite(scale) or scale <= 0:
        raise AttentionOptionError(f"scale must be a positive finite float or None (1/sqrt(D)), got {scale!r}")


def check_pap_args(n_iter: int, lambd: float, convention: str, embed_dim: int | None) -> None:
    """Check the PAP hyper-parameters of RPC-Attention."""
    if isinstance(n_iter, bool) or not isinstance(n_iter, Integral):
        raise TypeError(f"n_iter must be an int >= 1, got {n_iter!r} ({type(n_iter).__name__})")
    if n_iter < 1:
        raise AttentionOptionError(f"n_iter must be >= 1 (the number of attention evaluations), got {n_iter}")
    if isinstance(lambd, bool) or not isinstance(lambd, Real):
        raise TypeError(f"lambd must be a positive finite float, got {lambd!r} ({type(lambd).__name__})")
    if not math.isfinite(lambd) or lambd <= 0:
        raise AttentionOptionError(f"lambd must be a positive finite float (the paper uses 4.0), got {lambd!r}")
    if convention not in CONVENTIONS:
        raise AttentionOptionError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    if embed_dim is not None:
        if isinstance(embed_dim, bool) or not isinstance(embed_dim, Integral) or embed_dim < 1:
            raise AttentionOptionError(f"embed_dim must be a positive int or None (H * D), got {embed_dim!r}")
        if convention != "reference":
            raise AttentionOptionError(
                f"embed_dim={embed_dim} only applies to convention='reference'; convention='pcp' uses the head dim D"
            )


def check_call_options(attn_mask, key_padding_mask, dropout_p, scale, b: int, h: int, n: int) -> None:
    """The options every attention function takes beside its tensors: masks of (B, H, N), dropout and scale."""
    check_attn_mask(attn_mask, b, h, n)
    check_key_padding_mask(key_padding_mask, b, n)
    check_dropout(dropout_p)
    check_scale(scale)


def check_elliptical_convention(convention: str) -> None:
    """Check Elliptical's convention: ``causal`` (ours) or ``reference`` (the authors' code)."""
    if convention not in ELLIPTICAL_CONVENTIONS:
        raise AttentionOptionError(
            f"Elliptical's convention must be one of {ELLIPTICAL_CONVENTIONS} (causal: ours, strictly causal; "
            f"reference: the authors' code), got {convention!r}"
        )
