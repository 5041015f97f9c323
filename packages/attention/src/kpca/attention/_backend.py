"""Backend names, the global default and the dispatch rule that picks an implementation per call.

Backends: ``torch`` (portable, any device and dtype), ``triton`` (Triton kernels for the PAP
element-wise steps and mu; CUDA tensors of float32, bfloat16 or float16 with head dim <= 256)
and ``auto``. Every attention evaluation is one SDPA call on every backend.

Which backend a call uses, most specific first: an explicit ``backend="torch" | "triton"`` on the
call or module; else the global default (:func:`set_backend` / :func:`use_backend`); else the
environment variable ``KPCA_ATTN_BACKEND``; else ``auto``, which takes Triton for CUDA inputs it
supports when triton imports, and torch otherwise (each distinct choice logged once at DEBUG).
Before its first Triton call in a process, ``auto`` runs one tiny Triton kernel on the device
type: if that fails (no C compiler to build its launcher, a GPU it does not support, a driver
error), one WARNING names the cause and ``auto`` runs torch from then on, starting with that call
(same results). The calls themselves are never retried on torch: an input error or an
out-of-memory error raises, and leaves Triton in use. Under ``torch.compile`` the check runs
while tracing, as a constant, so its outcome costs no recompile.
A backend named explicitly, anywhere in that chain, never falls back: it raises and says why.
Triton is imported only when a call resolves to it.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Literal, TypeVar, get_args

import torch

from kpca.attention.errors import AttentionOptionError

Backend = Literal["auto", "torch", "triton"]
BACKENDS: tuple[str, ...] = get_args(Backend)
ENV_VAR = "KPCA_ATTN_BACKEND"
MAX_HEAD_DIM = 256
"""Largest head dim D the Triton kernels take (one row of D values per tile row)."""
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TRITON_DEVICE_TYPES: tuple[str, ...] = ("cuda",)
"""Device types the compiled Triton kernels take and ``auto`` sends to them.

Tests add ``"cpu"`` to drive a real failing launch (no GPU, no interpreter) through ``auto``'s fallback.
"""

T = TypeVar("T")
_logger = logging.getLogger(__name__)
_default: str | None = None  # set_backend's value; None defers to ENV_VAR, then "auto"
_logged: set[tuple[str, str]] = set()
_triton_failure: str | None = None  # why Triton failed at its first use under "auto"; "auto" then takes torch
_triton_ran = False  # Triton's first launch under "auto" worked: it is not checked again in this process


def check_backend(backend: str, source: str = "backend") -> None:
    """Raise ``ValueError`` unless ``backend`` is one of :data:`BACKENDS`."""
    if backend not in BACKENDS:
        raise AttentionOptionError(f"{source} must be one of {BACKENDS}, got {backend!r}")


def set_backend(backend: Backend) -> None:
    """Set the global default backend, used by every call and module whose backend is ``"auto"``.

    Args:
        backend: ``"auto"``, ``"torch"`` or ``"triton"``. ``"triton"`` makes calls on inputs the
            kernels cannot take (CPU tensors, float64, D > 256) raise instead of using torch.
    """
    global _default
    check_backend(backend)
    _default = backend


def get_backend() -> str:
    """The global default backend: the last :func:`set_backend`, else ``$KPCA_ATTN_BACKEND``, else ``"auto"``."""
    if _default is not None:
        return _default
    backend = os.environ.get(ENV_VAR, "auto")
    check_backend(backend, f"environment variable {ENV_VAR}")
    return backend


@contextlib.contextmanager
def use_backend(backend: Backend) -> Iterator[None]:
    """Context manager: :func:`set_backend` inside the block, the previous default restored after it.

    The default is process-wide (like timm's fused-attention switch), not per thread.
    """
    global _default
    check_backend(backend)
    previous = _default
    _default = backend
    try:
        yield
    finally:
        _default = previous


def interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET`` asks Triton to run kernels in its CPU interpreter (how tests run them)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on", "y")


def triton_unsupported_reason(k: torch.Tensor) -> str | None:
    """Why the Triton kernels cannot take keys ``k`` (B, H, N, D) in this process, or None if they can."""
    return _triton_unsupported(k.device.type, k.dtype, k.shape[-1])


def resolve_backend(backend: str, k: torch.Tensor) -> Literal["torch", "triton"]:
    """The implementation a call with keys ``k`` (B, H, N, D) runs on, for a requested ``backend``.

    Raises:
        ValueError: ``backend`` (or ``$KPCA_ATTN_BACKEND``) is not a known backend name.
        RuntimeError: ``"triton"`` was requested explicitly and cannot take these inputs.
    """
    requested = _requested(backend)
    if requested == "torch":
        return "torch"
    if requested == "triton":
        reason = triton_unsupported_reason(k)
        if reason is not None:
            raise RuntimeError(f"backend='triton' cannot run this call: {reason}. Use backend='torch' or 'auto'.")
        return "triton"
    return _auto_choice(k.device.type, k.dtype, k.shape[-1])


def run_on_backend(backend: str, k: torch.Tensor, run: Callable[[str], T]) -> T:
    """``run(impl)`` on the implementation :func:`resolve_backend` picks for ``backend`` and keys ``k``.

    Before ``auto``'s first Triton call in this process, :func:`_triton_setup_failure` launches one
    tiny kernel on the keys' device type; if that fails, this call and every later one under
    ``auto`` run on torch. Errors of ``run`` itself always propagate, on every backend: an input
    error or running out of memory belongs to the call, and a retry on torch would hide it.
    """
    impl = resolve_backend(backend, k)
    if impl == "triton" and _requested(backend) == "auto" and _triton_setup_failure(k.device.type) is not None:
        impl = "torch"
    return run(impl)


def _requested(backend: str) -> str:
    """The backend a call asks for: ``backend`` itself, or the global default when it is ``"auto"``."""
    check_backend(backend)
    return get_backend() if backend == "auto" else backend


# The helpers below import triton and log: torch.compile runs them while tracing and keeps their
# results as constants (its guards on the inputs' device and dtype cover their arguments).


@torch.compiler.assume_constant_result
def _triton_unsupported(device_type: str, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why the kernels cannot take inputs of this device type, dtype and head dim here, or None."""
    if device_type not in TRITON_DEVICE_TYPES and not (device_type == "cpu" and interpreter_enabled()):
        return (
            f"the inputs are on {device_type}, and the Triton kernels need CUDA tensors "
            "(CPU tensors only under TRITON_INTERPRET=1, Triton's interpreter, for tests)"
        )
    try:
        importlib.import_module("triton")  # not cached: a later install, or a test blocking it, is seen
    except ImportError as err:
        return f"triton does not import ({err}); install it (it ships with CUDA builds of torch)"
    if dtype not in TRITON_DTYPES:
        return f"dtype {dtype} is not supported by the Triton kernels (float32, bfloat16, float16)"
    if head_dim > MAX_HEAD_DIM:
        return f"head dim D={head_dim} exceeds the Triton kernels' limit of {MAX_HEAD_DIM}"
    if head_dim < 1:
        return f"head dim D={head_dim}: the Triton kernels need D >= 1"
    return None


@torch.compiler.assume_constant_result
def _auto_choice(device_type: str, dtype: torch.dtype, head_dim: int) -> str:
    """``auto``: Triton for CUDA inputs the kernels take, torch otherwise; each distinct choice logged once."""
    if device_type not in TRITON_DEVICE_TYPES:
        choice, reason = "torch", f"inputs on {device_type}"
    elif _triton_failure is not None:
        choice, reason = "torch", f"Triton failed at its first use in this process ({_triton_failure})"
    else:
        unsupported = _triton_unsupported(device_type, dtype, head_dim)
        choice = "torch" if unsupported is not None else "triton"
        reason = unsupported or f"{device_type} {dtype} inputs with D={head_dim}"
    if (choice, reason) not in _logged:
        _logged.add((choice, reason))
        _logger.debug("backend='auto' runs on %s: %s", choice, reason)
    return choice


@torch.compiler.assume_constant_result
def _triton_setup_failure(device_type: str) -> str | None:
    """Why Triton cannot run on ``device_type`` in this process, or None: one tiny launch, at most once per process.

    The launch's inputs are valid, so any error it raises means Triton cannot run here, except
    running out of memory, which propagates. The first failure is kept and logged as one WARNING.
    """
    global _triton_failure, _triton_ran
    if _triton_ran or _triton_failure is not None:
        return _triton_failure
    try:
        from kpca.attention._triton import ops  # imported on first use: triton is optional

        ops.try_launch(torch.device(device_type))
    except torch.OutOfMemoryError:
        raise
    except Exception as err:
        _triton_failure = f"{type(err).__name__}: {err}"
        _logger.warning("backend='auto': Triton failed at its first use (%s); using torch from now on", _triton_failure)
        return _triton_failure
    _triton_ran = True
    return None
