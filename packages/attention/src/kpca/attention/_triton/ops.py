"""Launchers for the Triton PAP kernels, with two dispatch paths to the same launches.

Three layers, after flash-attn: the jit kernels (``kernels.py``); here, the input checks and the
launchers (plain functions, one per op and direction), reached by two paths; and the functions at
the bottom that ``functional.rpc_attention`` calls, which pick the path:

* eager calls (plain tensors, not traced): ``torch.autograd.Function`` subclasses around the
  launchers. A ``torch.library.custom_op`` with ``register_autograd`` costs about 20 µs of host time
  per forward call over its body, a ``torch.library.triton_op`` about 30 µs, an ``autograd.Function``
  about 3 µs (CPU, launches stubbed); ``benchmarks/dispatch.py`` prints the host time per call.
* traced calls (``torch.compile`` / ``torch.export``, fake or functional tensors, ``torch.func``
  transforms): one ``torch.library.custom_op`` per op (namespace ``kpca``) with a ``register_fake``
  shape function, each forward op carrying its backward op through ``register_autograd``, so the
  graph holds one opaque node per op in each direction. Both paths run the same launchers, so
  compiled = eager to the bit in the PAP ops.

Shapes: K, L, S, Z and the cleaned keys Kt are (B, H, N, D); tau and mu are (B, H, 1, 1), or
(B, H, N, 1) per row (a causal mu, and every tau ``rpc_attention`` passes: :func:`pap_tau` writes
one per row so that the steps' threshold gradients need no reduction of their own; the mu
backward sums them). S, Z, tau and mu are float32; K and L are float32, bfloat16 or float16 (K's
dtype for Kt and K's gradient, L's for L's gradient).

Launches per ``rpc_attention(n_iter)`` forward and backward, n_iter + 2 each (no other device work
of ours; autograd adds the gradients of tensors used twice): forward ``row_l1`` and ``mu_scan``
(tau), ``pap_first_fwd``, n_iter - 1 ``pap_step_fwd``; backward n_iter - 1 ``pap_step_bwd``,
``pap_first_bwd``, ``mu_grad_scan`` and ``row_l1_bwd``.

Every launch runs under :func:`_device_guard` of its inputs: Triton launches on the current CUDA
device and stream, and neither path switches to the inputs' device.
"""

import contextlib
import math
from typing import Optional

import torch
from torch.autograd import Function

from kpca.attention._pap import L1_EPS
from kpca.attention._triton import kernels
from kpca.attention.errors import AttentionOptionError

# Launch configuration, chosen from ptxas's register counts for sm_90 (no GPU has timed it yet):
# with 4 warps on 4096-element tiles, pap_step_fwd (the hottest kernel) needs about 200 registers per
# thread at D = 64 in bfloat16, which caps an SM at 8 resident warps; with 8 warps about 100, and
# with 8 warps on 2048-element tiles about 50, with no spill at any head dim the AOT test compiles
# (4096-element tiles spill a little in pap_step_bwd at D = 72). 2048 elements on 256 threads is one
# 16-byte vector per thread per bfloat16 tensor. The final values come from a GPU sweep over these
# constants, which the CUDA benchmark of `make test-gpu` (benchmarks/attention.py --device cuda) prints.
MAX_BLOCK_ELEMENTS = 2048
"""Elements per element-wise tile: MAX_BLOCK_ELEMENTS // BLOCK_D rows of BLOCK_D columns."""
ELEMENTWISE_NUM_WARPS = 8
"""Warps per program of the element-wise kernels (every kernel but the two scans)."""
SCAN_BLOCK = 128
"""Positions per step of the per-(sample, head) mu scans."""
SCAN_NUM_WARPS = 4
"""Warps per program of the mu scans (one (sample, head) each, SCAN_BLOCK positions per step)."""
MAX_GRID_AXIS_1 = 65535
"""CUDA's limit on the second grid axis, the token blocks of one (b, h) slice."""
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
"""Tensor types the eager path takes; any other (fake, functional, a subclass) goes through the custom ops."""


def _next_power_of_2(x: int) -> int:
    """``triton.next_power_of_2`` without its constexpr-function wrapper (about 1 µs a call)."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _slice_blocks(n: int, d: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_D) of the kernels tiling (b, h) slices: MAX_BLOCK_ELEMENTS at most, no more rows than N needs."""
    block_d = _next_power_of_2(d)
    return max(1, min(MAX_BLOCK_ELEMENTS // block_d, _next_power_of_2(n))), block_d


def _slice_grid(slices: int, n: int, block_n: int) -> tuple[int, int]:
    """The grid (B * H, token blocks) of the kernels tiling (b, h) slices."""
    blocks = -(-n // block_n)
    if blocks > MAX_GRID_AXIS_1:
        raise AttentionOptionError(
            f"N = {n} tokens need {blocks} blocks of {block_n} rows, more than CUDA's grid limit of "
            f"{MAX_GRID_AXIS_1}; use backend='torch' for sequences this long"
        )
    return slices, blocks


def _row_alignment(t: torch.Tensor) -> int:
    """The largest power of two up to 16 that divides the start of every (b, h, n) row of ``t`` (its ``ALIGN``).

    Every stride of a dimension longer than 1 is a multiple of it; 1 unless the last stride is 1.
    Triton's JIT only sees which integer arguments are multiples of 16.
    """
    if t.stride(-1) != 1:
        return 1
    common = 0  # gcd of the strides that count; 0 divides by every power of two
    for size, stride in zip(t.shape[:-1], t.stride()[:-1], strict=True):
        if size > 1:
            common = math.gcd(common, stride)
    return min(16, common & -common) if common else 16


def _device_guard(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """Make ``t``'s CUDA device the current one inside the block (its kernels launch there); a no-op off CUDA."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _check_keys(name: str, t: torch.Tensor) -> None:
    if t.dim() != 4 or t.dtype not in KERNEL_DTYPES:
        raise ValueError(
            f"{name} must be a (B, H, N, D) tensor of dtype in {KERNEL_DTYPES}, got {tuple(t.shape)} {t.dtype}"
        )
    if t.shape[-1] < 1:
        raise ValueError(f"{name} has head dim D = 0 (shape {tuple(t.shape)}); the Triton kernels need D >= 1")


def _check_like(name: str, t: torch.Tensor, shape: torch.Size, device: torch.device) -> None:
    if t.shape != shape or t.device != device:
        raise ValueError(f"{name} is {tuple(t.shape)} on {t.device}; expected {tuple(shape)} on {device}")


def _check_tau(tau: torch.Tensor, k: torch.Tensor) -> bool:
    """Check tau against K; return whether it holds one threshold per row rather than per slice."""
    b, h, n, _ = k.shape
    if tau.dtype != torch.float32 or tuple(tau.shape) not in ((b, h, 1, 1), (b, h, n, 1)) or tau.device != k.device:
        raise ValueError(
            f"tau must be float32 of shape (B, H, 1, 1) or (B, H, N, 1) = {(b, h, 1, 1)} or {(b, h, n, 1)} "
            f"on {k.device}, got {tuple(tau.shape)} {tau.dtype} on {tau.device}"
        )
    return tau.shape[2] != 1


def _check_padding(key_padding_mask: torch.Tensor | None, k: torch.Tensor) -> None:
    b, _, n, _ = k.shape
    padding = key_padding_mask
    if padding is not None and (padding.dtype != torch.bool or padding.shape != (b, n) or padding.device != k.device):
        raise ValueError(
            f"key_padding_mask must be a bool (B, N) = {(b, n)} tensor on {k.device}, got "
            f"{tuple(padding.shape)} {padding.dtype} on {padding.device}"
        )


def _tau_div(k: torch.Tensor, tau: torch.Tensor) -> int:
    """Rows per threshold: N for one tau per (b, h) slice, 1 for one per row."""
    return k.shape[2] if tau.shape[2] == 1 else 1


def _f32_like(k: torch.Tensor) -> torch.Tensor:
    return torch.empty(k.shape, dtype=torch.float32, device=k.device)


def _grad_tau(row_grads: torch.Tensor, sign: torch.Tensor, tau_div: int) -> torch.Tensor:
    """Per-row threshold gradients (R,) in tau's shape: (B, H, N, 1) as they are, or summed to (B, H, 1, 1).

    ``rpc_attention``'s tau is per row, so the sum (one more launch) only serves callers with a per-slice tau.
    """
    b, h, n, _ = sign.shape
    rows = row_grads.view(b, h, n, 1)  # (B, H, N, 1)
    return rows.sum(2, keepdim=True) if tau_div == n and n != 1 else rows


def _contiguous_or(t: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """``t`` made contiguous (a copy only if it is not), or a tensor the kernel never reads (its flag is off)."""
    return placeholder if t is None else t.contiguous()


def _padding(key_padding_mask: torch.Tensor | None, k: torch.Tensor) -> torch.Tensor:
    """The (B, N) bool padding mask (True = padded; the kernels read bools), or a tensor the kernel never reads."""
    return k if key_padding_mask is None else key_padding_mask.contiguous()


# --- launchers: what both paths run ---------------------------------------------------------


def _first_forward(k: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(S, Kt, sign)``: S = shrink(K, tau) (float32), Kt = clamp(K, -tau, tau) (K's dtype), int8 sign."""
    _check_keys("k", k)
    tau_per_row = _check_tau(tau, k)
    b, h, n, d = k.shape
    s, kt = _f32_like(k), torch.empty(k.shape, dtype=k.dtype, device=k.device)
    sign = torch.empty(k.shape, dtype=torch.int8, device=k.device)
    block_n, block_d = _slice_blocks(n, d)
    with _device_guard(k):
        kernels.pap_first_fwd[_slice_grid(b * h, n, block_n)](
            k, tau.contiguous(), s, kt, sign, h, n, *k.stride(),
            D=d, K_ALIGN=_row_alignment(k), TAU_PER_ROW=tau_per_row, BLOCK_N=block_n, BLOCK_D=block_d,
            num_warps=ELEMENTWISE_NUM_WARPS,
        )  # fmt: skip
    return s, kt, sign


def _first_backward(
    sign: torch.Tensor, grad_s: torch.Tensor | None, grad_kt: torch.Tensor | None, k_dtype: torch.dtype, tau_div: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad K, grad tau)`` of :func:`_first_forward` from its saved sign and the output gradients."""
    b, h, n, d = sign.shape
    grad_k = torch.empty(sign.shape, dtype=k_dtype, device=sign.device)
    row_grads = torch.empty(b * h * n, dtype=torch.float32, device=sign.device)  # (R,)
    gkt = sign if grad_kt is None else grad_kt  # read with its strides: SDPA's gradients are (B, N, H, D) in memory
    block_n, block_d = _slice_blocks(n, d)
    with _device_guard(sign):
        kernels.pap_first_bwd[_slice_grid(b * h, n, block_n)](
            sign, _contiguous_or(grad_s, sign), gkt, grad_k, row_grads, h, n, *gkt.stride(),
            D=d, GKT_ALIGN=_row_alignment(gkt), HAS_GS=grad_s is not None, HAS_GKT=grad_kt is not None,
            BLOCK_N=block_n, BLOCK_D=block_d, num_warps=ELEMENTWISE_NUM_WARPS,
        )  # fmt: skip
    return grad_k, _grad_tau(row_grads, sign, tau_div)


def _step_forward(
    k: torch.Tensor,
    tau: torch.Tensor,
    l: torch.Tensor,  # noqa: E741 (the paper's name)
    z: torch.Tensor | None,
    s: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Z', S', Kt, sign)`` of one later PAP step, as in ``_pap.PapStep`` (``z=None`` for zero)."""
    _check_keys("k", k)
    _check_keys("l", l)
    tau_per_row = _check_tau(tau, k)
    for name, t in (("l", l), ("s", s), ("z", z)):
        if t is not None:
            _check_like(name, t, k.shape, k.device)
    for name, t in (("s", s), ("z", z)):
        if t is not None and t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 (the PAP state), got {t.dtype}")
    b, h, n, d = k.shape
    z_new, s_new, kt = _f32_like(k), _f32_like(k), torch.empty(k.shape, dtype=k.dtype, device=k.device)
    sign = torch.empty(k.shape, dtype=torch.int8, device=k.device)
    block_n, block_d = _slice_blocks(n, d)
    with _device_guard(k):
        kernels.pap_step_fwd[_slice_grid(b * h, n, block_n)](
            k, l, tau.contiguous(), _contiguous_or(z, s), s.contiguous(), z_new, s_new, kt, sign,
            h, n, *k.stride(), *l.stride(),
            D=d, K_ALIGN=_row_alignment(k), L_ALIGN=_row_alignment(l), TAU_PER_ROW=tau_per_row, HAS_Z=z is not None,
            BLOCK_N=block_n, BLOCK_D=block_d, num_warps=ELEMENTWISE_NUM_WARPS,
        )  # fmt: skip
    return z_new, s_new, kt, sign


def _step_backward(
    sign: torch.Tensor,
    grad_z_new: torch.Tensor | None,
    grad_s_new: torch.Tensor | None,
    grad_kt: torch.Tensor | None,
    k_dtype: torch.dtype,
    l_dtype: torch.dtype,
    tau_div: int,
    need_grad_z: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(grad K, grad tau, grad L, grad Z, grad S)`` of :func:`_step_forward`; grad Z empty unless ``need_grad_z``."""
    b, h, n, d = sign.shape
    dev = sign.device
    grad_k = torch.empty(sign.shape, dtype=k_dtype, device=dev)
    grad_l = torch.empty(sign.shape, dtype=l_dtype, device=dev)
    grad_z = _f32_like(sign) if need_grad_z else sign.new_empty(0, dtype=torch.float32)
    grad_s, row_grads = _f32_like(sign), torch.empty(b * h * n, dtype=torch.float32, device=dev)  # row_grads (R,)
    gkt = sign if grad_kt is None else grad_kt  # read with its strides, as in _first_backward
    block_n, block_d = _slice_blocks(n, d)
    with _device_guard(sign):
        kernels.pap_step_bwd[_slice_grid(b * h, n, block_n)](
            sign, _contiguous_or(grad_z_new, sign), _contiguous_or(grad_s_new, sign), gkt,
            grad_k, grad_l, grad_z if need_grad_z else grad_s, grad_s, row_grads, h, n, *gkt.stride(),
            D=d, GKT_ALIGN=_row_alignment(gkt), HAS_GZ=grad_z_new is not None, HAS_GS=grad_s_new is not None,
            HAS_GKT=grad_kt is not None, NEED_GZ=need_grad_z, BLOCK_N=block_n, BLOCK_D=block_d,
            num_warps=ELEMENTWISE_NUM_WARPS,
        )  # fmt: skip
    return grad_k, _grad_tau(row_grads, sign, tau_div), grad_l, grad_z, grad_s


def _tau_shapes(k: torch.Tensor, is_causal: bool, per_row: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of tau, (B, H, N | 1, 1), and of ||K||_1, (B, H, N, 1) causal else (B, H, 1, 1)."""
    b, h, n, _ = k.shape
    return (b, h, n if is_causal or per_row else 1, 1), (b, h, n if is_causal else 1, 1)


def _mu_forward(
    k: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    width: int,
    is_causal: bool,
    eps: float,
    lambd: float,
    pcp: bool,
    per_row: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tau, ||K||_1)``: tau = lambd * mu, or lambd / mu with ``pcp``, mu as in ``_pap.pap_mu``; float32."""
    _check_keys("k", k)
    _check_padding(key_padding_mask, k)
    b, h, n, d = k.shape
    tau_shape, l1_shape = _tau_shapes(k, is_causal, per_row)
    row_l1 = torch.empty(b * h * n, dtype=torch.float32, device=k.device)  # (R,)
    tau = torch.empty(tau_shape, dtype=torch.float32, device=k.device)
    l1 = torch.empty(l1_shape, dtype=torch.float32, device=k.device)
    pad = _padding(key_padding_mask, k)
    block_n, block_d = _slice_blocks(n, d)
    with _device_guard(k):
        kernels.row_l1[_slice_grid(b * h, n, block_n)](
            k, pad, row_l1, h, n, *k.stride(),
            D=d, K_ALIGN=_row_alignment(k), HAS_PAD=key_padding_mask is not None, BLOCK_N=block_n, BLOCK_D=block_d,
            num_warps=ELEMENTWISE_NUM_WARPS,
        )  # fmt: skip
        kernels.mu_scan[(b * h,)](
            row_l1, pad, tau, l1, h, n, float(width), eps, float(lambd),
            HAS_PAD=key_padding_mask is not None, CAUSAL=is_causal, PCP=pcp, PER_ROW=per_row, BLOCK_N=SCAN_BLOCK,
            num_warps=SCAN_NUM_WARPS,
        )  # fmt: skip
    return tau, l1


def _mu_backward(
    k: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    tau: torch.Tensor,
    l1: torch.Tensor,
    grad_tau: torch.Tensor,
    is_causal: bool,
    eps: float,
    pcp: bool,
) -> torch.Tensor:
    """The gradient of K in :func:`_mu_forward` from tau's gradient (in tau's shape)."""
    b, h, n, d = k.shape
    g_row = torch.empty(l1.numel(), dtype=torch.float32, device=k.device)  # (R,) causal, else (B * H,)
    grad_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    block_n, block_d = _slice_blocks(n, d)
    with _device_guard(k):
        kernels.mu_grad_scan[(b * h,)](
            grad_tau.contiguous(), tau, l1, g_row, n, eps,
            CAUSAL=is_causal, PCP=pcp, GRAD_PER_ROW=tau.shape[2] != l1.shape[2], BLOCK_N=SCAN_BLOCK,
            num_warps=SCAN_NUM_WARPS,
        )  # fmt: skip
        kernels.row_l1_bwd[_slice_grid(b * h, n, block_n)](
            k, _padding(key_padding_mask, k), g_row, grad_k, h, n, *k.stride(),
            D=d, K_ALIGN=_row_alignment(k), G_PER_ROW=is_causal, HAS_PAD=key_padding_mask is not None,
            BLOCK_N=block_n, BLOCK_D=block_d, num_warps=ELEMENTWISE_NUM_WARPS,
        )  # fmt: skip
    return grad_k


# --- traced path: custom ops ----------------------------------------------------------------


@torch.library.custom_op("kpca::pap_first", mutates_args=())
def pap_first_op(k: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(S, Kt, sign)``: S = shrink(K, tau) (float32), Kt = clamp(K, -tau, tau) (K's dtype), int8 sign."""
    return _first_forward(k, tau)


@pap_first_op.register_fake
def _(k, tau):
    return k.new_empty(k.shape, dtype=torch.float32), k.new_empty(k.shape), k.new_empty(k.shape, dtype=torch.int8)


@torch.library.custom_op("kpca::pap_first_backward", mutates_args=())
def pap_first_backward_op(
    sign: torch.Tensor,
    grad_s: Optional[torch.Tensor],  # noqa: UP045 (custom_op schemas are inferred from Optional)
    grad_kt: Optional[torch.Tensor],  # noqa: UP045
    k_dtype: torch.dtype,
    tau_div: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad K, grad tau)`` of :func:`pap_first_op` from its saved sign and the output gradients."""
    return _first_backward(sign, grad_s, grad_kt, k_dtype, tau_div)


@pap_first_backward_op.register_fake
def _(sign, grad_s, grad_kt, k_dtype, tau_div):
    b, h, n, _ = sign.shape
    return sign.new_empty(sign.shape, dtype=k_dtype), sign.new_empty((b, h, n // tau_div, 1), dtype=torch.float32)


def _pap_first_setup(ctx, inputs, output) -> None:
    k, tau = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[2])
    ctx.meta = (k.dtype, _tau_div(k, tau))


def _pap_first_backward(ctx, grad_s, grad_kt, _grad_sign):
    (sign,) = ctx.saved_tensors
    return pap_first_backward_op(sign, grad_s, grad_kt, *ctx.meta)


pap_first_op.register_autograd(_pap_first_backward, setup_context=_pap_first_setup)


@torch.library.custom_op("kpca::pap_step", mutates_args=())
def pap_step_op(
    k: torch.Tensor,
    tau: torch.Tensor,
    l: torch.Tensor,  # noqa: E741 (the paper's name)
    z: Optional[torch.Tensor],  # noqa: UP045
    s: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Z', S', Kt, sign)`` of one later PAP step, as in ``_pap.PapStep`` (``z=None`` for zero)."""
    return _step_forward(k, tau, l, z, s)


@pap_step_op.register_fake
def _(k, tau, l, z, s):  # noqa: E741
    f32 = k.new_empty(k.shape, dtype=torch.float32)
    return f32, torch.empty_like(f32), k.new_empty(k.shape), k.new_empty(k.shape, dtype=torch.int8)


@torch.library.custom_op("kpca::pap_step_backward", mutates_args=())
def pap_step_backward_op(
    sign: torch.Tensor,
    grad_z_new: Optional[torch.Tensor],  # noqa: UP045
    grad_s_new: Optional[torch.Tensor],  # noqa: UP045
    grad_kt: Optional[torch.Tensor],  # noqa: UP045
    k_dtype: torch.dtype,
    l_dtype: torch.dtype,
    tau_div: int,
    need_grad_z: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(grad K, grad tau, grad L, grad Z, grad S)`` of :func:`pap_step_op`; grad Z is empty unless ``need_grad_z``."""
    return _step_backward(sign, grad_z_new, grad_s_new, grad_kt, k_dtype, l_dtype, tau_div, need_grad_z)


@pap_step_backward_op.register_fake
def _(sign, grad_z_new, grad_s_new, grad_kt, k_dtype, l_dtype, tau_div, need_grad_z):
    b, h, n, _ = sign.shape
    f32 = sign.new_empty(sign.shape, dtype=torch.float32)
    return (
        sign.new_empty(sign.shape, dtype=k_dtype),
        sign.new_empty((b, h, n // tau_div, 1), dtype=torch.float32),
        sign.new_empty(sign.shape, dtype=l_dtype),
        f32 if need_grad_z else sign.new_empty(0, dtype=torch.float32),
        torch.empty_like(f32),
    )


def _pap_step_setup(ctx, inputs, output) -> None:
    k, tau, l, z, _ = inputs  # noqa: E741
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[3])
    ctx.meta = (k.dtype, l.dtype, _tau_div(k, tau), z is not None)


def _pap_step_backward(ctx, grad_z_new, grad_s_new, grad_kt, _grad_sign):
    (sign,) = ctx.saved_tensors
    has_z = ctx.meta[3]
    grad_k, grad_tau, grad_l, grad_z, grad_s = pap_step_backward_op(sign, grad_z_new, grad_s_new, grad_kt, *ctx.meta)
    return grad_k, grad_tau, grad_l, grad_z if has_z else None, grad_s


pap_step_op.register_autograd(_pap_step_backward, setup_context=_pap_step_setup)


@torch.library.custom_op("kpca::pap_mu", mutates_args=())
def pap_mu_op(
    k: torch.Tensor,
    key_padding_mask: Optional[torch.Tensor],  # noqa: UP045
    width: int,
    is_causal: bool,
    eps: float,
    lambd: float = 1.0,
    pcp: bool = False,
    per_row: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tau, ||K||_1)``, float32: tau = lambd * mu (``pcp``: lambd / mu), mu as in ``_pap.pap_mu``.

    With the defaults tau is mu itself. tau is (B, H, 1, 1), or (B, H, N, 1) when causal or
    ``per_row`` (each row holding its slice's value); ||K||_1 is (B, H, 1, 1), or the prefix sums
    (B, H, N, 1) when causal.
    """
    return _mu_forward(k, key_padding_mask, width, is_causal, eps, lambd, pcp, per_row)


@pap_mu_op.register_fake
def _(k, key_padding_mask, width, is_causal, eps, lambd=1.0, pcp=False, per_row=False):
    tau_shape, l1_shape = _tau_shapes(k, is_causal, per_row)
    return k.new_empty(tau_shape, dtype=torch.float32), k.new_empty(l1_shape, dtype=torch.float32)


@torch.library.custom_op("kpca::pap_mu_backward", mutates_args=())
def pap_mu_backward_op(
    k: torch.Tensor,
    key_padding_mask: Optional[torch.Tensor],  # noqa: UP045
    mu: torch.Tensor,
    l1: torch.Tensor,
    grad_mu: torch.Tensor,
    is_causal: bool,
    eps: float,
    pcp: bool = False,
) -> torch.Tensor:
    """The gradient of K in :func:`pap_mu_op` from the gradient of its first output (``mu``: tau, or mu itself)."""
    return _mu_backward(k, key_padding_mask, mu, l1, grad_mu, is_causal, eps, pcp)


@pap_mu_backward_op.register_fake
def _(k, key_padding_mask, mu, l1, grad_mu, is_causal, eps, pcp=False):
    return torch.empty_like(k, memory_format=torch.contiguous_format)


def _pap_mu_setup(ctx, inputs, output) -> None:
    k, key_padding_mask, _, is_causal, eps, _, pcp, _ = inputs
    ctx.set_materialize_grads(False)  # ||K||_1 is non-differentiable: no zeros for its gradient
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(k, key_padding_mask, *output)
    ctx.meta = (is_causal, eps, pcp)


def _pap_mu_backward(ctx, grad_tau, _grad_l1):
    k, key_padding_mask, tau, l1 = ctx.saved_tensors
    return pap_mu_backward_op(k, key_padding_mask, tau, l1, grad_tau, *ctx.meta), *(None,) * 7


pap_mu_op.register_autograd(_pap_mu_backward, setup_context=_pap_mu_setup)


# --- eager path: autograd Functions ---------------------------------------------------------


class _PapFirst(Function):
    """Eager :func:`pap_first_op`: ``(S, Kt)``, saving the int8 sign."""

    @staticmethod
    def forward(ctx, k, tau):
        s, kt, sign = _first_forward(k, tau)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(sign)
        ctx.meta = (k.dtype, _tau_div(k, tau))
        return s, kt

    @staticmethod
    def backward(ctx, grad_s, grad_kt):
        (sign,) = ctx.saved_tensors
        return _first_backward(sign, grad_s, grad_kt, *ctx.meta)


class _PapStep(Function):
    """Eager :func:`pap_step_op`: ``(Z', S', Kt)``, saving the int8 sign."""

    @staticmethod
    def forward(ctx, k, tau, l, z, s):  # noqa: E741
        z_new, s_new, kt, sign = _step_forward(k, tau, l, z, s)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(sign)
        ctx.meta = (k.dtype, l.dtype, _tau_div(k, tau), z is not None)
        return z_new, s_new, kt

    @staticmethod
    def backward(ctx, grad_z_new, grad_s_new, grad_kt):
        (sign,) = ctx.saved_tensors
        has_z = ctx.meta[3]
        grad_k, grad_tau, grad_l, grad_z, grad_s = _step_backward(sign, grad_z_new, grad_s_new, grad_kt, *ctx.meta)
        return grad_k, grad_tau, grad_l, grad_z if has_z else None, grad_s


class _PapMu(Function):
    """Eager :func:`pap_mu_op`: tau alone, saving K, the mask, tau and ||K||_1."""

    @staticmethod
    def forward(ctx, k, key_padding_mask, width, is_causal, eps, lambd, pcp, per_row):
        tau, l1 = _mu_forward(k, key_padding_mask, width, is_causal, eps, lambd, pcp, per_row)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(k, key_padding_mask, tau, l1)
        ctx.meta = (is_causal, eps, pcp)
        return tau

    @staticmethod
    def backward(ctx, grad_tau):
        k, key_padding_mask, tau, l1 = ctx.saved_tensors
        return _mu_backward(k, key_padding_mask, tau, l1, grad_tau, *ctx.meta), *(None,) * 7


# --- what functional.rpc_attention calls ----------------------------------------------------


def _eager(*tensors: torch.Tensor | None) -> bool:
    """Whether a call takes the eager path: plain tensors, nothing tracing it (else the custom ops)."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return False
    return all(t is None or type(t) in _PLAIN_TENSORS for t in tensors)


def pap_first(k: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``_pap.PapFirst.apply`` on the Triton kernels: ``(S, Kt)``."""
    if _eager(k, tau):
        return _PapFirst.apply(k, tau)
    s, kt, _ = pap_first_op(k, tau)
    return s, kt


def pap_step(
    k: torch.Tensor,
    tau: torch.Tensor,
    l: torch.Tensor,  # noqa: E741
    z: torch.Tensor | None,
    s: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_pap.PapStep.apply`` on the Triton kernels: ``(Z', S', Kt)``."""
    if _eager(k, tau, l, z, s):
        return _PapStep.apply(k, tau, l, z, s)
    z_new, s_new, kt, _ = pap_step_op(k, tau, l, z, s)
    return z_new, s_new, kt


def pap_tau(
    k: torch.Tensor,
    width: int,
    lambd: float,
    *,
    pcp: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """The threshold ``lambd * _pap.pap_mu(...)`` (``pcp``: ``lambd / _pap.pap_mu(...)``), (B, H, N, 1) float32.

    One value per row (each row of a non-causal slice holds the slice's), with its gradient to K through
    mu and ||K||_1, in the two launches of mu: no separate torch op for the product or the quotient.
    """
    args = (k, key_padding_mask, width, is_causal, L1_EPS, lambd, pcp, True)
    if _eager(k, key_padding_mask):
        return _PapMu.apply(*args)
    return pap_mu_op(*args)[0]


def pap_mu(
    k: torch.Tensor, width: int, *, key_padding_mask: torch.Tensor | None = None, is_causal: bool = False
) -> torch.Tensor:
    """``_pap.pap_mu`` on the Triton kernels: (B, H, 1, 1), or (B, H, N, 1) when causal, float32."""
    args = (k, key_padding_mask, width, is_causal, L1_EPS, 1.0, False, False)
    if _eager(k, key_padding_mask):
        return _PapMu.apply(*args)
    return pap_mu_op(*args)[0]


def try_launch(device: torch.device) -> None:
    """Compile and run one tiny kernel on ``device`` and wait for it.

    Raises whatever stops Triton from running there (no C compiler for its launcher, an unsupported
    GPU, a driver error); ``auto`` calls it once per process before its first Triton call.
    """
    ones = torch.ones(1, 1, 1, 1, device=device)  # (B, H, N, D) keys, and a (B, H, 1, 1) tau
    _first_forward(ones, ones)
    if ones.device.type == "cuda" and not torch.cuda.is_current_stream_capturing():  # no sync in a CUDA graph
        torch.cuda.synchronize(ones.device)  # a launch fault is asynchronous: surface it here
