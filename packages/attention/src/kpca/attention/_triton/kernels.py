"""Triton kernels (``@triton.jit`` only) for the PAP element-wise steps and the mu reduction.

Legend: B batch, H heads, N tokens, D head dim; R = B * H * N rows of D columns, BLOCK_D = next_pow2(D).

What is here, and what the launchers in ``ops.py`` pass:

* ``pap_first_fwd`` / ``pap_first_bwd``: ``_pap.PapFirst``, one pass each over memory.
* ``pap_step_fwd`` / ``pap_step_bwd``: ``_pap.PapStep`` (dual update fused with the next shrink
  and the cleaned keys), one pass each.
* ``row_l1`` / ``mu_scan`` (forward) and ``mu_grad_scan`` / ``row_l1_bwd`` (backward): mu from the
  per-row L1 norms of K, with key padding (read as the caller's bool mask) and the causal
  prefix-sum form. ``mu_scan`` writes the threshold itself, tau = lambd * mu (reference
  convention; mu itself for lambd = 1) or lambd / mu (pcp), per slice or one per row, so no
  torch op computes tau; ``mu_grad_scan`` takes tau's gradient, summing per-row ones itself.

Launches per ``rpc_attention(n_iter)``: n_iter + 2 forward (``row_l1``, ``mu_scan``,
``pap_first_fwd``, n_iter - 1 ``pap_step_fwd``) and n_iter + 2 backward
(``tests/attention/test_triton_launch_budget.py`` holds the budget).

Tiles: the element-wise kernels run on a 2-D grid (B * H, cdiv(N, BLOCK_N)), one (b, h) slice
per program on axis 0 (CUDA allows 2^31 - 1 there, 65535 on axis 1), so (b, h) costs one
division per program instead of one per row. They read strided (B, H, N, D) views of K and L
(forward) and of the cleaned keys' gradient (backward: SDPA returns it (B, N, H, D) in memory, and
a ``.contiguous()`` copy would cost a full pass) and write contiguous tensors. The head dim D is a
``tl.constexpr``: every D gets its own kernel, and the column mask and the contiguous offsets
``row * D`` keep their alignment, so loads and stores stay vectorised when D is not a multiple of
16 (D = 40 or 72; strided rows also need the ``ALIGN`` hint the launchers pass). Strided offsets
are int64 products, so no stride wraps in int32.

Tested on CPU under ``TRITON_INTERPRET=1`` (``tests/attention/test_triton_backend.py``), forward
and backward against the torch path: float32, bfloat16 and float16 inputs (K and L; S, Z, tau and
mu are float32) with D in {2, 3, 4, 40, 72}, N up to 300 (several scan blocks), NaN and inf
inputs. ``tests/attention/test_triton_aot.py`` compiles to sm_90, without a GPU, the
specialisations ``rpc_attention`` forward and backward asks the JIT for at D in {40, 64, 72, 128}
in bfloat16 and float32 (the modules' strided layout, N = 197, and a causal N = 1024 at D = 64),
and checks that none spills registers at D in {40, 64, 72}. The ``gpu`` tests (real shapes, a
second device, determinism) are written but have not run on a GPU yet. D <= 256
(``_backend.MAX_HEAD_DIM``).

Known differences from the torch path:

* Element-wise outputs (S, Z, Kt) and their input gradients are bit-identical to
  ``_pap.PapFirst`` / ``_pap.PapStep`` (same float32 operations in the same order); NaN propagates
  through the clamps as in ``torch.clamp`` (``propagate_nan=ALL``; Triton's default drops NaN).
* Element-wise means given the same tau: the threshold gradient and mu are sums in another order
  (per-row sums, then tree scans in float32; torch's CPU cumsum accumulates in float64), so they,
  and tau, agree to float32 rounding, not bits. From one mu, tau takes torch's operations in
  torch's order (``lambd * mu``; ``lambd / mu`` as ``mu.reciprocal() * lambd``), and the divisions
  round to nearest (``div_rn``), like torch's.
* No atomics anywhere: every kernel is deterministic run to run.
* Loaded values are cast to float32 right after loading (bf16 arithmetic is not supported by the
  interpreter, and the torch path computes in float32 as well).
* Under the interpreter only, float32 -> bfloat16 stores truncate instead of rounding to nearest
  even (triton 3.8's interpreter cast), so bf16 outputs there may differ by one ulp; compiled
  kernels round like torch.
"""

# Triton conventions: upper-case size and constexpr arguments, constexpr branches as if-blocks.
# ruff: noqa: N803, SIM108

from __future__ import annotations

import triton
import triton.language as tl

__all__ = (
    "pap_first_fwd",
    "pap_first_bwd",
    "pap_step_fwd",
    "pap_step_bwd",
    "row_l1",
    "mu_scan",
    "mu_grad_scan",
    "row_l1_bwd",
)


@triton.jit
def _slice_tile(N, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Tile of program (bh, block) on the 2-D grid (B * H, cdiv(N, BLOCK_N)): BLOCK_N tokens of one (b, h) slice.

    Returns the slice index bh (int64 scalar), the token indices n (BLOCK_N,), their rows bh * N + n
    in a contiguous (R, D) tensor (BLOCK_N,) int64, the columns (BLOCK_D,), the row mask (BLOCK_N,)
    and the tile mask (BLOCK_N, BLOCK_D).
    """
    bh = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    row_mask = n < N
    rows = bh * N + n  # (BLOCK_N,)
    cols = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    mask = row_mask[:, None] & (cols < D)[None, :]  # (BLOCK_N, BLOCK_D)
    return bh, n, rows, cols, row_mask, mask


@triton.jit
def _strided(bh, n, cols, H, s_b, s_h, s_n, s_d, ALIGN: tl.constexpr):
    """Offsets (BLOCK_N, BLOCK_D) of tokens n, columns cols of slice bh in a (B, H, N, D) tensor of strides s_*.

    The slice's (b, h) costs one division per program; every product is int64, so no stride wraps.
    ALIGN divides every row's start (see ``ops._row_alignment``): with it, rows load as vectors
    even where the JIT cannot see that a stride is a multiple of 8 (s_h = D = 72 or 40).
    """
    base = (bh // H) * s_b + (bh % H) * s_h  # int64 scalar
    starts = tl.multiple_of(base + n.to(tl.int64) * s_n, ALIGN)  # (BLOCK_N,)
    return starts[:, None] + (cols.to(tl.int64) * s_d)[None, :]


@triton.jit
def _threshold(tau_ptr, bh, rows, row_mask, TAU_PER_ROW: tl.constexpr):
    """The tile's tau: (BLOCK_N, 1) when there is one per row (causal mu), else the slice's scalar."""
    if TAU_PER_ROW:
        tau = tl.load(tau_ptr + rows, mask=row_mask, other=0.0)[:, None]
    else:
        tau = tl.load(tau_ptr + bh)
    return tau


@triton.jit
def _shrink(x, tau):
    """Soft threshold as in ``_pap.shrink`` / ``shrink_sign``: (x - clamp(x, -tau, tau), clamp, sign); NaN stays NaN."""
    clamped = tl.minimum(tl.maximum(x, -tau, propagate_nan=tl.PropagateNan.ALL), tau, propagate_nan=tl.PropagateNan.ALL)
    sign = (x > tau).to(tl.int8) - (x < -tau).to(tl.int8)
    return x - clamped, clamped, sign


@triton.jit
def _shrink_grad(sign, g):
    """Input gradient of the soft threshold and its per-row threshold gradient (BLOCK_N,)."""
    grad_x = tl.where(sign == 0, 0.0, g)
    grad_tau = tl.sum(tl.where(sign > 0, -grad_x, grad_x), axis=1)
    return grad_x, grad_tau


@triton.jit
def pap_first_fwd(
    k_ptr, tau_ptr, s_ptr, kt_ptr, sign_ptr,
    H, N, s_kb, s_kh, s_kn, s_kd,
    D: tl.constexpr, K_ALIGN: tl.constexpr, TAU_PER_ROW: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """S = shrink(K, tau) (float32), Kt = clamp(K, -tau, tau) (K's dtype) and the int8 sign."""
    bh, n, rows, cols, row_mask, mask = _slice_tile(N, D, BLOCK_N, BLOCK_D)
    out = rows[:, None] * D + cols[None, :]  # contiguous (R, D) offsets
    x = tl.load(k_ptr + _strided(bh, n, cols, H, s_kb, s_kh, s_kn, s_kd, K_ALIGN), mask=mask, other=0.0).to(tl.float32)
    s, clamped, sign = _shrink(x, _threshold(tau_ptr, bh, rows, row_mask, TAU_PER_ROW))
    tl.store(s_ptr + out, s, mask=mask)
    tl.store(kt_ptr + out, clamped.to(kt_ptr.dtype.element_ty), mask=mask)
    tl.store(sign_ptr + out, sign, mask=mask)


@triton.jit
def _shrink_input_grads(
    sign_ptr, gs_ptr, gkt_ptr, off, gkt_off, mask,
    HAS_GS: tl.constexpr, HAS_GKT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Shared start of the backward kernels: ``g_Kt`` (zeros when absent) and the shrink's gradients.

    ``off`` are the tile's contiguous offsets (sign, g_S), ``gkt_off`` its offsets in the strided g_Kt.
    The shrink's input and threshold gradients are those of ``g_S - g_Kt``.
    """
    sign = tl.load(sign_ptr + off, mask=mask, other=0)
    if HAS_GKT:
        g_kt = tl.load(gkt_ptr + gkt_off, mask=mask, other=0.0).to(tl.float32)
    else:
        g_kt = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    if HAS_GS:
        g = tl.load(gs_ptr + off, mask=mask, other=0.0).to(tl.float32) - g_kt
    else:
        g = -g_kt
    grad_x, grad_tau = _shrink_grad(sign, g)
    return g_kt, grad_x, grad_tau


@triton.jit
def pap_first_bwd(
    sign_ptr, gs_ptr, gkt_ptr, gk_ptr, gtau_ptr,
    H, N, s_gb, s_gh, s_gn, s_gd,
    D: tl.constexpr, GKT_ALIGN: tl.constexpr, HAS_GS: tl.constexpr, HAS_GKT: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Gradient of K, ``shrink'(g_S - g_Kt) + g_Kt``, and per-row threshold gradients (R,); g_Kt strided."""
    bh, n, rows, cols, row_mask, mask = _slice_tile(N, D, BLOCK_N, BLOCK_D)
    off = rows[:, None] * D + cols[None, :]
    gkt_off = _strided(bh, n, cols, H, s_gb, s_gh, s_gn, s_gd, GKT_ALIGN)
    g_kt, grad_x, grad_tau = _shrink_input_grads(
        sign_ptr, gs_ptr, gkt_ptr, off, gkt_off, mask, HAS_GS, HAS_GKT, BLOCK_N, BLOCK_D
    )
    tl.store(gk_ptr + off, (grad_x + g_kt).to(gk_ptr.dtype.element_ty), mask=mask)
    tl.store(gtau_ptr + rows, grad_tau, mask=row_mask)


@triton.jit
def pap_step_fwd(
    k_ptr, l_ptr, tau_ptr, z_ptr, s_ptr, z_new_ptr, s_new_ptr, kt_ptr, sign_ptr,
    H, N, s_kb, s_kh, s_kn, s_kd, s_lb, s_lh, s_ln, s_ld,
    D: tl.constexpr, K_ALIGN: tl.constexpr, L_ALIGN: tl.constexpr, TAU_PER_ROW: tl.constexpr, HAS_Z: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Z' = Z + (K - L - S), S' = shrink(K - L + Z', tau), Kt = K - S' - Z' and the sign of S'."""
    bh, n, rows, cols, row_mask, mask = _slice_tile(N, D, BLOCK_N, BLOCK_D)
    out = rows[:, None] * D + cols[None, :]
    k = tl.load(k_ptr + _strided(bh, n, cols, H, s_kb, s_kh, s_kn, s_kd, K_ALIGN), mask=mask, other=0.0).to(tl.float32)
    l = tl.load(l_ptr + _strided(bh, n, cols, H, s_lb, s_lh, s_ln, s_ld, L_ALIGN), mask=mask, other=0.0).to(tl.float32)  # noqa: E741
    s = tl.load(s_ptr + out, mask=mask, other=0.0)
    k_minus_l = k - l
    z_new = k_minus_l - s
    if HAS_Z:
        z_new = z_new + tl.load(z_ptr + out, mask=mask, other=0.0)
    s_new, _, sign = _shrink(k_minus_l + z_new, _threshold(tau_ptr, bh, rows, row_mask, TAU_PER_ROW))
    tl.store(z_new_ptr + out, z_new, mask=mask)
    tl.store(s_new_ptr + out, s_new, mask=mask)
    tl.store(kt_ptr + out, ((k - s_new) - z_new).to(kt_ptr.dtype.element_ty), mask=mask)
    tl.store(sign_ptr + out, sign, mask=mask)


@triton.jit
def pap_step_bwd(
    sign_ptr, gz_new_ptr, gs_new_ptr, gkt_ptr, gk_ptr, gl_ptr, gz_ptr, gs_ptr, gtau_ptr,
    H, N, s_gb, s_gh, s_gn, s_gd,
    D: tl.constexpr, GKT_ALIGN: tl.constexpr, HAS_GZ: tl.constexpr, HAS_GS: tl.constexpr, HAS_GKT: tl.constexpr,
    NEED_GZ: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Gradients of ``pap_step_fwd`` w.r.t. K, L, Z, S and per-row threshold gradients (R,); g_Kt strided."""
    bh, n, rows, cols, row_mask, mask = _slice_tile(N, D, BLOCK_N, BLOCK_D)
    off = rows[:, None] * D + cols[None, :]
    gkt_off = _strided(bh, n, cols, H, s_gb, s_gh, s_gn, s_gd, GKT_ALIGN)
    g_kt, grad_x, grad_tau = _shrink_input_grads(
        sign_ptr, gs_new_ptr, gkt_ptr, off, gkt_off, mask, HAS_GS, HAS_GKT, BLOCK_N, BLOCK_D
    )
    grad_z_total = grad_x - g_kt  # everything that reaches Z'
    if HAS_GZ:
        grad_z_total = grad_z_total + tl.load(gz_new_ptr + off, mask=mask, other=0.0).to(tl.float32)
    grad_l = grad_x + grad_z_total  # negated when stored
    tl.store(gk_ptr + off, (grad_l + g_kt).to(gk_ptr.dtype.element_ty), mask=mask)
    tl.store(gl_ptr + off, (-grad_l).to(gl_ptr.dtype.element_ty), mask=mask)
    if NEED_GZ:
        tl.store(gz_ptr + off, grad_z_total, mask=mask)
    tl.store(gs_ptr + off, -grad_z_total, mask=mask)
    tl.store(gtau_ptr + rows, grad_tau, mask=row_mask)


@triton.jit
def _unpadded(pad_ptr, bh, n, row_mask, H, N):
    """1.0 for the tile's unpadded rows and 0.0 for padded ones (BLOCK_N,), from the (B, N) bool padding mask."""
    padded = tl.load(pad_ptr + (bh // H) * N + n, mask=row_mask, other=0) != 0
    return tl.where(padded, 0.0, 1.0)


@triton.jit
def row_l1(
    k_ptr, pad_ptr, out_ptr,
    H, N, s_kb, s_kh, s_kn, s_kd,
    D: tl.constexpr, K_ALIGN: tl.constexpr, HAS_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Per-row L1 norm ``sum_d |K|`` in float32, times 0 for padded rows: (R,)."""
    bh, n, rows, cols, row_mask, mask = _slice_tile(N, D, BLOCK_N, BLOCK_D)
    x = tl.load(k_ptr + _strided(bh, n, cols, H, s_kb, s_kh, s_kn, s_kd, K_ALIGN), mask=mask, other=0.0).to(tl.float32)
    l1 = tl.sum(tl.abs(x), axis=1)  # (BLOCK_N,)
    if HAS_PAD:
        l1 = l1 * _unpadded(pad_ptr, bh, n, row_mask, H, N)
    tl.store(out_ptr + rows, l1, mask=row_mask)


@triton.jit
def _tau(count, width, l1, eps, lambd, PCP: tl.constexpr):
    """The threshold from mu = ``count * width / (4 max(l1, eps))`` in the order and rounding of ``_pap.pap_mu``.

    ``lambd * mu`` (reference convention), or ``lambd / mu`` (pcp) as torch computes a scalar over a tensor:
    ``mu.reciprocal() * lambd``. Divisions round to nearest (``div_rn``), like torch's.
    """
    mu = tl.div_rn(count * width, 4 * tl.maximum(l1, eps, propagate_nan=tl.PropagateNan.ALL))
    if PCP:
        tau = tl.div_rn(1.0, mu) * lambd
    else:
        tau = lambd * mu
    return tau


@triton.jit
def _tau_grad(grad_tau, tau, l1, eps, PCP: tl.constexpr):
    """``grad_tau * dtau/d||K||_1``, 0 where the eps floor is active (as clamp_min's gradient).

    ``-grad_tau tau / ||K||_1`` in the reference convention (tau ~ 1 / ||K||_1), ``+`` with pcp (tau ~ ||K||_1).
    """
    if PCP:
        scaled = grad_tau * tau
    else:
        scaled = -grad_tau * tau
    return tl.where(l1 >= eps, tl.div_rn(scaled, tl.maximum(l1, eps, propagate_nan=tl.PropagateNan.ALL)), 0.0)


@triton.jit
def mu_scan(
    row_l1_ptr, pad_ptr, tau_ptr, l1_ptr,
    H, N, width, eps, lambd,
    HAS_PAD: tl.constexpr, CAUSAL: tl.constexpr, PCP: tl.constexpr, PER_ROW: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One (sample, head) per program: the threshold tau of mu = count * width / (4 max(||K||_1, eps)), and ||K||_1.

    Causal: per position from prefix sums, (N,) each. Otherwise one ||K||_1 and one tau, which is
    written to each of the N rows when PER_ROW (the layout the PAP steps take, so that their
    threshold gradients need no reduction of their own). A NaN norm gives a NaN tau (``clamp_min``
    keeps NaN too).
    """
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    l1_carry = 0.0
    count_carry = 0.0
    for start in range(0, N, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        in_range = n < N
        r = tl.load(row_l1_ptr + bh * N + n, mask=in_range, other=0.0)
        if HAS_PAD:
            valid = tl.where(tl.load(pad_ptr + b * N + n, mask=in_range, other=1) != 0, 0.0, 1.0)
        else:
            valid = in_range.to(tl.float32)
        if CAUSAL:
            l1 = l1_carry + tl.cumsum(r, axis=0)
            count = tl.maximum(count_carry + tl.cumsum(valid, axis=0), 1.0)
            tl.store(tau_ptr + bh * N + n, _tau(count, width, l1, eps, lambd, PCP), mask=in_range)
            tl.store(l1_ptr + bh * N + n, l1, mask=in_range)
        l1_carry += tl.sum(r, axis=0)
        count_carry += tl.sum(valid, axis=0)
    if not CAUSAL:
        tau = _tau(tl.maximum(count_carry, 1.0), width, l1_carry, eps, lambd, PCP)
        tl.store(l1_ptr + bh, l1_carry)
        if PER_ROW:
            for start in range(0, N, BLOCK_N):
                n = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
                tl.store(tau_ptr + bh * N + n, tl.zeros((BLOCK_N,), tl.float32) + tau, mask=n < N)
        else:
            tl.store(tau_ptr + bh, tau)


@triton.jit
def mu_grad_scan(
    grad_tau_ptr, tau_ptr, l1_ptr, g_row_ptr,
    N, eps,
    CAUSAL: tl.constexpr, PCP: tl.constexpr, GRAD_PER_ROW: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Gradient reaching each row's L1 norm from the threshold's, one (sample, head) per program.

    With g_t = grad_tau_t * dtau_t/d||K||_1, row n gets ``sum_{t >= n} g_t`` when causal (a reverse
    prefix sum, (N,)) and g otherwise (one value); GRAD_PER_ROW (not causal): tau and its gradient
    come one per row, as ``mu_scan`` wrote them with PER_ROW, and the row gradients are summed first.
    """
    bh = tl.program_id(0).to(tl.int64)
    if CAUSAL:
        carry = 0.0
        for start in range(0, N, BLOCK_N):
            n = N - start - BLOCK_N + tl.arange(0, BLOCK_N)  # blocks from the end, (BLOCK_N,)
            in_range = n >= 0
            grad_tau = tl.load(grad_tau_ptr + bh * N + n, mask=in_range, other=0.0)
            tau = tl.load(tau_ptr + bh * N + n, mask=in_range, other=0.0)
            l1 = tl.load(l1_ptr + bh * N + n, mask=in_range, other=1.0)
            g = _tau_grad(grad_tau, tau, l1, eps, PCP)
            tl.store(g_row_ptr + bh * N + n, carry + tl.cumsum(g, axis=0, reverse=True), mask=in_range)
            carry += tl.sum(g, axis=0)
    else:
        if GRAD_PER_ROW:
            grad_tau = 0.0
            for start in range(0, N, BLOCK_N):
                n = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
                grad_tau += tl.sum(tl.load(grad_tau_ptr + bh * N + n, mask=n < N, other=0.0), axis=0)
            tau = tl.load(tau_ptr + bh * N, mask=N > 0, other=0.0)  # every row holds the slice's tau
        else:
            grad_tau = tl.load(grad_tau_ptr + bh)
            tau = tl.load(tau_ptr + bh)
        tl.store(g_row_ptr + bh, _tau_grad(grad_tau, tau, tl.load(l1_ptr + bh), eps, PCP))


@triton.jit
def row_l1_bwd(
    k_ptr, pad_ptr, g_row_ptr, gk_ptr,
    H, N, s_kb, s_kh, s_kn, s_kd,
    D: tl.constexpr, K_ALIGN: tl.constexpr, G_PER_ROW: tl.constexpr, HAS_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Gradient of K, ``sign(K) * g_row * valid`` in K's dtype; g_row per row (G_PER_ROW) or per (b, h) slice."""
    bh, n, rows, cols, row_mask, mask = _slice_tile(N, D, BLOCK_N, BLOCK_D)
    x = tl.load(k_ptr + _strided(bh, n, cols, H, s_kb, s_kh, s_kn, s_kd, K_ALIGN), mask=mask, other=0.0).to(tl.float32)
    if G_PER_ROW:
        g = tl.load(g_row_ptr + rows, mask=row_mask, other=0.0)  # (BLOCK_N,)
    else:
        g = tl.zeros((BLOCK_N,), tl.float32) + tl.load(g_row_ptr + bh)
    if HAS_PAD:
        g = g * _unpadded(pad_ptr, bh, n, row_mask, H, N)
    sign = (x > 0).to(tl.float32) - (x < 0).to(tl.float32)
    tl.store(gk_ptr + rows[:, None] * D + cols[None, :], (sign * g[:, None]).to(gk_ptr.dtype.element_ty), mask=mask)
