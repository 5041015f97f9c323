"""A slow, loop-by-loop oracle of softmax attention and PAP, written for clarity from the paper.

It materialises every N x N attention map, loops over samples and heads, keeps the reference
code's variables (Y, not Y / mu) and drops padded rows before attending instead of masking them.
It shares no code with the fast path. Use it in float64 to test the fast path, never in a model.

It also holds the robust-attention family's oracles (Twicing, NeuTRENO, Elliptical), written from their papers and
the authors' code (see ``kpca.attention.robust``).

Legend: B batch, H heads, N tokens, D head dim.
"""

from __future__ import annotations

import math

import torch

L1_EPS = 1e-12  # the same floor on ||K||_1 as the fast path, so that zero keys compare too


def shrink(x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Soft threshold ``sign(x) * max(|x| - tau, 0)``."""
    return torch.sign(x) * torch.clamp(x.abs() - tau, min=0.0)


def attention_map(
    q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool, mask: torch.Tensor | None
) -> torch.Tensor:
    """Row-softmax of ``q kᵀ · scale`` for one (sample, head): (N, N).

    Args:
        q, k: (N, D).
        scale: softmax scale.
        causal: mask keys after each query.
        mask: (N, N) bool (True = attend) or float additive mask, or None.
    """
    scores = q @ k.T * scale  # (N, N)
    if causal:
        n = scores.shape[0]
        future = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.softmax(scores, dim=-1)


def pap_single(
    K: torch.Tensor,  # noqa: N803 (the paper's names)
    V: torch.Tensor,  # noqa: N803
    *,
    n_iter: int,
    lambd: float,
    width: int,
    convention: str = "reference",
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PAP on one (sample, head), exactly as in the paper; returns (L, S, Y), each (N, D).

    Args:
        K, V: (N, D) keys and values of the valid (non-padded) rows.
        n_iter: number of attention evaluations.
        lambd: sparsity weight.
        width: C for the reference convention, D for pcp.
        convention: "reference" (tau = lambd * mu) or "pcp" (tau = lambd / mu).
        causal: per-position mu from keys <= t, causal attention in every evaluation.
        mask: (N, N) bool or float mask applied in every evaluation.
        scale: softmax scale, default 1 / sqrt(D).
    """
    n, d = K.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if causal:
        mu = torch.stack([(t + 1) * width / (4 * torch.clamp(K[: t + 1].abs().sum(), min=L1_EPS)) for t in range(n)])[
            :, None
        ]  # (N, 1)
    else:
        mu = n * width / (4 * torch.clamp(K.abs().sum(), min=L1_EPS))
    tau = lambd / mu if convention == "pcp" else lambd * mu
    L = torch.zeros_like(K)  # noqa: N806
    Y = torch.zeros_like(K)  # noqa: N806
    S = torch.zeros_like(K)  # noqa: N806
    for _ in range(n_iter):
        S = shrink(K - L + Y / mu, tau)  # noqa: N806
        K_clean = K - S - Y / mu  # noqa: N806
        L = attention_map(K_clean, K_clean, scale, causal, mask) @ V  # noqa: N806
        Y = Y + mu * (K - L - S)  # noqa: N806
    return L, S, Y


def _slice_mask(attn_mask: torch.Tensor | None, shape: tuple[int, int, int, int], b: int, h: int, rows):
    if attn_mask is None:
        return None
    return attn_mask.expand(shape)[b, h][rows][:, rows]


def _valid_rows(key_padding_mask: torch.Tensor | None, b: int, n: int) -> torch.Tensor:
    """Indices of the non-padded rows of sample b: (N',)."""
    return torch.arange(n) if key_padding_mask is None else (~key_padding_mask[b].cpu()).nonzero()[:, 0]


def rpc_attention_reference(
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    n_iter: int,
    lambd: float,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    embed_dim: int | None = None,
    convention: str = "reference",
) -> torch.Tensor:
    """RPC-Attention over (B, H, N, D) by looping :func:`pap_single` over samples and heads.

    Padded rows (``key_padding_mask`` True) are removed before PAP and are zero in the output.
    """
    b_size, h_size, n, d = k.shape
    width = d if convention == "pcp" else (embed_dim or h_size * d)
    out = torch.zeros_like(v)
    for b in range(b_size):
        rows = _valid_rows(key_padding_mask, b, n)
        for h in range(h_size):
            L, _, _ = pap_single(  # noqa: N806
                k[b, h, rows],
                v[b, h, rows],
                n_iter=n_iter,
                lambd=lambd,
                width=width,
                convention=convention,
                causal=is_causal,
                mask=_slice_mask(attn_mask, (b_size, h_size, n, n), b, h, rows),
                scale=scale,
            )
            out = out.index_put((torch.tensor(b), torch.tensor(h), rows), L)
    return out


def softmax_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Softmax attention over (B, H, N, D), one materialised map per sample and head."""
    b_size, h_size, n, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros_like(v)
    for b in range(b_size):
        rows = _valid_rows(key_padding_mask, b, n)
        for h in range(h_size):
            mask = _slice_mask(attn_mask, (b_size, h_size, n, n), b, h, rows)
            a = attention_map(q[b, h, rows], k[b, h, rows], scale, is_causal, mask)  # (N', N')
            out = out.index_put((torch.tensor(b), torch.tensor(h), rows), a @ v[b, h, rows])
    return out


def twicing_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Twicing attention over (B, H, N, D): the explicit ``(2A - A²) V`` per sample and head, padded rows zero."""
    b_size, h_size, n, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros_like(v)
    for b in range(b_size):
        rows = _valid_rows(key_padding_mask, b, n)
        for h in range(h_size):
            mask = _slice_mask(attn_mask, (b_size, h_size, n, n), b, h, rows)
            a = attention_map(q[b, h, rows], k[b, h, rows], scale, is_causal, mask)  # (N', N')
            twiced = 2 * a - a @ a  # (N', N')
            out = out.index_put((torch.tensor(b), torch.tensor(h), rows), twiced @ v[b, h, rows])
    return out


def neutreno_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_first: torch.Tensor,
    *,
    lambd: float,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """NeuTRENO over (B, H, N, D): ``A V + lambd (V_first - V)`` per sample and head, padded rows zero."""
    b_size, h_size, n, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros_like(v)
    for b in range(b_size):
        rows = _valid_rows(key_padding_mask, b, n)
        for h in range(h_size):
            mask = _slice_mask(attn_mask, (b_size, h_size, n, n), b, h, rows)
            a = attention_map(q[b, h, rows], k[b, h, rows], scale, is_causal, mask)  # (N', N')
            value = a @ v[b, h, rows] + lambd * (v_first[b, h, rows] - v[b, h, rows])  # (N', D)
            out = out.index_put((torch.tensor(b), torch.tensor(h), rows), value)
    return out


def elliptical_scale_single(v: torch.Tensor, v_prev: torch.Tensor, *, delta: float = 5.0) -> torch.Tensor:
    """Elliptical attention's scale m for one (sample, head), as the authors' code computes it: (1, D).

    ``W = ||(v - v_prev) / delta||_1 over the tokens / N`` (the mean over all N rows given, CLS included), then
    ``W / max_d W``. A zero maximum (no difference at all) gives all ones instead of 0/0.

    Args:
        v, v_prev: (N, D) values of this and of the previous block (the rows the estimate sees).
        delta: the reference's step (5 for vision, 1 for language); it cancels in the max-normalisation.
    """
    quotients = (v - v_prev) / delta  # (N, D)
    w = torch.linalg.vector_norm(quotients, ord=1, dim=0, keepdim=True) / len(v)  # (1, D)
    top = w.max(dim=-1, keepdim=True).values  # (1, 1)
    return torch.where(top > 0, w / top, torch.ones_like(w))


def elliptical_scale_reference(
    v: torch.Tensor,
    v_prev: torch.Tensor,
    *,
    delta: float = 5.0,
    is_causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Elliptical scale m over (B, H, N, D) by looping :func:`elliptical_scale_single` over samples and heads.

    Padded rows are dropped before the estimate. Returns (B, H, 1, D), or (B, H, N, D) when causal (ours): m at
    position t is the estimate over the valid rows <= t (all ones if there are none).
    """
    b_size, h_size, n, d = v.shape
    out = torch.zeros(b_size, h_size, n if is_causal else 1, d, dtype=v.dtype)
    for b in range(b_size):
        rows = _valid_rows(key_padding_mask, b, n)
        for h in range(h_size):
            if not is_causal:
                out[b, h] = elliptical_scale_single(v[b, h, rows], v_prev[b, h, rows], delta=delta)
                continue
            for t in range(n):
                seen = rows[rows <= t]  # the valid rows up to t
                if len(seen):
                    out[b, h, t] = elliptical_scale_single(v[b, h, seen], v_prev[b, h, seen], delta=delta)
                else:
                    out[b, h, t] = 1.0
    return out


def elliptical_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_prev: torch.Tensor,
    *,
    delta: float = 5.0,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    convention: str = "causal",
) -> torch.Tensor:
    """Elliptical attention over (B, H, N, D): softmax attention on the queries times the detached scale m.

    ``convention="reference"`` with ``is_causal``: the authors' LM (lmtool-fwms ``mem_transformer.py``), m from all
    the segment's rows (the estimator of their vision code, seeing later tokens) and scores without 1/sqrt(D).
    """
    authors_lm = convention == "reference" and is_causal
    m = elliptical_scale_reference(
        v.detach(),
        v_prev.detach(),
        delta=delta,
        is_causal=is_causal and not authors_lm,
        key_padding_mask=key_padding_mask,
    )  # (B, H, 1 | N, D)
    if authors_lm and scale is None:
        scale = 1.0
    return softmax_attention_reference(
        q * m, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal, scale=scale
    )
