"""Twicing, NeuTRENO and Elliptical attention against their float64 references, forward and backward.

Each fast function (fused SDPA) is held to the loop-by-loop oracle in ``kpca.attention.reference``: outputs and the
gradients of every input that takes one, causal and not, with bool and float masks and key padding; each is
strictly causal; ``torch.compile`` of each matches the float64 reference as eager does.
"""

import pytest
import torch

from kpca.attention import (
    elliptical_attention,
    elliptical_scale,
    neutreno_attention,
    softmax_attention,
    twicing_attention,
)
from kpca.attention.errors import AttentionOptionError
from kpca.attention.reference import (
    attention_map,
    elliptical_attention_reference,
    elliptical_scale_reference,
)

from .helpers import NEUTRENO_LAMBD, ROBUST_FUNCTIONS, ROBUST_REFERENCES, outputs_and_grads

SHAPE = (2, 3, 7, 4)  # (B, H, N, D)
FLOAT32_BUDGET = 1e-4
"""Largest relative error (norm-wise, per tensor) of a float32 loss or gradient against float64, as for RPC."""

FAST, REFERENCE = ROBUST_FUNCTIONS, ROBUST_REFERENCES
KINDS = list(FAST)


def make_inputs(shape=SHAPE, dtype=torch.float64, requires_grad=True) -> list[torch.Tensor]:
    """Random q, k, v and a fourth (B, H, N, D) tensor w (v_first or v_prev)."""
    return [torch.randn(shape, dtype=dtype).requires_grad_(requires_grad) for _ in range(4)]


def make_mask(kind: str | None, n: int) -> torch.Tensor | None:
    """None, a bool mask (B, 1, N, N) in which every query keeps itself, or a float additive mask (B, H, N, N)."""
    if kind == "bool":
        return (torch.rand(SHAPE[0], 1, n, n) > 0.3) | torch.eye(n, dtype=torch.bool)
    if kind == "float":
        return torch.randn(SHAPE[0], SHAPE[1], n, n, dtype=torch.float64)
    return None


PADDING = torch.tensor([[False] * 5 + [True] * 2, [True] * 2 + [False] * 5])  # right and left padding, (B, N)


def valid_rows(padding: torch.Tensor | None) -> torch.Tensor:
    """(B | 1, 1, N, 1) float64: 1 at valid rows (the fast paths leave padded rows unspecified)."""
    if padding is None:
        return torch.ones(1, 1, SHAPE[2], 1, dtype=torch.float64)
    return (~padding)[:, None, :, None].double()


def differentiable(kind: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The inputs a kind's output depends on: q, k, v, and NeuTRENO's v_first (Elliptical's v_prev gets no grad)."""
    return inputs if kind == "neutreno" else inputs[:3]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("padded", [False, True])
def test_matches_reference_forward_and_backward(kind, is_causal, mask_kind, padded):
    inputs = make_inputs()
    padding = PADDING if padded else None
    kwargs = {"attn_mask": make_mask(mask_kind, SHAPE[2]), "key_padding_mask": padding, "is_causal": is_causal}
    valid = valid_rows(padding)
    used = differentiable(kind, inputs)
    rest = inputs[len(used) :]

    out, grads = outputs_and_grads(lambda *t: FAST[kind](*t, *rest, **kwargs) * valid, *used)
    ref, grads_ref = outputs_and_grads(lambda *t: REFERENCE[kind](*t, *rest, **kwargs), *used)
    torch.testing.assert_close(out, ref)
    for name, g, g_ref in zip("qkvw", grads, grads_ref, strict=False):
        torch.testing.assert_close(g, g_ref, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_the_authors_elliptical_matches_its_reference_forward_and_backward(is_causal, padded):
    """``convention="reference"``: causal, the authors' LM (whole-segment m, no 1/sqrt(D)); else the same as ours."""
    q, k, v, v_prev = make_inputs()
    padding = PADDING if padded else None
    kwargs = {"key_padding_mask": padding, "is_causal": is_causal, "convention": "reference"}
    valid = valid_rows(padding)
    out, grads = outputs_and_grads(lambda *t: elliptical_attention(*t, v_prev, **kwargs) * valid, q, k, v)
    ref, grads_ref = outputs_and_grads(lambda *t: elliptical_attention_reference(*t, v_prev, **kwargs), q, k, v)
    torch.testing.assert_close(out, ref)
    for name, g, g_ref in zip("qkv", grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, msg=lambda m, name=name: f"d{name}: {m}")
    ours = elliptical_attention(q, k, v, v_prev, key_padding_mask=padding, is_causal=is_causal)
    assert torch.equal(ours * valid, out) is (not is_causal)  # vision: the authors' code is ours


def test_the_authors_elliptical_lm_sees_later_tokens_and_ours_does_not():
    q, k, v, v_prev = make_inputs(requires_grad=False)
    later = v.clone()
    later[:, :, -1] += 1.0  # change the last token's values only
    for convention, leaks in (("causal", False), ("reference", True)):
        before = elliptical_attention(q, k, v, v_prev, is_causal=True, convention=convention)
        after = elliptical_attention(q, k, later, v_prev, is_causal=True, convention=convention)
        assert torch.equal(before[:, :, :-1], after[:, :, :-1]) is not leaks, convention


def test_elliptical_refuses_an_unknown_convention():
    q, k, v, v_prev = make_inputs(requires_grad=False)
    with pytest.raises(ValueError, match=r"convention must be one of \('causal', 'reference'\).*got 'pcp'"):
        elliptical_attention(q, k, v, v_prev, convention="pcp")


@pytest.mark.parametrize("kind", KINDS)
def test_matches_reference_with_an_explicit_scale(kind):
    inputs = make_inputs(requires_grad=False)
    torch.testing.assert_close(FAST[kind](*inputs, scale=0.3), REFERENCE[kind](*inputs, scale=0.3))


@pytest.mark.parametrize("is_causal", [False, True])
def test_twicing_is_two_a_minus_a_squared_times_v(is_causal):
    q, k, v, _ = make_inputs(requires_grad=False)
    a = torch.stack([attention_map(q[b, h], k[b, h], 0.5, is_causal, None) for b, h in _samples_and_heads()])
    a = a.view(SHAPE[0], SHAPE[1], SHAPE[2], SHAPE[2])  # (B, H, N, N)
    expected = (2 * a - a @ a) @ v  # (B, H, N, D)
    torch.testing.assert_close(twicing_attention(q, k, v, is_causal=is_causal), expected)
    torch.testing.assert_close((2 * a - a @ a).sum(-1), torch.ones(SHAPE[:3], dtype=torch.float64))


def test_twicing_refuses_dropout():
    q, k, v, _ = make_inputs(requires_grad=False)
    with pytest.raises(AttentionOptionError, match="dropout_p=0.0"):
        twicing_attention(q, k, v, dropout_p=0.1)


@pytest.mark.parametrize("is_causal", [False, True])
def test_neutreno_with_lambda_zero_is_softmax_attention(is_causal):
    q, k, v, v_first = make_inputs()
    out = neutreno_attention(q, k, v, v_first, lambd=0.0, is_causal=is_causal)
    assert torch.equal(out, softmax_attention(q, k, v, is_causal=is_causal))


def test_neutreno_gradient_reaches_v_first():
    q, k, v, v_first = make_inputs()
    (grad,) = torch.autograd.grad(neutreno_attention(q, k, v, v_first, lambd=NEUTRENO_LAMBD).sum(), v_first)
    torch.testing.assert_close(grad, torch.full_like(v_first, NEUTRENO_LAMBD))  # d/dv_first of lambd * (v_first - v)


@pytest.mark.parametrize("lambd", [-0.1, float("nan"), True])
def test_neutreno_refuses_a_bad_lambda(lambd):
    with pytest.raises(AttentionOptionError, match="lambd"):
        neutreno_attention(*make_inputs(requires_grad=False), lambd=lambd)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_elliptical_scale_matches_the_reference_estimator(is_causal, padded):
    v, v_prev = make_inputs(requires_grad=False)[:2]
    padding = PADDING if padded else None
    m = elliptical_scale(v, v_prev, is_causal=is_causal, key_padding_mask=padding)
    assert m.shape == (*SHAPE[:2], SHAPE[2] if is_causal else 1, SHAPE[3])
    torch.testing.assert_close(m, elliptical_scale_reference(v, v_prev, is_causal=is_causal, key_padding_mask=padding))
    assert torch.all(m <= 1) and torch.all(m >= 0)
    torch.testing.assert_close(m.amax(-1), torch.ones_like(m[..., 0]))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("delta", [1.0, 5.0, 0.01])
def test_elliptical_scale_does_not_depend_on_delta(is_causal, delta):
    v, v_prev = make_inputs(requires_grad=False)[:2]
    m = elliptical_scale(v, v_prev, is_causal=is_causal)
    torch.testing.assert_close(m, elliptical_scale_reference(v, v_prev, delta=delta, is_causal=is_causal))


@pytest.mark.parametrize("is_causal", [False, True])
def test_elliptical_scale_is_ones_for_a_difference_uniform_over_dimensions(is_causal):
    v_prev = torch.randn(SHAPE, dtype=torch.float64)
    step = torch.randn(*SHAPE[:3], 1, dtype=torch.float64)  # (B, H, N, 1): the same |difference| in every d
    m = elliptical_scale(v_prev + step, v_prev, is_causal=is_causal)
    torch.testing.assert_close(m, torch.ones_like(m))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_elliptical_scale_is_ones_for_no_difference(is_causal, dtype):
    v = torch.randn(SHAPE, dtype=dtype)
    m = elliptical_scale(v, v.clone(), is_causal=is_causal)
    assert m.dtype == dtype and torch.equal(m, torch.ones_like(m))
    q, k = torch.randn(SHAPE, dtype=dtype), torch.randn(SHAPE, dtype=dtype)
    out = elliptical_attention(q, k, v, v, is_causal=is_causal)
    assert torch.equal(out, softmax_attention(q, k, v, is_causal=is_causal))


def test_elliptical_scale_has_no_gradient():
    q, k, v, v_prev = make_inputs()
    m = elliptical_scale(v, v_prev)
    assert not m.requires_grad and m.grad_fn is None
    out = elliptical_attention(q, k, v, v_prev)
    grads = torch.autograd.grad(out.sum(), (q, k, v, v_prev), allow_unused=True)
    assert grads[3] is None  # v_prev only enters through m
    (grad_v,) = torch.autograd.grad(softmax_attention(q * m, k, v).sum(), v)
    torch.testing.assert_close(grads[2], grad_v)  # v's gradient is the value path's alone


@pytest.mark.parametrize("padded", [False, True])
def test_causal_elliptical_scale_at_t_sees_tokens_up_to_t(padded):
    v, v_prev = make_inputs(requires_grad=False)[:2]
    padding = PADDING if padded else None
    m = elliptical_scale(v, v_prev, is_causal=True, key_padding_mask=padding)
    for j in range(SHAPE[2]):
        perturbed = v.clone()
        perturbed[:, :, j] += 3.0 * torch.randn(SHAPE[0], SHAPE[1], SHAPE[3], dtype=torch.float64)
        m_perturbed = elliptical_scale(perturbed, v_prev, is_causal=True, key_padding_mask=padding)
        assert torch.equal(m_perturbed[:, :, :j], m[:, :, :j]), f"token {j} changed earlier positions"
        assert not torch.equal(m_perturbed[:, :, j:], m[:, :, j:]) or padded


@pytest.mark.parametrize("kind", KINDS)
def test_strictly_causal(kind):
    inputs = make_inputs(requires_grad=False)
    out = FAST[kind](*inputs, is_causal=True)
    for j in range(SHAPE[2]):
        perturbed = [t.clone() for t in inputs]
        for t in perturbed:
            t[:, :, j] += 3.0 * torch.randn(SHAPE[0], SHAPE[1], SHAPE[3], dtype=torch.float64)
        out_perturbed = FAST[kind](*perturbed, is_causal=True)
        assert torch.equal(out_perturbed[:, :, :j], out[:, :, :j]), f"{kind}: token {j} leaked into earlier outputs"
        assert not torch.equal(out_perturbed[:, :, j], out[:, :, j])


@pytest.mark.parametrize("kind", KINDS)
def test_shape_mismatch_names_the_tensor(kind):
    q, k, v, w = make_inputs(requires_grad=False)
    with pytest.raises(ValueError, match="shape") as raised:
        FAST[kind](q, k, v[:, :, :-1], w)
    assert not isinstance(raised.value, AttentionOptionError)  # a shape is the calling code's bug, not an option


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_compiled_matches_float64(kind, is_causal):
    """Eager and ``torch.compile`` (aot_eager: the traced forward and backward graphs) in float32 against float64.

    Under a second for all six: not ``slow``. Inductor is left to the RPC compile tests (the kinds add no op of
    their own beyond SDPA and element-wise arithmetic).
    """
    torch._dynamo.reset()
    inputs = make_inputs(dtype=torch.float32, requires_grad=False)
    weights = torch.randn(SHAPE)

    def attention(*t):
        return FAST[kind](*t, is_causal=is_causal)

    reference = _loss_and_grads(lambda *t: REFERENCE[kind](*t, is_causal=is_causal), kind, inputs, weights, True)
    eager = _loss_and_grads(attention, kind, inputs, weights)
    compiled = _loss_and_grads(torch.compile(attention, backend="aot_eager", fullgraph=True), kind, inputs, weights)
    for run, values in (("eager", eager), ("compiled", compiled)):
        for name, value, ref in zip(("loss", "dq", "dk", "dv", "dw"), values, reference, strict=False):
            error = float((value - ref).norm() / ref.norm())
            assert error <= FLOAT32_BUDGET, f"{run} {kind} {name}: relative error {error:.2e} against float64"


def _loss_and_grads(fn, kind, inputs, weights, float64=False) -> list[torch.Tensor]:
    """``(fn(*inputs) * weights).sum()`` and its gradients w.r.t. the inputs it differentiates, in float64."""
    inputs = [t.detach().double() if float64 else t.detach() for t in inputs]
    used = [t.requires_grad_(True) for t in differentiable(kind, inputs)]
    value = (fn(*inputs) * weights.to(inputs[0].dtype)).sum()
    return [t.detach().double() for t in (value, *torch.autograd.grad(value, used))]


def _samples_and_heads():
    return [(b, h) for b in range(SHAPE[0]) for h in range(SHAPE[1])]
