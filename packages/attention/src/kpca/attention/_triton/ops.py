"""Launchers for the Triton PAP kernels, registered as ``torch.library`` custom ops with autograd.

Three layers, after flash-attn: the jit kernels (``kernels.py``); here, the input checks and one
``torch.library.custom_op`` per kernel launch (namespace ``kpca``) with a ``register_fake`` shape
function, each forward op carrying its hand-written backward through ``register_autograd`` (the
custom-op form of an ``autograd.Function``), so ``torch.compile`` sees one opaque op in each
direction; and the three functions at the bottom that ``functional.rpc_attention`` calls.

Shapes: K, L, S, Z and the cleaned keys Kt are (B, H, N, D); tau and mu are (B, H, 1, 1), or
(B, H, N, 1) for a causal mu. S, Z, tau and mu are float32; K and L are float32, bfloat16 or
float16 (K's dtype for Kt and K's gradient, L's for L's gradient).
"""

from typing import Optional

import torch
import triton

from kpca.attention._pap import L1_EPS
from kpca.attention._triton import kernels

MAX_BLOCK_ELEMENTS = 4096
"""Elements per element-wise tile: BLOCK_R = MAX_BLOCK_ELEMENTS // BLOCK_D rows of BLOCK_D columns."""
SCAN_BLOCK = 128
"""Positions per step of the per-(sample, head) mu scans."""
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _blocks(d: int) -> tuple[int, int]:
    block_d = triton.next_power_of_2(d)
    return max(1, MAX_BLOCK_ELEMENTS // block_d), block_d


def _grid(rows: int, block_r: int) -> tuple[int]:
    return (triton.cdiv(rows, block_r),)


def _check_keys(name: str, t: torch.Tensor) -> None:
    if t.dim() != 4 or t.dtype not in KERNEL_DTYPES:
        raise ValueError(
            f"{name} must be a (B, H, N, D) tensor of dtype in {KERNEL_DTYPES}, got {tuple(t.shape)} {t.dtype}"
        )


def _check_like(name: str, t: torch.Tensor, shape: torch.Size, device: torch.device) -> None:
    if t.shape != shape or t.device != device:
        raise ValueError(f"{name} is {tuple(t.shape)} on {t.device}; expected {tuple(shape)} on {device}")


def _check_tau(tau: torch.Tensor, k: torch.Tensor) -> int:
    """Check tau against K; return how many rows share one threshold (N, or 1 for a causal tau)."""
    b, h, n, _ = k.shape
    if tau.dtype != torch.float32 or tuple(tau.shape) not in ((b, h, 1, 1), (b, h, n, 1)):
        raise ValueError(
            f"tau must be float32 of shape (B, H, 1, 1) or (B, H, N, 1) = {(b, h, 1, 1)} or {(b, h, n, 1)}, "
            f"got {tuple(tau.shape)} {tau.dtype}"
        )
    return n if tau.shape[2] == 1 else 1


def _f32_like(k: torch.Tensor) -> torch.Tensor:
    return torch.empty(k.shape, dtype=torch.float32, device=k.device)


def _grad_tau(row_grads: torch.Tensor, sign: torch.Tensor, tau_div: int) -> torch.Tensor:
    """Per-row threshold gradients (R,) summed to tau's shape, (B, H, 1, 1) or (B, H, N, 1)."""
    b, h, n, _ = sign.shape
    rows = row_grads.view(b, h, n, 1)  # (B, H, N, 1)
    return rows.sum(2, keepdim=True) if tau_div == n else rows


# --- first PAP step -------------------------------------------------------------------------


@torch.library.custom_op("kpca::pap_first", mutates_args=())
def pap_first_op(k: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(S, Kt, sign)``: S = shrink(K, tau) (float32), Kt = clamp(K, -tau, tau) (K's dtype), int8 sign."""
    _check_keys("k", k)
    tau_div = _check_tau(tau, k)
    b, h, n, d = k.shape
    s, kt = _f32_like(k), torch.empty(k.shape, dtype=k.dtype, device=k.device)
    sign = torch.empty(k.shape, dtype=torch.int8, device=k.device)
    block_r, block_d = _blocks(d)
    kernels.pap_first_fwd[_grid(b * h * n, block_r)](
        k, tau.contiguous(), s, kt, sign, b * h * n, h, n, d, *k.stride(), tau_div,
        BLOCK_R=block_r, BLOCK_D=block_d,
    )  # fmt: skip
    return s, kt, sign


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
    b, h, n, d = sign.shape
    grad_k = torch.empty(sign.shape, dtype=k_dtype, device=sign.device)
    row_grads = torch.empty(b * h * n, dtype=torch.float32, device=sign.device)
    block_r, block_d = _blocks(d)
    kernels.pap_first_bwd[_grid(b * h * n, block_r)](
        sign, _contiguous_or(grad_s, sign), _contiguous_or(grad_kt, sign), grad_k, row_grads, b * h * n, d,
        HAS_GS=grad_s is not None, HAS_GKT=grad_kt is not None, BLOCK_R=block_r, BLOCK_D=block_d,
    )  # fmt: skip
    return grad_k, _grad_tau(row_grads, sign, tau_div)


@pap_first_backward_op.register_fake
def _(sign, grad_s, grad_kt, k_dtype, tau_div):
    b, h, n, _ = sign.shape
    return sign.new_empty(sign.shape, dtype=k_dtype), sign.new_empty((b, h, n // tau_div, 1), dtype=torch.float32)


def _pap_first_setup(ctx, inputs, output) -> None:
    k, tau = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[2])
    ctx.meta = (k.dtype, k.shape[2] if tau.shape[2] == 1 else 1)


def _pap_first_backward(ctx, grad_s, grad_kt, _grad_sign):
    (sign,) = ctx.saved_tensors
    k_dtype, tau_div = ctx.meta
    return pap_first_backward_op(sign, grad_s, grad_kt, k_dtype, tau_div)


pap_first_op.register_autograd(_pap_first_backward, setup_context=_pap_first_setup)


# --- later PAP steps ------------------------------------------------------------------------


@torch.library.custom_op("kpca::pap_step", mutates_args=())
def pap_step_op(
    k: torch.Tensor,
    tau: torch.Tensor,
    l: torch.Tensor,  # noqa: E741 (the paper's name)
    z: Optional[torch.Tensor],  # noqa: UP045
    s: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Z', S', Kt, sign)`` of one later PAP step, as in ``_pap.PapStep`` (``z=None`` for zero)."""
    _check_keys("k", k)
    _check_keys("l", l)
    tau_div = _check_tau(tau, k)
    for name, t in (("l", l), ("s", s)) + ((("z", z),) if z is not None else ()):
        _check_like(name, t, k.shape, k.device)
    for name, t in (("s", s), ("z", z)):
        if t is not None and t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 (the PAP state), got {t.dtype}")
    b, h, n, d = k.shape
    z_new, s_new, kt = _f32_like(k), _f32_like(k), torch.empty(k.shape, dtype=k.dtype, device=k.device)
    sign = torch.empty(k.shape, dtype=torch.int8, device=k.device)
    block_r, block_d = _blocks(d)
    kernels.pap_step_fwd[_grid(b * h * n, block_r)](
        k, l, tau.contiguous(), _contiguous_or(z, s), s.contiguous(), z_new, s_new, kt, sign,
        b * h * n, h, n, d, *k.stride(), *l.stride(), tau_div,
        HAS_Z=z is not None, BLOCK_R=block_r, BLOCK_D=block_d,
    )  # fmt: skip
    return z_new, s_new, kt, sign


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
    b, h, n, d = sign.shape
    dev = sign.device
    grad_k = torch.empty(sign.shape, dtype=k_dtype, device=dev)
    grad_l = torch.empty(sign.shape, dtype=l_dtype, device=dev)
    grad_z = _f32_like(sign) if need_grad_z else sign.new_empty(0, dtype=torch.float32)
    grad_s, row_grads = _f32_like(sign), torch.empty(b * h * n, dtype=torch.float32, device=dev)
    block_r, block_d = _blocks(d)
    kernels.pap_step_bwd[_grid(b * h * n, block_r)](
        sign, _contiguous_or(grad_z_new, sign), _contiguous_or(grad_s_new, sign), _contiguous_or(grad_kt, sign),
        grad_k, grad_l, grad_z if need_grad_z else grad_s, grad_s, row_grads, b * h * n, d,
        HAS_GZ=grad_z_new is not None, HAS_GS=grad_s_new is not None, HAS_GKT=grad_kt is not None,
        NEED_GZ=need_grad_z, BLOCK_R=block_r, BLOCK_D=block_d,
    )  # fmt: skip
    return grad_k, _grad_tau(row_grads, sign, tau_div), grad_l, grad_z, grad_s


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
    ctx.meta = (k.dtype, l.dtype, k.shape[2] if tau.shape[2] == 1 else 1, z is not None)


def _pap_step_backward(ctx, grad_z_new, grad_s_new, grad_kt, _grad_sign):
    (sign,) = ctx.saved_tensors
    k_dtype, l_dtype, tau_div, has_z = ctx.meta
    grad_k, grad_tau, grad_l, grad_z, grad_s = pap_step_backward_op(
        sign, grad_z_new, grad_s_new, grad_kt, k_dtype, l_dtype, tau_div, has_z
    )
    return grad_k, grad_tau, grad_l, grad_z if has_z else None, grad_s


pap_step_op.register_autograd(_pap_step_backward, setup_context=_pap_step_setup)


# --- mu -------------------------------------------------------------------------------------


@torch.library.custom_op("kpca::pap_mu", mutates_args=())
def pap_mu_op(
    k: torch.Tensor,
    key_padding_mask: Optional[torch.Tensor],  # noqa: UP045
    width: int,
    is_causal: bool,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mu, ||K||_1)`` as in ``_pap.pap_mu``: (B, H, 1, 1), or (B, H, N, 1) when causal, float32."""
    _check_keys("k", k)
    b, h, n, d = k.shape
    if key_padding_mask is not None and (key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (b, n)):
        raise ValueError(
            f"key_padding_mask must be a bool (B, N) = {(b, n)} tensor, got "
            f"{tuple(key_padding_mask.shape)} {key_padding_mask.dtype}"
        )
    row_l1 = torch.empty(b * h * n, dtype=torch.float32, device=k.device)
    pad = _padding(key_padding_mask, k)
    block_r, block_d = _blocks(d)
    kernels.row_l1[_grid(b * h * n, block_r)](
        k, pad, row_l1, b * h * n, h, n, d, *k.stride(),
        HAS_PAD=key_padding_mask is not None, BLOCK_R=block_r, BLOCK_D=block_d,
    )  # fmt: skip
    out_shape = (b, h, n if is_causal else 1, 1)
    mu = torch.empty(out_shape, dtype=torch.float32, device=k.device)
    l1 = torch.empty(out_shape, dtype=torch.float32, device=k.device)
    kernels.mu_scan[(b * h,)](
        row_l1, pad, mu, l1, h, n, float(width), eps,
        HAS_PAD=key_padding_mask is not None, CAUSAL=is_causal, BLOCK_N=SCAN_BLOCK,
    )  # fmt: skip
    return mu, l1


@pap_mu_op.register_fake
def _(k, key_padding_mask, width, is_causal, eps):
    b, h, n, _ = k.shape
    mu = k.new_empty((b, h, n if is_causal else 1, 1), dtype=torch.float32)
    return mu, torch.empty_like(mu)


@torch.library.custom_op("kpca::pap_mu_backward", mutates_args=())
def pap_mu_backward_op(
    k: torch.Tensor,
    key_padding_mask: Optional[torch.Tensor],  # noqa: UP045
    mu: torch.Tensor,
    l1: torch.Tensor,
    grad_mu: torch.Tensor,
    is_causal: bool,
    eps: float,
) -> torch.Tensor:
    """The gradient of K in :func:`pap_mu_op` from the incoming mu gradient."""
    b, h, n, d = k.shape
    g_row = torch.empty(mu.numel(), dtype=torch.float32, device=k.device)
    kernels.mu_grad_scan[(b * h,)](
        grad_mu.contiguous(), mu, l1, g_row, n, eps, CAUSAL=is_causal, BLOCK_N=SCAN_BLOCK
    )  # fmt: skip
    grad_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    block_r, block_d = _blocks(d)
    kernels.row_l1_bwd[_grid(b * h * n, block_r)](
        k, _padding(key_padding_mask, k), g_row, grad_k, b * h * n, h, n, d, *k.stride(), 1 if is_causal else n,
        HAS_PAD=key_padding_mask is not None, BLOCK_R=block_r, BLOCK_D=block_d,
    )  # fmt: skip
    return grad_k


@pap_mu_backward_op.register_fake
def _(k, key_padding_mask, mu, l1, grad_mu, is_causal, eps):
    return torch.empty_like(k, memory_format=torch.contiguous_format)


def _pap_mu_setup(ctx, inputs, output) -> None:
    k, key_padding_mask, _, is_causal, eps = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(k, key_padding_mask, *output)
    ctx.meta = (is_causal, eps)


def _pap_mu_backward(ctx, grad_mu, _grad_l1):
    k, key_padding_mask, mu, l1 = ctx.saved_tensors
    return pap_mu_backward_op(k, key_padding_mask, mu, l1, grad_mu, *ctx.meta), None, None, None, None


pap_mu_op.register_autograd(_pap_mu_backward, setup_context=_pap_mu_setup)


def _contiguous_or(t: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """``t`` made contiguous, or a tensor the kernel never reads (its flag for ``t`` is off)."""
    return placeholder if t is None else t.contiguous()


def _padding(key_padding_mask: torch.Tensor | None, k: torch.Tensor) -> torch.Tensor:
    """The (B, N) padding mask as int8 (1 = padded), or a tensor the kernel never reads."""
    return k if key_padding_mask is None else key_padding_mask.to(torch.int8).contiguous()


# --- what functional.rpc_attention calls ----------------------------------------------------


def pap_first(k: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``_pap.PapFirst.apply`` on the Triton kernels: ``(S, Kt)``."""
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
    z_new, s_new, kt, _ = pap_step_op(k, tau, l, z, s)
    return z_new, s_new, kt


def pap_mu(
    k: torch.Tensor, width: int, *, key_padding_mask: torch.Tensor | None = None, is_causal: bool = False
) -> torch.Tensor:
    """``_pap.pap_mu`` on the Triton kernels: (B, H, 1, 1), or (B, H, N, 1) when causal, float32."""
    return pap_mu_op(k, key_padding_mask, width, is_causal, L1_EPS)[0]
