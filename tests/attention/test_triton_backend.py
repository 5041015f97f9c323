"""The Triton kernels against the torch path and the float64 reference, forward and backward.

CPU cases run the kernels in Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py on
machines without CUDA) at tiny shapes; ``gpu`` cases run compiled kernels on CUDA, the last ones
at real shapes with the flash-attention rule (error against a float64 reference at most twice
the same-dtype torch path's).
"""

import pytest
import torch

from kpca.attention import RPCAttention, pap_mu, rpc_attention
from kpca.attention._pap import PapFirst, PapStep
from kpca.attention.reference import rpc_attention_reference

from .helpers import TRITON_DEVICES as DEVICES
from .helpers import require_triton

require_triton()
from kpca.attention._triton import ops  # noqa: E402 (after the triton check)

pytestmark = pytest.mark.triton

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-identical, except bfloat16 in the interpreter, whose float32 -> bf16 cast truncates (1 ulp)."""
    if actual.dtype == torch.bfloat16 and actual.device.type == "cpu":
        torch.testing.assert_close(actual, expected)
    else:
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)


def _tau(b, h, n, causal, device):
    return (0.3 + torch.rand(b, h, n if causal else 1, 1, device=device)).requires_grad_()


def _padding(b, n, device):
    padding = torch.zeros(b, n, dtype=torch.bool, device=device)
    padding[0, n - 2 :] = True  # right padding
    padding[-1, :2] = True  # left padding: causal rows with no valid key at all
    return padding


def _random_padding(k):
    """A random (B, N) bool padding mask for keys (B, H, N, D), about 30 % padded."""
    return torch.rand(k.shape[0], k.shape[2], device=k.device) > 0.7


def _grads(outputs, inputs, used):
    """Gradients of a weighted sum of the ``used`` outputs (the others get no gradient at all)."""
    gen = torch.Generator().manual_seed(1)
    pairs = zip(outputs, used, strict=True)
    loss = sum((o.float() * torch.randn(o.shape, generator=gen).to(o.device)).sum() for o, u in pairs if u)
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal_tau", [False, True])
@pytest.mark.parametrize("used", [(True, True), (False, True)], ids=["s_kt", "kt"])
def test_pap_first_matches_torch(device, dtype, causal_tau, used):
    k = torch.randn(2, 3, 5, 4, device=device).to(dtype).requires_grad_()
    tau = _tau(2, 3, 5, causal_tau, device)
    out, out_pt = ops.pap_first(k, tau), PapFirst.apply(k, tau)
    for a, e in zip(out, out_pt, strict=True):
        _assert_same(a, e)
    (grad_k, grad_tau), (grad_k_pt, grad_tau_pt) = _grads(out, (k, tau), used), _grads(out_pt, (k, tau), used)
    _assert_same(grad_k, grad_k_pt)
    torch.testing.assert_close(grad_tau, grad_tau_pt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_z", [False, True])
@pytest.mark.parametrize("causal_tau", [False, True])
@pytest.mark.parametrize("used", [(True, True, True), (False, False, True)], ids=["all", "kt"])
def test_pap_step_matches_torch(device, dtype, has_z, causal_tau, used):
    b, h, n, d = 2, 3, 5, 4
    k = torch.randn(b, n, h, d, device=device).to(dtype).transpose(1, 2).requires_grad_()  # strided (B, H, N, D)
    l = torch.randn(b, h, d, n, device=device).to(dtype).transpose(2, 3).requires_grad_()  # noqa: E741
    s = torch.randn(b, h, n, d, device=device).requires_grad_()
    z = torch.randn(b, h, n, d, device=device).requires_grad_() if has_z else None
    tau = _tau(b, h, n, causal_tau, device)
    inputs = (k, tau, l, s) + ((z,) if has_z else ())
    out, out_pt = ops.pap_step(k, tau, l, z, s), PapStep.apply(k, tau, l, z, s)
    for a, e in zip(out, out_pt, strict=True):
        _assert_same(a, e)
    grads, grads_pt = _grads(out, inputs, used), _grads(out_pt, inputs, used)
    for i, (g, g_pt) in enumerate(zip(grads, grads_pt, strict=True)):
        if i == 1:  # tau: per-row sums, then a sum over rows, in another order than torch's
            torch.testing.assert_close(g, g_pt)
        else:
            _assert_same(g, g_pt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_pap_mu_matches_torch(device, dtype, is_causal, padded):
    b, h, n, d = 3, 2, 9, 3
    k = torch.randn(b, n, h, d, device=device).to(dtype).transpose(1, 2).requires_grad_()
    k.data[1, 0, 4] = 0.0  # a zero row: sign(0) = 0 in the gradient
    padding = _padding(b, n, device) if padded else None
    mu = ops.pap_mu(k, 12, key_padding_mask=padding, is_causal=is_causal)
    mu_pt = pap_mu(k, 12, key_padding_mask=padding, is_causal=is_causal)
    assert mu.dtype == mu_pt.dtype == torch.float32 and mu.shape == mu_pt.shape
    torch.testing.assert_close(mu, mu_pt)
    weights = torch.randn(mu.shape, device=device)
    (grad,), (grad_pt,) = torch.autograd.grad((mu * weights).sum(), k), torch.autograd.grad((mu_pt * weights).sum(), k)
    torch.testing.assert_close(grad, grad_pt)


@pytest.mark.parametrize("device", DEVICES)
def test_pap_mu_scans_across_blocks(device):
    """N larger than one scan block (128): the carried prefix sums in both directions."""
    k = torch.randn(1, 2, 300, 2, device=device, requires_grad=True)
    for is_causal in (False, True):
        mu, mu_pt = (f(k, 4, is_causal=is_causal) for f in (ops.pap_mu, pap_mu))
        torch.testing.assert_close(mu, mu_pt)
        weights = torch.randn(mu.shape, device=device)
        torch.testing.assert_close(*(torch.autograd.grad((m * weights).sum(), k)[0] for m in (mu, mu_pt)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("convention", ["reference", "pcp"])
def test_pap_tau_matches_torch(device, is_causal, padded, convention):
    """tau = lambd * mu (reference) or lambd / mu (pcp) out of the mu kernel, one per row, and its gradient to K."""
    b, h, n, d, lambd = 3, 2, 9, 3, 0.7
    k = torch.randn(b, n, h, d, device=device).transpose(1, 2).requires_grad_()
    padding = _padding(b, n, device) if padded else None
    pcp = convention == "pcp"
    tau = ops.pap_tau(k, 12, lambd, pcp=pcp, key_padding_mask=padding, is_causal=is_causal)
    mu_pt = pap_mu(k, 12, key_padding_mask=padding, is_causal=is_causal)
    tau_pt = (lambd / mu_pt if pcp else lambd * mu_pt).expand(b, h, n, 1)  # (B, H, N, 1)
    assert tau.dtype == torch.float32 and tau.shape == (b, h, n, 1)
    torch.testing.assert_close(tau, tau_pt)
    weights = torch.randn(tau.shape, device=device)
    (grad,), (grad_pt,) = (torch.autograd.grad((t * weights).sum(), k) for t in (tau, tau_pt))
    torch.testing.assert_close(grad, grad_pt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("convention", ["reference", "pcp"])
def test_pap_tau_per_row_gradients_sum_across_blocks(device, convention):
    """N = 300, more than one scan block: the mu backward sums the per-row tau gradients over every block."""
    k = torch.randn(1, 2, 300, 2, device=device, requires_grad=True)
    pcp = convention == "pcp"
    tau = ops.pap_tau(k, 4, 2.0, pcp=pcp)
    mu_pt = pap_mu(k, 4)
    tau_pt = (2.0 / mu_pt if pcp else 2.0 * mu_pt).expand_as(tau)
    torch.testing.assert_close(tau, tau_pt)
    weights = torch.randn(tau.shape, device=device)
    torch.testing.assert_close(*(torch.autograd.grad((t * weights).sum(), k)[0] for t in (tau, tau_pt)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_reads_strided_kt_gradients(device, dtype):
    """SDPA's gradients are (B, N, H, D) in memory: the backward kernels read them with their strides, no copy."""
    b, h, n, d = 2, 3, 5, 4
    k = torch.randn(b, h, n, d, device=device).to(dtype).requires_grad_()
    l = torch.randn(b, h, n, d, device=device).to(dtype).requires_grad_()  # noqa: E741
    s = torch.randn(b, h, n, d, device=device).requires_grad_()
    tau = _tau(b, h, n, True, device)
    grad_kt = torch.randn(b, n, h, d, device=device).to(dtype).transpose(1, 2)  # (B, H, N, D), not contiguous
    for fn, fn_pt, inputs in (
        (ops.pap_first, PapFirst.apply, (k, tau)),
        (ops.pap_step, PapStep.apply, (k, tau, l, None, s)),
    ):
        differentiable = tuple(t for t in inputs if t is not None)
        kt, kt_pt = fn(*inputs)[-1], fn_pt(*inputs)[-1]
        grads = torch.autograd.grad(kt, differentiable, grad_kt)
        grads_pt = torch.autograd.grad(kt_pt, differentiable, grad_kt)
        for i, (g, g_pt) in enumerate(zip(grads, grads_pt, strict=True)):
            if i == 1:  # tau: per-row sums, in another order than torch's
                torch.testing.assert_close(g, g_pt)
            else:
                _assert_same(g, g_pt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("convention", ["reference", "pcp"])
def test_eager_path_matches_the_custom_ops_bitwise(device, is_causal, convention, monkeypatch):
    """Eager calls take autograd Functions, traced ones the custom ops: the same launches, the same bits."""
    k = torch.randn(2, 5, 3, 4, device=device).transpose(1, 2).requires_grad_()
    v = torch.randn(2, 3, 5, 4, device=device, requires_grad=True)
    padding = _padding(2, 5, device)
    weights = torch.randn(2, 3, 5, 4, device=device)

    def run():
        out = rpc_attention(k, v, n_iter=3, lambd=0.3, is_causal=is_causal, key_padding_mask=padding,
                            convention=convention, backend="triton")  # fmt: skip
        assert out.grad_fn is not None
        return [out, *torch.autograd.grad((out * weights).sum(), (k, v))]

    eager = run()
    monkeypatch.setattr(ops, "_eager", lambda *tensors: False)
    traced = run()
    for a, e in zip(traced, eager, strict=True):
        assert torch.equal(a, e)


def test_eager_dispatch_takes_plain_tensors_only():
    """Fake tensors (torch.compile, export, opcheck) and torch.func transforms go through the custom ops."""
    k = torch.randn(1, 1, 2, 2)
    assert ops._eager(k, None) and ops._eager(torch.nn.Parameter(k))
    with torch._subclasses.fake_tensor.FakeTensorMode() as fake_mode:
        assert not ops._eager(fake_mode.from_tensor(k))
    seen = []
    torch.func.vmap(lambda t: seen.append(ops._eager(t)) or t)(k)
    assert seen == [False]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("convention", ["reference", "pcp"])
def test_rpc_attention_matches_torch_and_reference(device, is_causal, padded, convention):
    b, h, n, d = 3, 2, 7, 4
    k = torch.randn(b, h, n, d, device=device, dtype=torch.float64)
    v = torch.randn(b, h, n, d, device=device, dtype=torch.float64)
    padding = _padding(b, n, device) if padded else None
    valid = 1.0 if padding is None else (~padding)[:, None, :, None]  # (B, 1, N, 1): padded rows are unspecified
    kwargs = {"n_iter": 3, "lambd": 0.3, "is_causal": is_causal, "key_padding_mask": padding, "convention": convention}

    def run(fn, dtype, **extra):
        kk, vv = (t.to(dtype).requires_grad_() for t in (k, v))
        out = fn(kk, vv, **kwargs, **extra) * valid
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=dtype).to(device)
        grads = torch.autograd.grad((out * weights).sum(), (kk, vv))
        return [out.double(), *(g.double() for g in grads)]

    triton_out = run(rpc_attention, torch.float32, backend="triton")
    torch_out = run(rpc_attention, torch.float32, backend="torch")
    reference = run(rpc_attention_reference, torch.float64)
    for t, p, r in zip(triton_out, torch_out, reference, strict=True):
        torch.testing.assert_close(t, p, rtol=1e-5, atol=1e-5)
        assert (t - r).abs().max() <= 2 * (p - r).abs().max() + 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rpc_attention_low_precision_flash_rule(device, dtype):
    """Half-precision inputs: error against float64 at most twice the torch path's in the same dtype."""
    k, v = torch.randn(2, 2, 8, 4, device=device, dtype=torch.float64), torch.randn(2, 2, 8, 4, device=device)
    ref = rpc_attention_reference(k, v.double(), n_iter=3, lambd=0.3)
    out = rpc_attention(k.to(dtype), v.to(dtype), n_iter=3, lambd=0.3, backend="triton").double()
    out_pt = rpc_attention(k.to(dtype), v.to(dtype), n_iter=3, lambd=0.3, backend="torch").double()
    assert (out - ref).abs().max() <= 2 * (out_pt - ref).abs().max()


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_matches_torch(device):
    """Under bf16 autocast, K stays float32 while SDPA returns L in bf16: the kernels take mixed K and L."""
    k = torch.randn(2, 2, 6, 4, device=device, requires_grad=True)
    v = torch.randn(2, 2, 6, 4, device=device, requires_grad=True)
    results = []
    for backend in ("triton", "torch"):
        with torch.autocast(device, dtype=torch.bfloat16):
            out = rpc_attention(k, v, n_iter=3, lambd=0.3, backend=backend)
        results.append([out, *torch.autograd.grad(out.float().square().sum(), (k, v))])
    for a, e in zip(*results, strict=True):  # bf16 precision: L and its gradient are bf16
        assert a.dtype == e.dtype
        torch.testing.assert_close(a.float(), e.float(), rtol=1.6e-2, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_state_and_module_match_torch(device):
    k, v = torch.randn(2, 2, 6, 4, device=device), torch.randn(2, 2, 6, 4, device=device)
    _, state = rpc_attention(k, v, n_iter=3, lambd=0.3, return_state=True, backend="triton")
    _, state_pt = rpc_attention(k, v, n_iter=3, lambd=0.3, return_state=True, backend="torch")
    for name in ("s", "l", "y", "k_clean", "mu", "residual", "nonzero_fraction"):
        torch.testing.assert_close(getattr(state, name), getattr(state_pt, name), rtol=1e-5, atol=1e-5)
    module = RPCAttention(8, 2, n_iter=2, backend="triton", device=device).eval()
    x = torch.randn(2, 5, 8, device=device)
    expected = module(x)
    module.backend = "torch"
    torch.testing.assert_close(expected, module(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [40, 72])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_dims_off_multiples_of_16_match_torch(device, d, dtype):
    """D = 40 and 72 (a tile of 64 or 128 columns, a row alignment of 8), module layout, forward and backward."""
    b, h, n = 2, 3, 5
    k = torch.randn(b, n, h, d, device=device).to(dtype).transpose(1, 2).requires_grad_()  # heads of (B, N, H, D)
    l = torch.randn(b, n, h, d, device=device).to(dtype).transpose(1, 2).requires_grad_()  # noqa: E741
    s, z = (torch.randn(b, h, n, d, device=device).requires_grad_() for _ in range(2))
    tau, tau_rows = _tau(b, h, n, False, device), _tau(b, h, n, True, device)
    for fn, fn_pt, inputs in (
        (ops.pap_first, PapFirst.apply, (k, tau)),
        (ops.pap_step, PapStep.apply, (k, tau_rows, l, z, s)),
    ):
        out, out_pt = fn(*inputs), fn_pt(*inputs)
        for a, e in zip(out, out_pt, strict=True):
            _assert_same(a, e)
        used = (True,) * len(out)
        for i, (g, g_pt) in enumerate(zip(_grads(out, inputs, used), _grads(out_pt, inputs, used), strict=True)):
            if i == 1:  # tau: sums in another order than torch's
                torch.testing.assert_close(g, g_pt)
            else:
                _assert_same(g, g_pt)
    padding = _padding(b, n, device)
    mu = ops.pap_mu(k, h * d, key_padding_mask=padding, is_causal=True)
    mu_pt = pap_mu(k, h * d, key_padding_mask=padding, is_causal=True)
    torch.testing.assert_close(mu, mu_pt)
    weights = torch.randn(mu.shape, device=device)
    (grad,), (grad_pt,) = torch.autograd.grad((mu * weights).sum(), k), torch.autograd.grad((mu_pt * weights).sum(), k)
    torch.testing.assert_close(grad, grad_pt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [40, 72])
def test_rpc_attention_head_dims_off_multiples_of_16_match_torch(device, d):
    k = torch.randn(2, 5, 3, d, device=device).transpose(1, 2).requires_grad_()
    v = torch.randn(2, 5, 3, d, device=device).transpose(1, 2).requires_grad_()
    results = []
    for backend in ("triton", "torch"):
        out = rpc_attention(k, v, n_iter=3, lambd=0.3, is_causal=True, backend=backend)
        results.append([out, *torch.autograd.grad((out * torch.linspace(-1, 1, d, device=device)).sum(), (k, v))])
    for a, e in zip(*results, strict=True):  # mu in another summation order, scaled up by D
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
# the interpreter computes in numpy, which warns on inf - inf and on NaN comparisons
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_nan_and_inf_match_torch(device):
    """A NaN key or threshold gives NaN where torch's clamp does (Triton's min / max would drop it); so does mu."""
    b, h, n, d = 2, 3, 5, 4
    k, l = torch.randn(b, h, n, d, device=device), torch.randn(b, h, n, d, device=device)  # noqa: E741
    k[0, 0, 1, 2], k[0, 1, 3, 0], k[1, 2, 0, 3], l[1, 0, 2, 1] = float("nan"), float("inf"), -float("inf"), float("nan")
    s = torch.randn(b, h, n, d, device=device)
    for causal in (False, True):
        tau = _tau(b, h, n, causal, device).detach()
        tau[1, 1, -1] = float("nan")  # as from a NaN mu
        for out, out_pt in (
            (ops.pap_first(k, tau), PapFirst.apply(k, tau)),
            (ops.pap_step(k, tau, l, None, s), PapStep.apply(k, tau, l, None, s)),
        ):
            for a, e in zip(out, out_pt, strict=True):
                torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)
        mu, mu_pt = ops.pap_mu(k, 12, is_causal=causal), pap_mu(k, 12, is_causal=causal)
        assert mu.isnan().any()
        torch.testing.assert_close(mu, mu_pt, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("op", "make_args"),
    [
        (ops.pap_first_op, lambda k, tau: (k, tau)),
        (ops.pap_step_op, lambda k, tau: (k, tau, torch.randn_like(k), torch.randn_like(k), torch.randn_like(k))),
        (ops.pap_step_op, lambda k, tau: (k, tau, torch.randn_like(k), None, torch.randn_like(k))),
        (ops.pap_mu_op, lambda k, tau: (k, _random_padding(k), 8, True, 1e-12)),
        (ops.pap_mu_op, lambda k, tau: (k, None, 8, False, 1e-12)),
        (ops.pap_mu_op, lambda k, tau: (k, None, 8, False, 1e-12, 0.5, False, True)),  # tau per row
        (ops.pap_mu_op, lambda k, tau: (k, _random_padding(k), 8, True, 1e-12, 0.5, True, True)),
    ],
    ids=["pap_first", "pap_step", "pap_step_no_z", "pap_mu_causal_padded", "pap_mu", "pap_tau", "pap_tau_pcp_causal"],
)
# torch's fake-tensor conversion reads .grad of the non-leaf clones opcheck makes, hiding the warning with
# its own filter, which pytest's "error" filter overrides.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_custom_op_registration(op, make_args, device):
    """Schema, fake (meta) implementation and autograd registration, checked by torch.library.opcheck."""
    k = torch.randn(2, 2, 5, 4, device=device, requires_grad=True)
    tau = (0.3 + torch.rand(2, 2, 1, 1, device=device)).requires_grad_()
    torch.library.opcheck(op, make_args(k, tau))


# --- real shapes on CUDA ----------------------------------------------------------------------


def _flash_rule_check(name, value, value_pt, reference, reduce):
    err, err_pt = (reduce((t.double() - reference).abs()) for t in (value, value_pt))
    assert err <= 2 * err_pt + 1e-6 * reference.abs().max(), (name, err.item(), err_pt.item())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_rpc_attention_real_shapes_flash_rule(dtype, is_causal):
    """B * H = 64, N = 1024, D = 64 against the torch path in float64: output, grad V (max error), grad K.

    grad K jumps where an entry crosses the threshold (the shrink's derivative is a step), and mu is
    summed in another order than torch's, so one entry can move by O(1) between paths: grad K uses
    the mean error. lambd = 0.2 puts tau near 1, so a good share of the entries is shrunk.
    """
    b, h, n, d = 4, 16, 1024, 64
    k = torch.randn(b, h, n, d, device="cuda", dtype=torch.float64)
    v = torch.randn(b, h, n, d, device="cuda", dtype=torch.float64)
    weights = torch.randn(b, h, n, d, device="cuda", dtype=torch.float64)

    def run(backend, run_dtype):
        kk, vv = (t.to(run_dtype).requires_grad_() for t in (k, v))
        out = rpc_attention(kk, vv, n_iter=4, lambd=0.2, is_causal=is_causal, backend=backend)
        grad_k, grad_v = torch.autograd.grad((out.double() * weights).sum(), (kk, vv))
        return out, grad_v, grad_k

    out, grad_v, grad_k = run("triton", dtype)
    out_pt, grad_v_pt, grad_k_pt = run("torch", dtype)
    out_ref, grad_v_ref, grad_k_ref = run("torch", torch.float64)
    _flash_rule_check("out", out, out_pt, out_ref, torch.max)
    _flash_rule_check("grad_v", grad_v, grad_v_pt, grad_v_ref, torch.max)
    _flash_rule_check("grad_k", grad_k, grad_k_pt, grad_k_ref, torch.mean)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 72, 40])
def test_kernels_real_shapes_match_torch(dtype, d):
    """The element-wise kernels on strided (B, H, N, D) views, as the modules pass them: bit-identical.

    D = 72 and 40 take the vector loads of a row alignment of 8 (the hint ``ops._row_alignment`` passes).
    """
    b, h, n = 8, 8, 1024
    k = torch.randn(b, n, h, d, device="cuda").to(dtype).transpose(1, 2).requires_grad_()
    l = torch.randn(b, n, h, d, device="cuda").to(dtype).transpose(1, 2).requires_grad_()  # noqa: E741
    s, z = torch.randn(b, h, n, d, device="cuda"), torch.randn(b, h, n, d, device="cuda")
    tau = _tau(b, h, n, False, "cuda")
    for out, out_pt, inputs in (
        (ops.pap_first(k, tau), PapFirst.apply(k, tau), (k, tau)),
        (ops.pap_step(k, tau, l, z, s), PapStep.apply(k, tau, l, z, s), (k, tau, l)),
    ):
        for a, e in zip(out, out_pt, strict=True):
            _assert_same(a, e)
        used = (True,) * len(out)
        for i, (g, g_pt) in enumerate(zip(_grads(out, inputs, used), _grads(out_pt, inputs, used), strict=True)):
            if i == 1:  # tau: sums over N * D = 65536 entries, in another order than torch's
                torch.testing.assert_close(g, g_pt, rtol=1e-4, atol=1e-3)
            else:
                _assert_same(g, g_pt)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [72, 40])
def test_real_shapes_head_dims_flash_rule(d):
    """D = 72 and 40 in bfloat16, module layout, B * H = 64, N = 1024: the rule of the test above."""
    b, h, n = 4, 16, 1024
    k = torch.randn(b, n, h, d, device="cuda", dtype=torch.float64).transpose(1, 2)
    v = torch.randn(b, n, h, d, device="cuda", dtype=torch.float64).transpose(1, 2)
    weights = torch.randn(b, h, n, d, device="cuda", dtype=torch.float64)

    def run(backend, run_dtype):
        kk, vv = (t.to(run_dtype).requires_grad_() for t in (k, v))
        out = rpc_attention(kk, vv, n_iter=4, lambd=0.2, backend=backend)
        grad_k, grad_v = torch.autograd.grad((out.double() * weights).sum(), (kk, vv))
        return out, grad_v, grad_k

    out, grad_v, grad_k = run("triton", torch.bfloat16)
    out_pt, grad_v_pt, grad_k_pt = run("torch", torch.bfloat16)
    out_ref, grad_v_ref, grad_k_ref = run("torch", torch.float64)
    _flash_rule_check("out", out, out_pt, out_ref, torch.max)
    _flash_rule_check("grad_v", grad_v, grad_v_pt, grad_v_ref, torch.max)
    _flash_rule_check("grad_k", grad_k, grad_k_pt, grad_k_ref, torch.mean)


@pytest.mark.gpu
def test_kernels_are_bitwise_deterministic_real_shapes():
    """Every kpca op, forward and backward, twice on the same inputs: the same bits (the kernels use no atomics).

    GPU only: Triton's interpreter runs the programs one after another, so on CPU this could never fail.
    """
    b, h, n, d = 4, 16, 1024, 64
    k = torch.randn(b, n, h, d, device="cuda").to(torch.bfloat16).transpose(1, 2).requires_grad_()
    l = torch.randn(b, n, h, d, device="cuda").to(torch.bfloat16).transpose(1, 2).requires_grad_()  # noqa: E741
    s, z = (torch.randn(b, h, n, d, device="cuda").requires_grad_() for _ in range(2))
    tau = _tau(b, h, n, True, "cuda")
    padding = _padding(b, n, "cuda")

    def outputs_and_grads():
        outputs = [
            *ops.pap_first(k, tau),
            *ops.pap_step(k, tau, l, z, s),
            ops.pap_mu(k, h * d, key_padding_mask=padding, is_causal=True),
        ]
        return outputs + list(_grads(outputs, (k, tau, l, z, s), (True,) * len(outputs)))

    for first, second in zip(outputs_and_grads(), outputs_and_grads(), strict=True):
        assert torch.equal(first, second)


@pytest.mark.gpu
def test_backward_is_deterministic_in_deterministic_mode_real_shapes(monkeypatch):
    """End to end, SDPA included, under ``torch.use_deterministic_algorithms(True)``.

    Without it, SDPA's flash backward accumulates dQ with atomics: two runs may differ with no
    fault in our kernels (``test_kernels_are_bitwise_deterministic_real_shapes`` tests those alone).
    """
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, should SDPA pick the math path
    k = torch.randn(4, 16, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(4, 16, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def grads():
        out = rpc_attention(k, v, n_iter=4, lambd=0.2, is_causal=True, backend="triton")
        return torch.autograd.grad(out.float().square().sum(), (k, v))

    deterministic_before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for first, second in zip(grads(), grads(), strict=True):
            assert torch.equal(first, second)
    finally:
        torch.use_deterministic_algorithms(deterministic_before)
