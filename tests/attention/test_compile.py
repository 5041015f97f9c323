"""``torch.compile`` of RPC-Attention matches eager, forward and backward, on each backend.

The Triton path enters the graph as the ``kpca::`` custom ops (one opaque node per kernel launch),
so Inductor neither traces into nor reorders the kernels.
"""

import os
import subprocess
import sys

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


AOT_CODE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kpca.attention._triton import kernels as K

def compile_for_sm90(fn, dtype, **constexprs):
    signature = {name: "i32" for name in fn.arg_names}
    signature.update({name: "*fp32" for name in fn.arg_names if name.endswith("_ptr")})
    signature.update({name: f"*{dtype}" for name in ("k_ptr", "l_ptr", "kt_ptr", "gk_ptr", "gl_ptr", "gkt_ptr")})
    signature.update({name: "*i8" for name in ("sign_ptr", "pad_ptr")})
    signature.update({name: "fp32" for name in ("width", "eps")})
    signature = {name: signature[name] for name in fn.arg_names}
    signature.update({name: "constexpr" for name in constexprs})
    triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32))

tile = {"BLOCK_R": 64, "BLOCK_D": 64}
for dtype in ("bf16", "fp16"):
    compile_for_sm90(K.pap_first_fwd, dtype, **tile)
    compile_for_sm90(K.pap_first_bwd, dtype, HAS_GS=True, HAS_GKT=False, **tile)
    compile_for_sm90(K.pap_step_fwd, dtype, HAS_Z=True, **tile)
    compile_for_sm90(K.pap_step_bwd, dtype, HAS_GZ=True, HAS_GS=False, HAS_GKT=True, NEED_GZ=True, **tile)
    compile_for_sm90(K.row_l1, dtype, HAS_PAD=True, **tile)
    compile_for_sm90(K.row_l1_bwd, dtype, HAS_PAD=True, **tile)
for causal in (False, True):
    compile_for_sm90(K.mu_scan, "fp32", HAS_PAD=True, CAUSAL=causal, BLOCK_N=128)
    compile_for_sm90(K.mu_grad_scan, "fp32", CAUSAL=causal, BLOCK_N=128)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.triton
def test_kernels_compile_for_cuda_without_a_gpu(tmp_path):
    """Ahead-of-time compilation to sm_90 cubin: what the interpreter does not check (types, lowering)."""
    require_triton()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", AOT_CODE], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiles_on_cuda(backend, dtype):
    _compiled_matches_eager("cuda", dtype, backend, is_causal=True)
