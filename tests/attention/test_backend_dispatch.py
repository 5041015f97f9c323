"""Backend selection: the global default, the environment override, per-call choice, every error, and the
fallback of ``auto`` to torch when Triton fails at its first use.

No GPU needed: CUDA inputs are fake tensors (``FakeTensorMode``), which carry a device, dtype and
shape but no data, and only the dispatch rule looks at them. The fallback is driven by a real
failing Triton launch: CPU tensors sent to compiled (not interpreted) kernels, in a subprocess.
"""

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kpca.attention import (
    AttentionSpec,
    RPCAttention,
    _backend,
    get_backend,
    rpc_attention,
    set_backend,
    softmax_attention,
    use_backend,
)
from kpca.attention._backend import ENV_VAR, resolve_backend

from .helpers import require_triton


@pytest.fixture(autouse=True)
def _fresh_backend_state(monkeypatch):
    """No global default, no environment override, nothing logged yet, Triton untried; all restored after the test."""
    monkeypatch.setattr(_backend, "_default", None)
    monkeypatch.setattr(_backend, "_logged", set())
    monkeypatch.setattr(_backend, "_triton_failure", None)
    monkeypatch.setattr(_backend, "_triton_ran", False)
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _cuda_keys(dtype=torch.float16, d=64):
    with FakeTensorMode():
        return torch.empty(2, 3, 16, d, device="cuda", dtype=dtype)


def test_default_is_auto_and_set_get_round_trip():
    assert get_backend() == "auto"
    set_backend("torch")
    assert get_backend() == "torch"
    set_backend("triton")
    assert get_backend() == "triton"


def test_use_backend_restores_the_previous_default_even_on_error():
    set_backend("torch")
    with use_backend("triton"):
        assert get_backend() == "triton"
    assert get_backend() == "torch"
    with pytest.raises(KeyError), use_backend("auto"):
        raise KeyError("inside")
    assert get_backend() == "torch"


def test_environment_override_and_precedence(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "torch")
    assert get_backend() == "torch"
    assert resolve_backend("auto", _cuda_keys()) == "torch"
    assert resolve_backend("triton", _cuda_keys()) == "triton"  # an explicit per-call choice wins
    set_backend("triton")  # set_backend wins over the environment
    assert resolve_backend("auto", _cuda_keys()) == "triton"
    assert resolve_backend("torch", _cuda_keys()) == "torch"


@pytest.mark.parametrize(
    "call",
    [
        lambda: set_backend("cuda"),
        lambda: use_backend("flash").__enter__(),
        lambda: resolve_backend("Triton", torch.zeros(1, 1, 1, 1)),
        lambda: rpc_attention(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), n_iter=1, lambd=1.0, backend="gpu"),
        lambda: RPCAttention(8, 2, backend="fast"),
        lambda: AttentionSpec(kind="rpc", backend="cuda"),
    ],
)
def test_unknown_backend_names_raise(call):
    with pytest.raises(ValueError, match="must be one of \\('auto', 'torch', 'triton'\\)"):
        call()


def test_invalid_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "cuda")
    with pytest.raises(ValueError, match=f"environment variable {ENV_VAR} must be one of.*'cuda'"):
        rpc_attention(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), n_iter=1, lambd=1.0)


def test_auto_takes_torch_on_cpu_even_under_the_interpreter(monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    caplog.set_level(logging.DEBUG, logger=_backend.__name__)
    for _ in range(3):
        assert resolve_backend("auto", torch.zeros(1, 1, 2, 2)) == "torch"
    messages = [r.getMessage() for r in caplog.records if r.name == _backend.__name__]
    assert messages == ["backend='auto' runs on torch: inputs on cpu"]  # logged once


def test_auto_takes_triton_for_supported_cuda_inputs():
    require_triton()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert resolve_backend("auto", _cuda_keys(dtype)) == "triton"
    assert resolve_backend("auto", _cuda_keys(d=256)) == "triton"


@pytest.mark.parametrize(
    ("keys", "reason"),
    [
        (lambda: _cuda_keys(torch.float64), "dtype torch.float64 is not supported"),
        (lambda: _cuda_keys(d=257), "head dim D=257 exceeds the Triton kernels' limit of 256"),
    ],
    ids=["float64", "head_dim"],
)
def test_auto_falls_back_and_explicit_triton_raises(keys, reason):
    require_triton()
    assert resolve_backend("auto", keys()) == "torch"
    with pytest.raises(RuntimeError, match=f"backend='triton' cannot run this call: {reason}.*backend='torch'"):
        resolve_backend("triton", keys())
    set_backend("triton")  # a global "triton" is explicit too: it never falls back
    with pytest.raises(RuntimeError, match=reason):
        resolve_backend("auto", keys())


def test_explicit_triton_without_triton_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    assert resolve_backend("auto", _cuda_keys()) == "torch"
    with pytest.raises(RuntimeError, match="triton does not import"):
        resolve_backend("triton", _cuda_keys())


def test_explicit_triton_on_cpu_raises_without_the_interpreter(no_interpreter):
    k = torch.randn(1, 2, 4, 4)
    expected = "backend='triton' cannot run this call: the inputs are on cpu.*TRITON_INTERPRET=1"
    with pytest.raises(RuntimeError, match=expected):
        rpc_attention(k, k, n_iter=2, lambd=1.0, backend="triton")
    with pytest.raises(RuntimeError, match=expected):
        softmax_attention(k, k, k, backend="triton")
    with pytest.raises(RuntimeError, match=expected), use_backend("triton"):
        rpc_attention(k, k, n_iter=2, lambd=1.0)


def test_explicit_triton_on_cpu_is_allowed_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    require_triton()
    assert resolve_backend("triton", torch.zeros(1, 1, 2, 4)) == "triton"
    with pytest.raises(RuntimeError, match="dtype torch.float64"):
        resolve_backend("triton", torch.zeros(1, 1, 2, 4, dtype=torch.float64))


def test_modules_resolve_their_backend_at_each_call(no_interpreter):
    module = RPCAttention(8, 2, n_iter=2).eval()
    assert module.backend == "auto"
    x = torch.randn(1, 5, 8)
    expected = module(x)
    with use_backend("triton"), pytest.raises(RuntimeError, match="the inputs are on cpu"):
        module(x)
    module.backend = "torch"  # an explicit module backend wins over the global default
    with use_backend("triton"):
        torch.testing.assert_close(module(x), expected)
    with pytest.raises(RuntimeError, match="the inputs are on cpu"):
        RPCAttention(8, 2, n_iter=2, backend="triton")(x)


FALLBACK_CODE = """
import json, logging.handlers, torch
from kpca.attention import _backend, rpc_attention
from kpca.attention._backend import resolve_backend

handler = logging.handlers.BufferingHandler(capacity=100)
handler.setLevel(logging.WARNING)
logging.getLogger("kpca.attention").addHandler(handler)
_backend.TRITON_DEVICE_TYPES = ("cuda", "cpu")  # "auto" sends CPU inputs to the compiled kernels: their launch fails
k, v = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
result = {"picked": resolve_backend("auto", k)}
expected = rpc_attention(k, v, n_iter=3, lambd=0.5, backend="torch")
result["equal"] = [torch.equal(rpc_attention(k, v, n_iter=3, lambd=0.5), expected) for _ in range(2)]
result["picked_after"] = resolve_backend("auto", k)
result["explicit_error"] = None
try:
    rpc_attention(k, v, n_iter=3, lambd=0.5, backend="triton")
except Exception as err:
    result["explicit_error"] = f"{type(err).__name__}: {err}"
result["warnings"] = [record.getMessage() for record in handler.buffer]
print(json.dumps(result))
"""


@pytest.mark.triton
def test_auto_falls_back_to_torch_once_when_the_triton_launch_fails():
    """A real launch failure, "0 active drivers" on a CPU machine (a CPU-pointer error where CUDA is present)."""
    require_triton()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled kernels, not the interpreter
    done = subprocess.run([sys.executable, "-c", FALLBACK_CODE], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["picked"] == "triton" and result["picked_after"] == "torch"
    assert result["equal"] == [True, True]  # the failing call and the next one: the torch path's output
    cause = result["explicit_error"]
    assert cause is not None, "an explicit backend='triton' must raise the real error"
    if not torch.cuda.is_available():
        assert cause == "RuntimeError: 0 active drivers ([]). There should only be one."
    assert result["warnings"] == [f"backend='auto': Triton failed at its first use ({cause}); using torch from now on"]


@pytest.mark.triton
def test_auto_keeps_triton_that_works_and_lets_later_errors_through(monkeypatch, caplog):
    require_triton()
    if not _backend.interpreter_enabled():
        pytest.skip("runs the kernels on CPU under TRITON_INTERPRET=1 (conftest.py sets it only where CUDA is absent)")
    monkeypatch.setattr(_backend, "TRITON_DEVICE_TYPES", ("cuda", "cpu"))  # "auto" sends CPU inputs to the kernels
    k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    torch.testing.assert_close(
        rpc_attention(k, v, n_iter=2, lambd=0.5), rpc_attention(k, v, n_iter=2, lambd=0.5, backend="torch")
    )
    assert _backend._triton_ran

    def run(impl):
        raise MemoryError(f"out of memory on {impl}")  # an error of the call, once Triton has run

    with pytest.raises(MemoryError, match="out of memory on triton"):
        _backend.run_on_backend("auto", k, run)
    assert resolve_backend("auto", k) == "triton"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
