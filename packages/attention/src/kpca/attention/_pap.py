"""The PAP element-wise steps as autograd Functions that save one int8 sign mask each.

Notation: K keys, L the last attention output, S the sparse part, Z = Y / mu the scaled dual
(mu is constant across iterations, so the reference's ``Y / mu`` and ``Y += mu * R`` become
``Z`` and ``Z += R`` exactly), tau the shrink threshold. All of these are (B, H, N, D) except tau,
which is (B, H, 1, 1), or (B, H, N, 1) for a causal mu. Arithmetic is in float32 (float64 stays
float64); the cleaned keys come back in the dtype of K for the SDPA call.

A chain of plain autograd ops would save several (B, H, N, D) float tensors per iteration; these
Functions save only ``sign(X) * [|X| > tau]`` as int8, which is all the backward needs because
every other step is linear.
"""

from __future__ import annotations

import torch
from torch.autograd import Function


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def shrink_with_sign(x: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft threshold ``sign(x) * max(|x| - tau, 0)`` and the int8 ``sign(x) * [|x| > tau]``."""
    sign = (x > tau).to(torch.int8) - (x < -tau).to(torch.int8)  # (B, H, N, D)
    shrunk = x - torch.minimum(torch.maximum(x, -tau), tau)  # (B, H, N, D)
    return shrunk, sign


def _shrink_backward(
    sign: torch.Tensor, grad_shrunk: torch.Tensor, tau_shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the soft threshold w.r.t. its input and (summed to tau's shape) its threshold."""
    grad_x = grad_shrunk * sign.abs()  # (B, H, N, D)
    grad_tau = -(grad_shrunk * sign).sum_to_size(tau_shape)  # (B, H, 1 | N, 1)
    return grad_x, grad_tau


class PapFirst(Function):
    """First PAP step (L = Z = 0): ``S = shrink(K, tau)``, ``Kt = K - S``. Returns (S, Kt)."""

    @staticmethod
    def forward(ctx, k: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kf = k.to(_compute_dtype(k))
        s, sign = shrink_with_sign(kf, tau)
        ctx.save_for_backward(sign)
        ctx.meta = (k.dtype, tau.shape)
        return s, (kf - s).to(k.dtype)

    @staticmethod
    def backward(ctx, grad_s: torch.Tensor, grad_kt: torch.Tensor):
        (sign,) = ctx.saved_tensors
        k_dtype, tau_shape = ctx.meta
        grad_kt = grad_kt.to(grad_s.dtype)
        grad_x, grad_tau = _shrink_backward(sign, grad_s - grad_kt, tau_shape)
        return (grad_kt + grad_x).to(k_dtype), grad_tau


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
        dtype = _compute_dtype(k)
        kf, lf = k.to(dtype), l.to(dtype)
        z_new = kf - lf - s if z is None else z + (kf - lf - s)  # (B, H, N, D)
        s_new, sign = shrink_with_sign(kf - lf + z_new, tau)
        ctx.save_for_backward(sign)
        ctx.meta = (k.dtype, l.dtype, tau.shape, z is None)
        return z_new, s_new, (kf - s_new - z_new).to(k.dtype)

    @staticmethod
    def backward(ctx, grad_z_new, grad_s_new, grad_kt):
        (sign,) = ctx.saved_tensors
        k_dtype, l_dtype, tau_shape, z_was_none = ctx.meta
        grad_kt = grad_kt.to(grad_s_new.dtype)
        grad_x, grad_tau = _shrink_backward(sign, grad_s_new - grad_kt, tau_shape)
        grad_z_total = grad_z_new - grad_kt + grad_x  # everything that reaches Z'
        grad_k = grad_kt + grad_x + grad_z_total
        grad_l = -(grad_x + grad_z_total)
        grad_z = None if z_was_none else grad_z_total
        return grad_k.to(k_dtype), grad_tau, grad_l.to(l_dtype), grad_z, -grad_z_total
