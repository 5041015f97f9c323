"""Kernel launches and other device work per ``rpc_attention(n_iter)`` call on the Triton path, forward and backward.

The Triton path is launch-bound at ViT sizes, so its launch count is a budget, checked here on CPU: every jit
kernel is stubbed to record its launch instead of running (the outputs are then garbage; only the counts
matter), and a ``TorchDispatchMode`` records the aten ops that would launch device kernels too (everything but
views and allocations; SDPA, the n_iter attention evaluations themselves, is counted apart). Both dispatch paths
are counted: eager calls (``autograd.Function``) and the custom ops that ``torch.compile`` traces.
Host time per call is a benchmark, not a test: ``benchmarks/dispatch.py``.
"""

import collections
from typing import NamedTuple

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kpca.attention import _backend, rpc_attention

from .helpers import require_triton

require_triton()
from kpca.attention._triton import kernels, ops  # noqa: E402 (after the triton check)

pytestmark = pytest.mark.triton


class Budget(NamedTuple):
    """A count linear in n_iter: ``per_iteration * n_iter + fixed``."""

    per_iteration: int
    fixed: int

    def at(self, n_iter: int) -> int:
        return self.per_iteration * n_iter + self.fixed


# Triton launches, n_iter + 2: row_l1 and mu_scan (which writes tau = lambd * mu or lambd / mu), pap_first_fwd,
# and n_iter - 1 pap_step_fwd.
FORWARD_LAUNCHES = Budget(1, 2)
# n_iter + 2: n_iter - 1 pap_step_bwd, pap_first_bwd, mu_grad_scan (which also sums the per-row tau gradients)
# and row_l1_bwd.
BACKWARD_LAUNCHES = Budget(1, 2)
# Other device work in the forward: none (no tau product, no .contiguous() copy, no cast).
FORWARD_OTHER_OPS = Budget(0, 0)
# In the backward, 4 n_iter - 2 adds, all autograd accumulating the gradient of a tensor used more than once:
# K (used by mu, pap_first and n_iter - 1 steps: n_iter adds), tau (n_iter uses: n_iter - 1 adds), Kt as both
# q and k of each SDPA call (n_iter adds) and V (n_iter SDPA calls: n_iter - 1 adds). No sum for the tau
# gradients, no zeros for outputs without a gradient, no copy of SDPA's non-contiguous gradients.
BACKWARD_OTHER_OPS = Budget(4, -2)
FREE_OPS = {"aten.empty.memory_format", "aten.empty_strided.default", "aten.new_empty.default"}
"""Allocations: no device kernel (views are told by their schema)."""


class _StubKernel:
    def __init__(self, name, launches):
        self.name, self.launches = name, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(self.name)

        return launch


@pytest.fixture
def launches(monkeypatch):
    """Names of the kernels launched during the test, in order; nothing runs, CPU tensors go to "triton"."""
    recorded = []
    for name in kernels.__all__:
        monkeypatch.setattr(kernels, name, _StubKernel(name, recorded))
    monkeypatch.setattr(_backend, "TRITON_DEVICE_TYPES", (*_backend.TRITON_DEVICE_TYPES, "cpu"))
    return recorded


class DeviceOps(TorchDispatchMode):
    """Counts the ops dispatched inside the block: SDPA, kpca custom ops, and the other non-view, non-empty ops."""

    def __init__(self):
        super().__init__()
        self.sdpa, self.kpca, self.other = 0, collections.Counter(), collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if "scaled_dot_product" in name:
            self.sdpa += 1
        elif name.startswith("kpca."):
            self.kpca[name] += 1
        elif not func.is_view and name not in FREE_OPS:
            self.other[name] += 1
        return func(*args, **(kwargs or {}))


def _count(launches, n_iter, layout="contiguous", **kwargs):
    """(forward, backward) of one call: each (launches, DeviceOps)."""
    b, h, n, d = 2, 3, 5, 8
    if layout == "contiguous":
        k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(2))
    else:  # the modules' heads of a (B, N, H, D) projection
        k, v = (torch.randn(b, n, h, d).transpose(1, 2).requires_grad_() for _ in range(2))
    counts = []
    with DeviceOps() as forward_ops:
        out = rpc_attention(k, v, n_iter=n_iter, lambd=0.3, backend="triton", **kwargs)
    counts.append((list(launches), forward_ops))
    grad = torch.randn_like(out)
    launches.clear()
    with DeviceOps() as backward_ops:
        torch.autograd.grad(out, (k, v), grad)
    counts.append((list(launches), backward_ops))
    return counts


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "custom_ops"])
@pytest.mark.parametrize("n_iter", [1, 2, 3])
@pytest.mark.parametrize(
    "case",
    [
        {},
        {"is_causal": True},
        {"convention": "pcp"},
        {"layout": "module"},
    ],
    ids=["plain", "causal", "pcp", "module_layout"],
)
def test_launches_and_device_ops_per_call_fit_the_budget(launches, monkeypatch, n_iter, case, traced):
    if traced:  # as under torch.compile: the custom ops, each a black box here (its launches are counted)
        monkeypatch.setattr(ops, "_eager", lambda *tensors: False)
    (fwd_launches, fwd_ops), (bwd_launches, bwd_ops) = _count(launches, n_iter, **case)
    assert fwd_launches == ["row_l1", "mu_scan", "pap_first_fwd"] + ["pap_step_fwd"] * (n_iter - 1)
    assert len(fwd_launches) == FORWARD_LAUNCHES.at(n_iter)
    assert sorted(bwd_launches) == sorted(
        ["pap_first_bwd", "mu_grad_scan", "row_l1_bwd"] + ["pap_step_bwd"] * (n_iter - 1)
    )
    assert len(bwd_launches) == BACKWARD_LAUNCHES.at(n_iter)
    assert fwd_ops.sdpa == bwd_ops.sdpa == n_iter
    assert sum(fwd_ops.other.values()) == FORWARD_OTHER_OPS.at(n_iter), fwd_ops.other
    assert set(bwd_ops.other) <= {"aten.add.Tensor"}, bwd_ops.other
    assert sum(bwd_ops.other.values()) == BACKWARD_OTHER_OPS.at(n_iter), bwd_ops.other
    expected_kpca = {"kpca.pap_mu.default": 1, "kpca.pap_first.default": 1, "kpca.pap_step.default": n_iter - 1}
    expected_kpca_backward = {f"{op.removesuffix('.default')}_backward.default": c for op, c in expected_kpca.items()}
    if traced:
        assert +fwd_ops.kpca == +collections.Counter(expected_kpca)
        assert +bwd_ops.kpca == +collections.Counter(expected_kpca_backward)
    else:
        assert not fwd_ops.kpca and not bwd_ops.kpca


def test_key_padding_adds_no_launch_and_no_copy(launches):
    """The bool padding mask goes to the kernels as it is (no int8 copy); the SDPA mask built from it is not ours."""
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[0, -2:] = True
    (fwd_launches, fwd_ops), (bwd_launches, bwd_ops) = _count(launches, 2, key_padding_mask=padding)
    assert (len(fwd_launches), len(bwd_launches)) == (FORWARD_LAUNCHES.at(2), BACKWARD_LAUNCHES.at(2))
    copies = {"aten._to_copy.default", "aten.clone.default", "aten.copy_.default"}
    assert not copies & (set(fwd_ops.other) | set(bwd_ops.other)), (fwd_ops.other, bwd_ops.other)
    assert set(bwd_ops.other) <= {"aten.add.Tensor"}, bwd_ops.other


def test_return_state_adds_only_the_state_mu(launches):
    """return_state computes the state's mu with two launches of its own, without gradient; nothing else changes."""
    k, v = torch.randn(2, 3, 5, 8, requires_grad=True), torch.randn(2, 3, 5, 8)
    rpc_attention(k, v, n_iter=2, lambd=0.3, backend="triton", return_state=True)
    assert launches[:4] == ["row_l1", "mu_scan", "row_l1", "mu_scan"]
    assert len(launches) == FORWARD_LAUNCHES.at(2) + 2
