"""``torch.compile`` of RPC-Attention matches eager, forward and backward, on each backend.

The Triton path enters the graph as the ``kpca::`` custom ops (one opaque node per kernel launch),
so Inductor neither traces into nor reorders the kernels.
"""

import pytest
import torch

from kpca.attention import _backend, rpc_attention
from kpca.attention._backend import interpreter_enabled

from .helpers import require_triton


def _compiled_matches_eager(device, dtype, backend, **kwargs):
    torch._dynamo.reset()
    k = torch.randn(2, 3, 9, 8, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 3, 9, 8, device=device, dtype=dtype, requires_grad=True)
    weights = torch.randn(2, 3, 9, 8, device=device, dtype=dtype)

    def loss(k, v):
        return (rpc_attention(k, v, n_iter=3, lambd=0.3, backend=backend, **kwargs) * weights).sum()

    eager = [loss(k, v), *torch.autograd.grad(loss(k, v), (k, v))]
    compiled_loss = torch.compile(loss, fullgraph=True)
    value = compiled_loss(k, v)
    compiled = [value, *torch.autograd.grad(value, (k, v))]
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}
    for c, e in zip(compiled, eager, strict=True):
        torch.testing.assert_close(c, e, **tol)


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "is_causal"), [("torch", False), ("auto", True)])
def test_torch_path_compiles_on_cpu(backend, is_causal, monkeypatch):
    monkeypatch.setattr(_backend, "_logged", set())  # "auto" logs its first choice while being traced
    _compiled_matches_eager("cpu", torch.float32, backend, is_causal=is_causal)


@pytest.mark.slow
@pytest.mark.triton
def test_triton_path_compiles_on_cpu_under_the_interpreter():
    if not interpreter_enabled():
        pytest.skip("CPU Triton tests need TRITON_INTERPRET=1 (conftest.py sets it only where CUDA is absent)")
    require_triton()
    _compiled_matches_eager("cpu", torch.float32, "triton", is_causal=True)


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiles_on_cuda(backend, dtype):
    _compiled_matches_eager("cuda", dtype, backend, is_causal=True)


@pytest.mark.gpu
@pytest.mark.triton
def test_auto_on_cuda_compiles_once(monkeypatch):
    """``auto`` checks that Triton runs while tracing, as a constant of the trace: its outcome adds no recompile."""
    monkeypatch.setattr(_backend, "_triton_ran", False)  # as in a fresh process
    monkeypatch.setattr(_backend, "_triton_failure", None)
    monkeypatch.setattr(_backend, "_logged", set())
    torch._dynamo.reset()
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(lambda k, v: rpc_attention(k, v, n_iter=2, lambd=0.5), backend=counting_backend)
    k, v = torch.randn(2, 3, 9, 8, device="cuda"), torch.randn(2, 3, 9, 8, device="cuda")
    for _ in range(3):
        compiled(k, v)
    assert len(graphs) == 1 and _backend._triton_ran
