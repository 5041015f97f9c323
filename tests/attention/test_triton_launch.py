"""How the Triton ops launch their kernels: on the inputs' device, with tiles and alignment hints that fit the inputs.

CPU cases run the kernels in Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py on
machines without CUDA); ``gpu`` cases run compiled kernels on CUDA.
"""

import contextlib

import pytest
import torch

from kpca.attention import rpc_attention
from kpca.attention._pap import PapFirst, PapStep, pap_mu

from .helpers import TRITON_DEVICES as DEVICES
from .helpers import require_triton

require_triton()
from kpca.attention._triton import kernels, ops  # noqa: E402 (after the triton check)

pytestmark = pytest.mark.triton


class _LaunchRecorder:
    """A kernel whose launches record the device of the innermost ``ops._device_guard`` around them, then run."""

    def __init__(self, name, kernel, guarded_devices, launches):
        self.name, self.kernel, self.guarded_devices, self.launches = name, kernel, guarded_devices, launches

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.launches.append((self.name, self.guarded_devices[-1] if self.guarded_devices else None))
            return launch(*args, **kwargs)

        return run


@pytest.fixture
def launches(monkeypatch):
    """(kernel name, device of the guard it launched under, None outside any) for every launch of the test."""
    guarded_devices, recorded = [], []
    real_guard = ops._device_guard

    @contextlib.contextmanager
    def recording_guard(t):
        with real_guard(t):
            guarded_devices.append(t.device)
            try:
                yield
            finally:
                guarded_devices.pop()

    monkeypatch.setattr(ops, "_device_guard", recording_guard)
    for name in kernels.__all__:
        monkeypatch.setattr(kernels, name, _LaunchRecorder(name, getattr(kernels, name), guarded_devices, recorded))
    return recorded


def _forward_and_backward_of_every_op(device):
    k = torch.randn(2, 3, 5, 4, device=device, requires_grad=True)
    tau = (0.3 + torch.rand(2, 3, 1, 1, device=device)).requires_grad_()
    s, kt = ops.pap_first(k, tau)
    z, s, kt2 = ops.pap_step(k, tau, kt.detach().requires_grad_(), None, s)
    z, s, kt3 = ops.pap_step(k, tau, kt2, z, s)
    padding = torch.zeros(2, 5, dtype=torch.bool, device=device)
    padding[0, -1] = True
    mu = ops.pap_mu(k, 12, key_padding_mask=padding, is_causal=True)
    (kt + kt3 + z + s).sum().add(mu.sum()).backward()
    return k


@pytest.mark.parametrize("device", DEVICES)
def test_every_launch_runs_under_the_device_guard_of_its_inputs(device, launches):
    """Triton launches on the current device: each op must make its inputs' device current first."""
    k = _forward_and_backward_of_every_op(device)
    assert {name for name, _ in launches} == set(kernels.__all__)
    unguarded = [(name, guarded) for name, guarded in launches if guarded != k.device]
    assert not unguarded, f"launched outside a guard of {k.device}: {unguarded}"


def _row_starts(t: torch.Tensor) -> list[int]:
    """The element offset of every (b, h, n) row of a (B, H, N, D) tensor, by brute force."""
    index = torch.cartesian_prod(*(torch.arange(size) for size in t.shape[:-1]))  # (B * H * N, 3)
    return (index * torch.tensor(t.stride()[:-1])).sum(1).tolist()


@pytest.mark.parametrize("d", [64, 72, 40, 4, 3])
@pytest.mark.parametrize(
    "view",
    [
        lambda d: torch.empty(2, 7, 3, d).transpose(1, 2),  # the modules' heads of (B, N, H, D)
        lambda d: torch.empty(2, 3, 7, d),
        lambda d: torch.empty(2, 3, 7, d + 1)[..., :d],  # rows d + 1 apart
        lambda d: torch.empty(1, 3, 1, d + 4)[..., :d],  # one b and one n: their strides never count
        lambda d: torch.empty(2, 3, d, 7).transpose(2, 3),  # D-major: no contiguous rows
    ],
    ids=["module_layout", "contiguous", "padded_rows", "size_one_dims", "d_major"],
)
def test_row_alignment_is_the_largest_that_divides_every_row_start(view, d):
    t = view(d)
    rows_contiguous = t.stride(-1) == 1
    divides = [a for a in (16, 8, 4, 2, 1) if all(start % a == 0 for start in _row_starts(t)) and rows_contiguous]
    assert ops._row_alignment(t) == (divides[0] if divides else 1)


def test_row_alignment_of_the_module_layout():
    """The hint the JIT misses: strides of 72 or 40 elements are multiples of 8, not of 16."""
    assert [ops._row_alignment(torch.empty(2, 7, 3, d).transpose(1, 2)) for d in (64, 72, 40)] == [16, 8, 8]


def test_tiles_fit_short_sequences_and_long_ones_fit_the_grid():
    assert ops._slice_blocks(197, 64) == (ops.MAX_BLOCK_ELEMENTS // 64, 64)
    assert ops._slice_blocks(5, 72) == (8, 128)  # no more rows than N needs
    assert ops._slice_blocks(0, 4) == (1, 4)  # empty: a valid (never launched) tile
    assert ops._slice_grid(12, 197, 32) == (12, 7)
    limit = ops.MAX_GRID_AXIS_1
    assert ops._slice_grid(1, limit * 16, 16) == (1, limit)
    with pytest.raises(ValueError, match=f"N = {limit * 16 + 1} tokens need {limit + 1} blocks.*backend='torch'"):
        ops._slice_grid(1, limit * 16 + 1, 16)


@pytest.mark.gpu
def test_inputs_on_a_second_gpu_run_there_while_the_first_is_current():
    """Without the device guard, Triton would launch on cuda:0 with cuda:1 pointers: an illegal address."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices: keys on cuda:1 while cuda:0 is the current device")
    k = torch.randn(2, 4, 64, 72, device="cuda:1", requires_grad=True)
    v = torch.randn(2, 4, 64, 72, device="cuda:1", requires_grad=True)
    results = []
    with torch.cuda.device(0):
        for backend in ("triton", "torch"):
            out = rpc_attention(k, v, n_iter=3, lambd=0.5, is_causal=True, backend=backend)
            results.append([out, *torch.autograd.grad(out.square().sum(), (k, v))])
        _forward_and_backward_of_every_op("cuda:1")
        torch.cuda.synchronize("cuda:1")
        assert torch.cuda.current_device() == 0
    for a, e in zip(*results, strict=True):
        assert a.device == torch.device("cuda:1")
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_d_major_view_with_column_offsets_past_int32():
    """(D - 1) * s_d >= 2^31: the column offsets must be int64 products (they wrapped in int32 before)."""
    k = torch.randn(64, 2, 16, 1_100_000, device="cuda", dtype=torch.bfloat16).permute(1, 2, 3, 0)  # (B, H, N, D)
    assert (k.shape[-1] - 1) * k.stride(-1) >= 2**31
    tau = 0.3 + torch.rand(2, 16, 1, 1, device="cuda")
    for a, e in zip(ops.pap_first(k, tau), PapFirst.apply(k, tau), strict=True):
        assert torch.equal(a, e)
    torch.testing.assert_close(ops.pap_mu(k, 1024), pap_mu(k, 1024))


@pytest.mark.gpu
def test_more_than_2_pow_31_elements_tail_rows():
    """Offsets past 2^31 elements: the last rows of one op on the whole tensor match the torch path on those rows."""
    b, h, n, d = 16, 16, 65536 + 64, 128  # 2^31 + 2^17 elements, 4 GiB of bf16
    k = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    l = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # noqa: E741
    s = torch.zeros(b, h, n, d, device="cuda")
    tau = 0.3 + torch.rand(b, h, 1, 1, device="cuda")
    z_new, s_new, kt = ops.pap_step(k, tau, l, None, s)
    tail = (slice(-1, None), slice(-1, None), slice(-64, None))
    expected = PapStep.apply(k[tail], tau[tail[:2]], l[tail], None, s[tail])
    for a, e in zip((z_new[tail], s_new[tail], kt[tail]), expected, strict=True):
        assert torch.equal(a, e)
