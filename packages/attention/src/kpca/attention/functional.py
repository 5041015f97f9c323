"""Softmax attention and RPC-Attention (Principal Attention Pursuit) on (B, H, N, D) tensors.

Legend: B batch, H heads, N tokens, D head dim, C = H * D model width.
Every attention evaluation is one ``F.scaled_dot_product_attention`` call, so no N x N tensor
exists where SDPA uses a fused kernel (CPU flash, CUDA flash / memory-efficient / cuDNN).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kpca.attention import _checks
from kpca.attention._backend import Backend, resolve_backend, run_on_backend
from kpca.attention._checks import Convention
from kpca.attention._masks import combine_masks, masked_sdpa
from kpca.attention._pap import PapFirst, PapStep, pap_mu


@dataclass(frozen=True)
class RPCState:
    """PAP state after the last iteration, for diagnostics and logging (all tensors detached).

    Attributes:
        s: (B, H, N, D) sparse part S used by the last evaluation (float32, float64 for float64 input).
        l: (B, H, N, D) low-rank part L, the output of the last evaluation.
        y: (B, H, N, D) dual Y after the final update ``Y + mu (K - L - S)``.
        k_clean: (B, H, N, D) cleaned keys Kt of the last evaluation (its queries and keys).
        mu: (B, H, 1, 1), or (B, H, N, 1) when causal: the penalty mu of each (sample, head[, position]).
        residual: (n_iter, B, H) primal residual ||K - L_i - S_i||_F after evaluation i (valid rows only).
        nonzero_fraction: (n_iter, B, H) fraction of non-zero entries of S_i (valid rows only).
    """

    s: torch.Tensor
    l: torch.Tensor  # noqa: E741 (the paper's name)
    y: torch.Tensor
    k_clean: torch.Tensor
    mu: torch.Tensor
    residual: torch.Tensor
    nonzero_fraction: torch.Tensor


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Scaled dot-product softmax attention ``softmax(q kᵀ · scale + mask) v``.

    Args:
        q, k, v: (B, H, N, D) tensors of one dtype and device. Pass ``q = k`` for symmetric attention.
        attn_mask: bool (True = attend) or float additive mask broadcastable to (B, H, N, N).
        key_padding_mask: (B, N) bool, True marks padded keys, which no query attends to.
        is_causal: query t attends to keys <= t only (combinable with the masks above).
        dropout_p: dropout on the attention probabilities (pass 0.0 in eval mode).
        scale: softmax scale, default 1 / sqrt(D).
        backend: "auto", "torch" or "triton" (see ``kpca.attention.set_backend``). The evaluation is
            one SDPA call on every backend; an explicit "triton" raises on inputs its kernels cannot take.

    Returns:
        (B, H, N, D) attention output in the dtype of v.
    """
    b, h, n, _ = _checks.check_qkv(q=q, k=k, v=v)
    _checks.check_call_options(attn_mask, key_padding_mask, dropout_p, scale, b, h, n)
    resolve_backend(backend, q)  # one SDPA call on every backend; an explicit "triton" still checks the inputs
    return masked_sdpa(q, k, v, attn_mask, key_padding_mask, is_causal, dropout_p, scale)


def rpc_attention(
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    n_iter: int,
    lambd: float,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    embed_dim: int | None = None,
    convention: Convention = "reference",
    return_state: bool = False,
    backend: Backend = "auto",
) -> torch.Tensor | tuple[torch.Tensor, RPCState]:
    """RPC-Attention: Principal Attention Pursuit with ``n_iter`` symmetric softmax evaluations.

    Per sample and head, with Z = Y / mu (zero init) and S = L = 0::

        S  = shrink(K - L + Z, tau)
        Kt = K - S - Z
        L  = softmax(Kt Ktᵀ · scale) V          # one SDPA call, q = k = Kt
        Z  = Z + (K - L - S)

    repeated ``n_iter`` times; the output is the last L. With ``convention="reference"`` (the
    authors' code, the default) ``mu = N C / (4 ||K||_1)`` with C = ``embed_dim`` (default H * D)
    and ``tau = lambd * mu``; with ``convention="pcp"`` (textbook PCP) ``mu = N D / (4 ||K||_1)``
    and ``tau = lambd / mu``. ||K||_1 sums |K| over the (N, D) slice of each sample and head,
    floored at ``L1_EPS`` (1e-12, in ``_pap``); mu and the shrink run in float32 (float64 for
    float64 input), also under autocast. Gradients flow through every step and through mu.

    Args:
        k: (B, H, N, D) keys (queries are the keys: RPC-Attention is symmetric).
        v: (B, H, N, D) values.
        n_iter: number of attention evaluations, >= 1. ``n_iter=1`` is symmetric attention on keys
            clipped to [-tau, tau].
        lambd: sparsity weight lambda > 0 (the paper uses 4).
        attn_mask: bool (True = attend) or float additive mask broadcastable to (B, H, N, N),
            applied in every evaluation (it does not change mu).
        key_padding_mask: (B, N) bool, True = padded. Padded keys are left out of mu and out of
            attention; outputs at padded positions are unspecified (finite).
        is_causal: strictly causal: mu at position t comes from keys <= t only (prefix sums,
            ``mu_t = (t + 1) C / (4 sum_{s<=t} |K_s|_1)``) and every evaluation is causal.
        dropout_p: attention dropout, applied in the last evaluation only (0.0 in eval mode).
        scale: softmax scale, default 1 / sqrt(D).
        embed_dim: the width C in mu for ``convention="reference"``; default H * D.
        convention: ``"reference"`` or ``"pcp"``, see above.
        return_state: also return an :class:`RPCState` with S, L, Y, mu and per-iteration residuals.
        backend: "auto" (the global default, else Triton for supported CUDA inputs, else torch; if
            a one-kernel Triton check fails before its first use in the process, one warning and torch
            from then on; errors of the call itself always raise),
            "torch" or "triton" (the PAP element-wise steps and mu as Triton kernels; CUDA float32,
            bfloat16 or float16 with D <= 256, else it raises). See ``kpca.attention.set_backend``.

    Returns:
        (B, H, N, D) output in the dtype of v, and the :class:`RPCState` if ``return_state``.
    """
    b, h, n, d = _checks.check_qkv(k=k, v=v)
    _checks.check_call_options(attn_mask, key_padding_mask, dropout_p, scale, b, h, n)
    _checks.check_pap_args(n_iter, lambd, convention, embed_dim)
    width = d if convention == "pcp" else (embed_dim or h * d)
    mask, causal = combine_masks(attn_mask, key_padding_mask, is_causal, n, k.device)

    def pursue(impl: str) -> torch.Tensor | tuple[torch.Tensor, RPCState]:
        if impl == "triton":
            from kpca.attention._triton import ops  # imported on first use: triton is optional

            pap_first, pap_step = ops.pap_first, ops.pap_step
            pcp = convention == "pcp"
            # tau comes out of the mu kernel, one per row: no torch op for lambd * mu, none to sum its gradient
            tau = ops.pap_tau(k, width, lambd, pcp=pcp, key_padding_mask=key_padding_mask, is_causal=is_causal)
            mu = None
            if return_state:  # for the state alone: its own two launches, no gradient
                mu = ops.pap_mu(k.detach(), width, key_padding_mask=key_padding_mask, is_causal=is_causal)
        else:
            pap_first, pap_step = PapFirst.apply, PapStep.apply
            mu = pap_mu(k, width, key_padding_mask=key_padding_mask, is_causal=is_causal)
            tau = lambd / mu if convention == "pcp" else lambd * mu

        def attend(kt: torch.Tensor, last: bool) -> torch.Tensor:
            p = dropout_p if last else 0.0
            return F.scaled_dot_product_attention(kt, kt, v, attn_mask=mask, is_causal=causal, dropout_p=p, scale=scale)

        s, kt = pap_first(k, tau)
        l = attend(kt, n_iter == 1)  # noqa: E741
        z = None
        diagnostics = [_iteration_diagnostics(k, l, s, key_padding_mask)] if return_state else []
        for i in range(1, n_iter):
            z, s, kt = pap_step(k, tau, l, z, s)
            l = attend(kt, i == n_iter - 1)  # noqa: E741
            if return_state:
                diagnostics.append(_iteration_diagnostics(k, l, s, key_padding_mask))
        if not return_state:
            return l
        return l, _final_state(k, l, s, z, kt, mu, diagnostics)

    return run_on_backend(backend, k, pursue)


@torch.no_grad()
def _iteration_diagnostics(
    k: torch.Tensor,
    l: torch.Tensor,  # noqa: E741
    s: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Primal residual ||K - L - S||_F and the non-zero fraction of S, each (B, H), over valid rows."""
    valid = torch.ones_like(k[..., :1]) if key_padding_mask is None else (~key_padding_mask)[:, None, :, None]
    residual = ((k.to(s.dtype) - l.to(s.dtype) - s) * valid).square().sum((-2, -1)).sqrt()  # (B, H)
    nonzero = ((s != 0) & valid.bool()).sum((-2, -1)).to(s.dtype)  # (B, H)
    total = (valid.sum((-2, -1)) * k.shape[-1]).clamp_min(1).to(s.dtype)  # (B | 1, 1 | H)
    return residual, nonzero / total


@torch.no_grad()
def _final_state(k, l, s, z, kt, mu, diagnostics) -> RPCState:  # noqa: E741
    """Assemble the detached RPCState; Y after its final update is mu (Z + K - L - S)."""
    residual_now = k.to(s.dtype) - l.to(s.dtype) - s
    z_final = residual_now if z is None else z + residual_now
    residuals, fractions = zip(*diagnostics, strict=True)
    return RPCState(
        s=s.detach(),
        l=l.detach(),
        y=(mu * z_final).detach(),
        k_clean=kt.detach(),
        mu=mu.detach(),
        residual=torch.stack(residuals),
        nonzero_fraction=torch.stack(fractions),
    )
