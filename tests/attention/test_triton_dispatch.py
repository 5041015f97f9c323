"""``auto``'s rules for Triton, on CPU: one check per process says whether Triton runs; a call's errors propagate.

The kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py where CUDA is
absent), and ``auto`` is told to send CPU inputs to them (``TRITON_DEVICE_TYPES``). A real failing
launch under ``auto`` (compiled kernels on CPU tensors, in a subprocess) is in test_backend_dispatch.py.
"""

import logging

import pytest
import torch

from kpca.attention import _backend, rpc_attention
from kpca.attention._backend import ENV_VAR, resolve_backend, run_on_backend

from .helpers import require_triton

require_triton()
from kpca.attention._triton import ops  # noqa: E402 (after the triton check)

pytestmark = pytest.mark.triton


@pytest.fixture(autouse=True)
def _auto_sends_cpu_inputs_to_the_interpreted_kernels(monkeypatch):
    """Fresh dispatch state (Triton unchecked, nothing logged), and ``auto`` taking Triton for CPU inputs."""
    if not _backend.interpreter_enabled():
        pytest.skip("runs the kernels on CPU under TRITON_INTERPRET=1 (conftest.py sets it only where CUDA is absent)")
    monkeypatch.setattr(_backend, "_default", None)
    monkeypatch.setattr(_backend, "_logged", set())
    monkeypatch.setattr(_backend, "_triton_failure", None)
    monkeypatch.setattr(_backend, "_triton_ran", False)
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(_backend, "TRITON_DEVICE_TYPES", ("cuda", "cpu"))


@pytest.fixture
def launch_checks(monkeypatch):
    """The devices :func:`ops.try_launch` was called with (the real check still runs)."""
    devices = []
    real_try_launch = ops.try_launch

    def recording_try_launch(device):
        devices.append(device)
        real_try_launch(device)

    monkeypatch.setattr(ops, "try_launch", recording_try_launch)
    return devices


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "error",
    [ValueError("k must be a (B, H, N, D) tensor"), torch.OutOfMemoryError("CUDA out of memory")],
    ids=["input_error", "out_of_memory"],
)
def test_errors_of_the_first_call_propagate_and_keep_triton(error, launch_checks, caplog):
    k = torch.randn(1, 2, 5, 4)

    def run(impl):
        raise error

    with pytest.raises(type(error)) as raised:
        run_on_backend("auto", k, run)
    assert raised.value is error
    assert launch_checks == [torch.device("cpu")]  # the one check ran, and Triton passed it
    assert _backend._triton_failure is None
    assert resolve_backend("auto", k) == "triton"
    assert run_on_backend("auto", k, lambda impl: impl) == "triton"
    assert launch_checks == [torch.device("cpu")]  # not checked again
    assert not _warnings(caplog)


def test_a_failing_check_makes_auto_take_torch_with_one_warning(monkeypatch, caplog):
    def no_driver(device):
        raise RuntimeError("0 active drivers ([]). There should only be one.")

    monkeypatch.setattr(ops, "try_launch", no_driver)
    k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    expected = rpc_attention(k, v, n_iter=2, lambd=0.5, backend="torch")
    for _ in range(2):
        assert torch.equal(rpc_attention(k, v, n_iter=2, lambd=0.5), expected)
    assert resolve_backend("auto", k) == "torch"
    cause = "RuntimeError: 0 active drivers ([]). There should only be one."
    assert _warnings(caplog) == [f"backend='auto': Triton failed at its first use ({cause}); using torch from now on"]


def test_out_of_memory_in_the_check_propagates(monkeypatch):
    def out_of_memory(device):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    monkeypatch.setattr(ops, "try_launch", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        run_on_backend("auto", torch.randn(1, 2, 5, 4), lambda impl: impl)
    assert _backend._triton_failure is None and not _backend._triton_ran  # checked again at the next call


def test_explicit_triton_is_not_checked(launch_checks):
    k = torch.randn(1, 2, 5, 4)
    assert run_on_backend("triton", k, lambda impl: impl) == "triton"
    assert launch_checks == []


def test_head_dim_zero_is_refused_before_any_launch():
    k = torch.randn(1, 2, 5, 0)
    assert resolve_backend("auto", k) == "torch"
    with pytest.raises(RuntimeError, match="head dim D=0: the Triton kernels need D >= 1"):
        resolve_backend("triton", k)
    with pytest.raises(ValueError, match=r"k has head dim D = 0 \(shape \(1, 2, 5, 0\)\); the Triton kernels need D"):
        ops.pap_first(k, torch.ones(1, 2, 1, 1))


@pytest.mark.slow
def test_compiled_auto_checks_triton_once_while_tracing_and_compiles_once(launch_checks):
    """The check's outcome is a constant of the trace: no guard on it, so no recompile when it flips."""
    torch._dynamo.reset()
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(
        lambda k, v: rpc_attention(k, v, n_iter=2, lambd=0.5), backend=counting_backend, fullgraph=True
    )
    k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    expected = rpc_attention(k, v, n_iter=2, lambd=0.5, backend="torch")
    for _ in range(3):
        torch.testing.assert_close(compiled(k, v), expected)
    assert len(graphs) == 1
    assert launch_checks == [torch.device("cpu")] and _backend._triton_ran
    assert any(node.target is torch.ops.kpca.pap_step.default for node in graphs[0].graph.nodes)  # Triton was traced
