"""The torch backend of PAP: the penalty mu and the element-wise steps (``_triton.ops`` is the Triton one).

The steps are plain functions (:func:`pap_first`, :func:`pap_step`), which eager calls run inside autograd
Functions that save one int8 sign mask each, and TorchScript compiles into :func:`pap_attention` on plain ops.

Notation: K keys, L the last attention output, S the sparse part, Z = Y / mu the scaled dual
(mu is constant across iterations, so the reference's ``Y / mu`` and ``Y += mu * R`` become
``Z`` and ``Z += R`` exactly), tau the shrink threshold. All of these are (B, H, N, D) except tau,
which is (B, H, 1, 1), or (B, H, N, 1) for a causal mu. Arithmetic is in float32 (float64 stays
float64); the cleaned keys come back in the dtype of K for the SDPA call.

A chain of plain autograd ops (what a TorchScript model runs) saves several (B, H, N, D) float tensors per
iteration; the Functions save only ``sign(X) * [|X| > tau]`` as int8, which is all the backward needs because
every other step is linear.

Under ``torch.compile`` on torch 2.11, AOTAutograd traced these Functions into graphs that dropped gradients (the
keys' gradient all zero, the values' 0.4-0.9 off; an upstream issue of the same shape is pytorch/pytorch#180642)
while their forward wrote an intermediate in place and returned an output made by a no-op ``.to(dtype)``. Either
alone still broke them; so no forward here writes in place and no output is such an alias. ``make test-compat``
checks it on torch 2.11; other releases are right with or without it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function

from kpca.attention._masks import combine_masks

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
    return penalty(k, width, key_padding_mask, is_causal)


def penalty(
    k: torch.Tensor, width: int, key_padding_mask: torch.Tensor | None, is_causal: bool, l1_eps: float = L1_EPS
) -> torch.Tensor:
    """:func:`pap_mu` as TorchScript compiles it: positional arguments, the floor ``L1_EPS`` as a default."""
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
    mu = count.clamp_min(1).to(l1.dtype) * width / (4 * l1.clamp_min(l1_eps))  # (B, H, N | 1)
    return mu.unsqueeze(-1)  # (B, H, N | 1, 1)


def shrink(x: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft threshold of ``x`` at ``tau``: ``(shrink(x), clamp(x, -tau, tau))``, both (B, H, N, D).

    ``shrink(x) = sign(x) max(|x| - tau, 0)``, so the two add up to ``x``.
    """
    if torch.jit.is_scripting():
        # TorchScript's autodiff (torch 2.14) gets the gradient of clamp's tensor bounds wrong once the graph is
        # optimised (from the second call); maximum and minimum give the same values and the right gradient.
        clamped = torch.minimum(torch.maximum(x, -tau), tau)  # (B, H, N, D)
    else:
        clamped = torch.clamp(x, min=-tau, max=tau)  # (B, H, N, D)
    return x - clamped, clamped


def shrink_sign(x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``sign(x) [|x| > tau]`` as int8 (B, H, N, D): all that the backward of :func:`shrink` needs."""
    return (x > tau).to(torch.int8) - (x < -tau).to(torch.int8)


def pap_first(k: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """First PAP step (L = Z = 0) on plain ops: ``(S, Kt, X)``.

    ``S = shrink(K, tau)``, ``Kt = K - S = clamp(K, -tau, tau)`` in K's dtype, and ``X`` the shrink's input (K in
    the compute dtype), all (B, H, N, D). :class:`PapFirst` runs it under its own backward; TorchScript and
    ``torch.fx`` graphs run it under autograd (:func:`pap_attention`).
    """
    x = k.to(_compute_dtype(k))  # (B, H, N, D)
    s, clamped = shrink(x, tau)
    return s, _cast(clamped, k.dtype), x


def pap_step(
    k: torch.Tensor,
    tau: torch.Tensor,
    l: torch.Tensor,  # noqa: E741 (the paper's name)
    z: torch.Tensor | None,
    s: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One later PAP step on plain ops, the dual update of the last iteration fused with the next shrink.

    Computes, with ``z=None`` for zero::

        Z' = Z + (K - L - S)            # the reference's Y += mu * (K - L - S), divided by mu
        S' = shrink(K - L + Z', tau)
        Kt = K - S' - Z'

    and returns ``(Z', S', Kt, X)``, X = K - L + Z' the shrink's input, all (B, H, N, D); Kt in K's dtype.
    """
    dtype = _compute_dtype(k)
    kf = k.to(dtype)
    k_minus_l = kf - l.to(dtype)  # (B, H, N, D)
    z_new = k_minus_l - s if z is None else (k_minus_l - s) + z
    x = k_minus_l + z_new
    s_new, _ = shrink(x, tau)
    return z_new, s_new, _cast((kf - s_new) - z_new, k.dtype), x


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
    """First PAP step (:func:`pap_first`), saving only the shrink's int8 sign for its backward. Returns (S, Kt)."""

    @staticmethod
    def forward(ctx, k: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        s, kt, x = pap_first(k, tau)
        ctx.save_for_backward(shrink_sign(x, tau))
        ctx.meta = (k.dtype, _compute_dtype(k), tau.shape)
        return s, kt

    @staticmethod
    def backward(ctx, grad_s: torch.Tensor | None, grad_kt: torch.Tensor | None):
        (sign,) = ctx.saved_tensors
        k_dtype, dtype, tau_shape = ctx.meta
        grad_kt = _dense_grad(grad_kt, sign, dtype)
        grad_x, grad_tau = _shrink_backward(sign, _grad_into_shrink(grad_s, grad_kt), tau_shape)
        return grad_x.add_(grad_kt).to(k_dtype), grad_tau


class PapStep(Function):
    """One later PAP step (:func:`pap_step`), saving only the shrink's int8 sign for its backward.

    Inputs K, tau, L (attention output of the last evaluation), Z (scaled dual before it, or None
    for zero) and S (sparse part before it); returns (Z', S', Kt).
    """

    @staticmethod
    def forward(ctx, k, tau, l, z, s):  # noqa: E741 (L is the paper's name)
        ctx.set_materialize_grads(False)
        z_new, s_new, kt, x = pap_step(k, tau, l, z, s)
        ctx.save_for_backward(shrink_sign(x, tau))
        ctx.meta = (k.dtype, l.dtype, _compute_dtype(k), tau.shape, z is None)
        return z_new, s_new, kt

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


def pap_attention(
    k: torch.Tensor,
    v: torch.Tensor,
    n_iter: int,
    lambd: float,
    pcp: bool,
    width: int,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
) -> torch.Tensor:
    """``rpc_attention``'s torch backend on plain autograd ops, which TorchScript compiles: (B, H, N, D).

    The same forward operations as ``rpc_attention(..., backend="torch")`` (:func:`pap_first` and :func:`pap_step`
    in the same order, so the same values), with autograd's gradients in place of :class:`PapFirst` and
    :class:`PapStep`'s (the same function, saving more memory). No argument checks: the callers built their inputs.

    Args:
        k, v: (B, H, N, D) keys and values.
        n_iter: attention evaluations, >= 1.
        lambd: sparsity weight.
        pcp: textbook PCP's threshold lambd / mu, else the reference's lambd * mu.
        width: the width in mu (C for the reference convention, D for pcp).
        attn_mask, key_padding_mask, is_causal: as in ``rpc_attention``.
        dropout_p: attention dropout of the last evaluation.
    """
    mask, causal = combine_masks(attn_mask, key_padding_mask, is_causal, k.shape[2], k.device)
    mu = penalty(k, width, key_padding_mask, is_causal)  # (B, H, 1 | N, 1)
    tau = lambd / mu if pcp else lambd * mu
    s, kt, _ = pap_first(k, tau)  # (B, H, N, D) each
    last = dropout_p if n_iter == 1 else 0.0
    l = F.scaled_dot_product_attention(kt, kt, v, attn_mask=mask, dropout_p=last, is_causal=causal)  # noqa: E741
    z: torch.Tensor | None = None
    for i in range(1, n_iter):
        z, s, kt, _ = pap_step(k, tau, l, z, s)
        last = dropout_p if i == n_iter - 1 else 0.0
        l = F.scaled_dot_product_attention(kt, kt, v, attn_mask=mask, dropout_p=last, is_causal=causal)  # noqa: E741
    return l
