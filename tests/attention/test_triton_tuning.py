"""The public hooks into the Triton backend (kpca.attention.triton_tuning) that the benchmarks use.

CPU cases run the kernels in Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py on machines without
CUDA).
"""

import pytest
import torch

from kpca.attention import rpc_attention
from kpca.attention.triton_tuning import LaunchConfiguration, launch_configuration, launched_with, stubbed_kernels

from .helpers import require_triton

require_triton()

pytestmark = pytest.mark.triton

SHAPE = (1, 2, 40, 8)  # (B, H, N, D): 40 rows need several tiles of the small configurations
N_ITER, LAMBD = 3, 4.0


def rpc_forward_backward(k: torch.Tensor, v: torch.Tensor, backend: str) -> tuple[torch.Tensor, ...]:
    """The output of ``rpc_attention`` and the gradients of K and V, for a fixed output gradient."""
    k, v = k.detach().requires_grad_(), v.detach().requires_grad_()
    out = rpc_attention(k, v, n_iter=N_ITER, lambd=LAMBD, backend=backend)  # (B, H, N, D)
    grad = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    return (out.detach(), *torch.autograd.grad(out, (k, v), grad))


def max_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest absolute difference from a float64 reference."""
    return (actual.double() - reference).abs().max().item()


@pytest.mark.parametrize(("num_warps", "block_elements"), [(1, 16), (2, 64), (8, 4096)])
def test_a_launch_configuration_changes_tiles_not_results(num_warps: int, block_elements: int):
    """Each configuration gives the default configuration's results, within float32 rounding of the float64 reference:
    an error at most twice the float32 torch path's, or 1e-5 of the largest value where that is larger (the torch
    path's own rounding differs between CPUs, by 5e-5 on gradients of size 35 on one, so the two float32 paths are
    not compared to each other)."""
    k, v = torch.randn(SHAPE), torch.randn(SHAPE)  # float32: the kernels' widest input
    reference = rpc_forward_backward(k.double(), v.double(), "torch")
    torch_path = rpc_forward_backward(k, v, "torch")
    default = launch_configuration()
    with_default = rpc_forward_backward(k, v, "triton")
    with launched_with(num_warps, block_elements) as used:
        assert launch_configuration() == used == LaunchConfiguration(num_warps, block_elements)
        got = rpc_forward_backward(k, v, "triton")
    assert launch_configuration() == default
    results = zip(("out", "dk", "dv"), got, with_default, torch_path, reference, strict=True)
    for name, left, right, torch_out, exact in results:
        scale = exact.abs().max().item()
        torch.testing.assert_close(left, right, rtol=1e-6, atol=1e-6 * scale, msg=name)
        assert max_error(left, exact) <= max(2 * max_error(torch_out, exact), 1e-5 * scale), name


def test_the_configuration_before_is_restored_after_an_error():
    default = launch_configuration()
    with pytest.raises(RuntimeError, match="inside"), launched_with(4, 256):
        raise RuntimeError("inside")
    assert launch_configuration() == default


@pytest.mark.parametrize(
    ("num_warps", "block_elements", "message"),
    [(3, 2048, r"num_warps=3: choose one of \(1, 2"), (4, 1000, "pass 512 or 1024"), (4, 0, "power of two")],
)
def test_a_launch_configuration_triton_cannot_take_is_refused(num_warps: int, block_elements: int, message: str):
    default = launch_configuration()
    with pytest.raises(ValueError, match=message), launched_with(num_warps, block_elements):
        pass
    assert launch_configuration() == default


def test_stubbed_kernels_count_the_launches_and_the_kernels_come_back():
    k, v = torch.randn(SHAPE), torch.randn(SHAPE)
    before = rpc_forward_backward(k, v, "triton")
    with stubbed_kernels() as launches:
        k_leaf = k.clone().requires_grad_()
        out = rpc_attention(k_leaf, v, n_iter=N_ITER, lambd=LAMBD, backend="triton")
        forward = sum(launches.values())
        out.sum().backward()
        backward = sum(launches.values()) - forward
    assert forward == backward == N_ITER + 2  # row_l1, mu_scan, pap_first, n_iter - 1 pap_steps (and back)
    assert set(launches) >= {"row_l1", "mu_scan", "pap_first_fwd", "pap_step_fwd", "pap_step_bwd"}
    after = rpc_forward_backward(k, v, "triton")  # the real kernels are back
    for left, right in zip(after, before, strict=True):
        assert torch.equal(left, right)
