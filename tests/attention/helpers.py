"""Small builders shared by the attention tests."""

import importlib
import os
from types import ModuleType

import pytest
import torch

from kpca.attention import elliptical_attention, neutreno_attention, twicing_attention
from kpca.attention._backend import interpreter_enabled
from kpca.attention.reference import (
    elliptical_attention_reference,
    neutreno_attention_reference,
    twicing_attention_reference,
)

REQUIRE_TRITON_ENV = "KPCA_REQUIRE_TRITON"


def require_triton() -> ModuleType:
    """Import ``triton.language``: skip the test where Triton is absent, fail instead under ``KPCA_REQUIRE_TRITON=1``.

    Triton is pinned, so CI (``.ci/run``) sets the variable: a missing or broken install then fails the Triton
    tests rather than turning them into silent skips.
    """
    if os.environ.get(REQUIRE_TRITON_ENV) == "1":
        return importlib.import_module("triton.language")
    return pytest.importorskip("triton.language")


def make_kv(b=2, h=3, n=7, d=4, dtype=torch.float64, requires_grad=True, scale=1.0):
    """Random (B, H, N, D) keys and values."""
    k = (scale * torch.randn(b, h, n, d, dtype=dtype)).requires_grad_(requires_grad)
    v = torch.randn(b, h, n, d, dtype=dtype).requires_grad_(requires_grad)
    return k, v


def outputs_and_grads(fn, *inputs):
    """fn(*inputs) and the gradients of a non-trivial scalar of it w.r.t. the inputs."""
    out = fn(*inputs)
    weights = torch.linspace(-1.0, 2.0, out.numel(), dtype=out.dtype).view_as(out)
    grads = torch.autograd.grad((out * weights).sum() + out.square().sum(), inputs)
    return out, grads


def assert_vit_holds(vit: torch.nn.Module, state: dict[str, torch.Tensor], attn_dim: int) -> None:
    """Assert that ``vit`` holds the checkpoint ``state`` (timm key names), its qkv rows in the model's layout.

    Every model tensor equals the checkpoint's, except a qkv weight or bias: its K and V rows (the last
    2 * ``attn_dim``) equal the checkpoint's, and its Q rows, if the model has them, equal the checkpoint's Q, or
    the model's own K where the checkpoint is symmetric (``[K;V]``, no Q).
    """
    for key, value in vit.state_dict().items():
        source = state[key]
        if not key.endswith((".qkv.weight", ".qkv.bias")):
            assert torch.equal(value, source), key
            continue
        kv = 2 * attn_dim
        assert value.shape[0] in (kv, kv + attn_dim), f"{key}: {tuple(value.shape)} is no qkv of width {attn_dim}"
        assert torch.equal(value[-kv:], source[-kv:]), f"{key}: the K and V rows differ from the checkpoint's"
        if value.shape[0] > kv:  # the first rows of [Q;K;V] are Q, of [K;V] K: Q is the checkpoint's Q, else its K
            assert torch.equal(value[:attn_dim], source[:attn_dim]), f"{key}: Q is neither the checkpoint's Q nor K"


TRITON_DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            not interpreter_enabled(),
            reason="CPU Triton tests need TRITON_INTERPRET=1 (conftest.py sets it only where CUDA is absent)",
        ),
    ),
    pytest.param("cuda", marks=pytest.mark.gpu),
]
"""Where the Triton kernels are tested: CPU in Triton's interpreter, and CUDA (``gpu``) compiled."""


NEUTRENO_LAMBD = 0.6  # NeuTRENO's vision setting
ROBUST_FUNCTIONS = {
    "twicing": lambda q, k, v, w, **kw: twicing_attention(q, k, v, **kw),
    "neutreno": lambda q, k, v, w, **kw: neutreno_attention(q, k, v, w, lambd=NEUTRENO_LAMBD, **kw),
    "elliptical": lambda q, k, v, w, **kw: elliptical_attention(q, k, v, w, **kw),
}
"""Each robust kind as ``fn(q, k, v, w, **masks)``; w is NeuTRENO's v_first, Elliptical's v_prev, unused by Twicing."""
ROBUST_REFERENCES = {
    "twicing": lambda q, k, v, w, **kw: twicing_attention_reference(q, k, v, **kw),
    "neutreno": lambda q, k, v, w, **kw: neutreno_attention_reference(q, k, v, w, lambd=NEUTRENO_LAMBD, **kw),
    "elliptical": lambda q, k, v, w, **kw: elliptical_attention_reference(q, k, v, w, **kw),
}
"""The float64 references of :data:`ROBUST_FUNCTIONS`, called the same way."""
