"""The torch backend of PAP: the penalty mu and the element-wise steps (``_triton.ops`` is the Triton one).

The steps are autograd Functions that save one int8 sign mask each.

Notation: K keys, L the last attention output, S the sparse part, Z = Y / mu the scaled dual
(mu is constant across iterations, so the reference's ``Y / mu`` and ``Y += mu * R`` become
``Z`` and ``Z += R`` exactly), tau the shrink threshold. All of these are (B, H, N, D) except tau,
which is (B, H, 1, 1), or (B, H, N, 1) for a causal mu. Arithmetic is in float32 (float64 stays
float64); the cleaned keys come back in the dtype of K for the SDPA call.

A chain of plain autograd ops would save several (B, H, N, D) float tensors per iteration; these
Functions save only ``sign(X) * [|X| > tau]`` as int8, which is all the backward needs because
every other step is linear.

Under ``torch.compile`` on torch 2.11, AOTAutograd traced these Functions into graphs that dropped gradients (the
keys' gradient all zero, the values' 0.4-0.9 off; an upstream issue of the same shape is pytorch/pytorch#180642)
while their forward wrote an intermediate in place and returned an output made by a no-op ``.to(dtype)``. Either
alone still broke them; so no forward here writes in place and no output is such an alias. ``make test-compat``
checks it on torch 2.11; other releases are right with or without it.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

L1_EPS = 1e-12
"""Floor on ||K||_1 in mu = N C / (4 ||K||_1): all-zero keys give a huge, finite mu (and tau)."""


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``: ``t`` itself when it has that dtype, never a no-op ``t.to(dtype)`` (see the module notes)."""
    return t if t.dtype == dtype else t.to(dtype)


def pap_mu(
    k: torch.Tensor,
    width: int,
    *,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """Mu = count * width / (4 ||K||_1) per sample and head, in float32 (float64 for float64 keys).

    Args:
        k: (B, H, N, D) keys.
        width: C (reference convention) or D (pcp convention).
        key_padding_mask: (B, N) bool, True = padded: padded rows count neither in ||K||_1 nor in N.
        is_causal: per-position mu from prefix sums over positions <= t.

    Returns:
        (B, H, 1, 1), or (B, H, N, 1) when causal.
    """
    row_l1 = k.to(_compute_dtype(k)).abs().sum(-1)  # (B, H, N)
    valid = None if key_padding_mask is None else (~key_padding_mask)[:, None, :]  # (B, 1, N)
    if valid is not None:
        row_l1 = row_l1 * valid
    if is_causal:
        count = torch.arange(1, k.shape[2] + 1, device=k.device) if valid is None else valid.cumsum(-1)  # (.., N)
        l1 = row_l1.cumsum(-1)  # (B, H, N)
    else:
        count = torch.tensor(k.shape[2], device=k.device) if valid is None else valid.sum(-1, keepdim=True)
        l1 = row_l1.sum(-1, keepdim=True)  # (B, H, 1)
    mu = count.clamp_min(1).to(l1.dtype) * width / (4 * l1.clamp_min(L1_EPS))  # (B, H, N | 1)
    return mu.unsqueeze(-1)  # (B, H, N | 1, 1)


def shrink_with_sign(x: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Soft threshold of ``x`` at ``tau``.

    Returns:
        ``(shrink(x), clamp(x, -tau, tau), sign)`` where ``shrink(x) = sign(x) max(|x| - tau, 0)``
        and ``sign = sign(x) [|x| > tau]`` as int8, all (B, H, N, D).
    """
    sign = (x > tau).to(torch.int8) - (x < -tau).to(torch.int8)  # (B, H, N, D)
    clamped = torch.clamp(x, min=-tau, max=tau)  # (B, H, N, D)
    return x - clamped, clamped, sign


def _shrink_backward(
    sign: torch.Tensor, grad_shrunk: torch.Tensor, tau_shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the soft threshold w.r.t. its input (in place in ``grad_shrunk``) and its threshold."""
    grad_x = grad_shrunk.masked_fill_(sign == 0, 0.0)  # (B, H, N, D)
    grad_tau = torch.where(sign > 0, -grad_x, grad_x).sum_to_size(tau_shape)  # (B, H, 1 | N, 1)
    return grad_x, grad_tau


def _dense_grad(grad: torch.Tensor | None, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An incoming gradient in ``dtype``; autograd passes None for an output that got no gradient."""
    return torch.zeros(like.shape, dtype=dtype, device=like.device) if grad is None else grad.to(dtype)


def _grad_into_shrink(grad_s: torch.Tensor | None, grad_kt: torch.Tensor) -> torch.Tensor:
    """``grad_s - grad_kt`` as a new tensor; ``grad_s`` is None when S was not used downstream."""
    return -grad_kt if grad_s is None else grad_s - grad_kt


class PapFirst(Function):
    """First PAP step (L = Z = 0): ``S = shrink(K, tau)``, ``Kt = K - S = clamp(K, -tau, tau)``. Returns (S, Kt)."""

    @staticmethod
    def forward(ctx, k: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        s, clamped, sign = shrink_with_sign(k.to(_compute_dtype(k)), tau)
        ctx.save_for_backward(sign)
        ctx.meta = (k.dtype, _compute_dtype(k), tau.shape)
        return s, _cast(clamped, k.dtype)

    @staticmethod
    def backward(ctx, grad_s: torch.Tensor | None, grad_kt: torch.Tensor | None):
        (sign,) = ctx.saved_tensors
        k_dtype, dtype, tau_shape = ctx.meta
        grad_kt = _dense_grad(grad_kt, sign, dtype)
        grad_x, grad_tau = _shrink_backward(sign, _grad_into_shrink(grad_s, grad_kt), tau_shape)
        return grad_x.add_(grad_kt).to(k_dtype), grad_tau


class PapStep(Function):
    """One later PAP step, fusing the dual update of the last iteration with the next shrink.

    Inputs K, tau, L (attention output of the last evaluation), Z (scaled dual before it, or None
    for zero) and S (sparse part before it). Computes::

        Z' = Z + (K - L - S)            # the reference's Y += mu * (K - L - S), divided by mu
        S' = shrink(K - L + Z', tau)
        Kt = K - S' - Z'

    and returns (Z', S', Kt).
    """

    @staticmethod
    def forward(ctx, k, tau, l, z, s):  # noqa: E741 (L is the paper's name)
        ctx.set_materialize_grads(False)
        dtype = _compute_dtype(k)
        kf = k.to(dtype)
        k_minus_l = kf - l.to(dtype)  # (B, H, N, D)
        z_new = k_minus_l - s if z is None else (k_minus_l - s) + z
        s_new, _, sign = shrink_with_sign(k_minus_l + z_new, tau)
        ctx.save_for_backward(sign)
        ctx.meta = (k.dtype, l.dtype, dtype, tau.shape, z is None)
        return z_new, s_new, _cast((kf - s_new) - z_new, k.dtype)

    @staticmethod
    def backward(ctx, grad_z_new, grad_s_new, grad_kt):
        (sign,) = ctx.saved_tensors
        k_dtype, l_dtype, dtype, tau_shape, z_was_none = ctx.meta
        grad_kt = _dense_grad(grad_kt, sign, dtype)
        grad_x, grad_tau = _shrink_backward(sign, _grad_into_shrink(grad_s_new, grad_kt), tau_shape)
        grad_z_total = grad_x - grad_kt  # everything that reaches Z'
        if grad_z_new is not None:
            grad_z_total.add_(grad_z_new)
        grad_l = grad_x.add_(grad_z_total)  # grad_x + grad_z_total, negated below
        grad_k = grad_l + grad_kt
        grad_z = None if z_was_none else grad_z_total
        return grad_k.to(k_dtype), grad_tau, grad_l.neg_().to(l_dtype), grad_z, -grad_z_total
