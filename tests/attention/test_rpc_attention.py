"""The fast RPC-Attention path against the float64 reference, forward and backward."""

import itertools

import pytest
import torch

from kpca.attention import pap_mu, rpc_attention
from kpca.attention.reference import rpc_attention_reference, softmax_attention_reference

from .helpers import make_kv, outputs_and_grads


def _valid_rows(key_padding_mask, like):
    if key_padding_mask is None:
        return torch.ones_like(like)
    return (~key_padding_mask)[:, None, :, None].to(like.dtype).expand_as(like)


def _compare(kwargs, b=2, h=3, n=7, d=4, key_padding_mask=None, attn_mask=None):
    k, v = make_kv(b, h, n, d)
    extra = {"key_padding_mask": key_padding_mask, "attn_mask": attn_mask}

    def fast(k, v):
        out = rpc_attention(k, v, **kwargs, **extra)
        return out * _valid_rows(key_padding_mask, out)

    def slow(k, v):
        return rpc_attention_reference(k, v, **kwargs, **extra)

    out, grads = outputs_and_grads(fast, k, v)
    out_ref, grads_ref = outputs_and_grads(slow, k, v)
    torch.testing.assert_close(out, out_ref)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize(
    ("n_iter", "lambd", "is_causal", "convention"),
    list(itertools.product([1, 2, 3, 4, 5, 6], [0.05, 0.5, 4.0], [False, True], ["reference", "pcp"])),
)
def test_matches_reference(n_iter, lambd, is_causal, convention):
    _compare({"n_iter": n_iter, "lambd": lambd, "is_causal": is_causal, "convention": convention})


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_matches_reference_across_heads_and_embed_dim(heads):
    _compare({"n_iter": 3, "lambd": 0.2}, h=heads, d=3)
    _compare({"n_iter": 3, "lambd": 0.2, "embed_dim": 5}, h=heads, d=3)


@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_reference_with_key_padding(is_causal):
    padding = torch.zeros(3, 9, dtype=torch.bool)
    padding[0, 6:] = True  # right padding
    padding[1, :2] = True  # left padding (a causal padded row has no valid key at all)
    _compare({"n_iter": 3, "lambd": 0.3, "is_causal": is_causal}, b=3, n=9, key_padding_mask=padding)


@pytest.mark.parametrize("convention", ["reference", "pcp"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_reference_with_an_explicit_scale(convention, is_causal):
    _compare({"n_iter": 3, "lambd": 0.3, "is_causal": is_causal, "convention": convention, "scale": 0.3})


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_reference_with_attn_mask_and_key_padding(kind, is_causal):
    n = 9
    allowed = torch.rand(3, 1, n, n) > 0.3
    allowed |= torch.eye(n, dtype=torch.bool)  # every query keeps at least itself
    mask = allowed if kind == "bool" else torch.randn(3, 3, n, n, dtype=torch.float64)
    padding = torch.zeros(3, n, dtype=torch.bool)
    padding[0, 6:] = True  # right padding
    padding[1, :2] = True  # left padding
    _compare({"n_iter": 3, "lambd": 0.3, "is_causal": is_causal}, b=3, n=n, key_padding_mask=padding, attn_mask=mask)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_reference_with_attn_mask(kind, is_causal):
    n = 8
    allowed = torch.rand(2, 1, n, n) > 0.3
    allowed |= torch.eye(n, dtype=torch.bool)  # every query keeps at least itself
    mask = allowed if kind == "bool" else torch.randn(2, 3, n, n, dtype=torch.float64)
    _compare({"n_iter": 2, "lambd": 0.3, "is_causal": is_causal}, n=n, attn_mask=mask)


def test_gradcheck_tiny():
    k, v = make_kv(1, 2, 5, 3)
    for is_causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda k, v, causal=is_causal: rpc_attention(k, v, n_iter=3, lambd=0.3, is_causal=causal), (k, v)
        )


def test_gradcheck_with_padding():
    k, v = make_kv(2, 1, 5, 3)
    padding = torch.tensor([[False, False, False, True, True], [True, False, False, False, False]])
    assert torch.autograd.gradcheck(
        lambda k, v: rpc_attention(k, v, n_iter=2, lambd=0.3, key_padding_mask=padding) * _valid_rows(padding, v),
        (k, v),
    )


def test_one_iteration_is_symmetric_attention_on_clipped_keys():
    k, v = make_kv(requires_grad=False)
    lambd = 0.2
    tau = lambd * pap_mu(k, k.shape[1] * k.shape[3])
    clipped = torch.minimum(torch.maximum(k, -tau), tau)
    expected = softmax_attention_reference(clipped, clipped, v)
    torch.testing.assert_close(rpc_attention(k, v, n_iter=1, lambd=lambd), expected)


def test_huge_lambda_is_symmetric_softmax_attention():
    k, v = make_kv(requires_grad=False)
    expected = softmax_attention_reference(k, k, v)
    torch.testing.assert_close(rpc_attention(k, v, n_iter=1, lambd=1e12), expected)


def test_huge_lambda_second_evaluation_attends_with_the_first_output():
    # S = 0 throughout, so Z_1 = K - L_1 and the second cleaned keys are K - Z_1 = L_1.
    k, v = make_kv(requires_grad=False)
    first = softmax_attention_reference(k, k, v)
    expected = softmax_attention_reference(first, first, v)
    torch.testing.assert_close(rpc_attention(k, v, n_iter=2, lambd=1e12), expected)


@pytest.mark.parametrize("n_iter", [1, 3])
def test_causality(n_iter):
    k, v = make_kv(1, 2, 10, 4, requires_grad=False)
    out = rpc_attention(k, v, n_iter=n_iter, lambd=0.3, is_causal=True)
    for t in (0, 4, 8):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, t + 1 :] = 10 * torch.randn_like(k2[:, :, t + 1 :])
        v2[:, :, t + 1 :] = torch.randn_like(v2[:, :, t + 1 :])
        out2 = rpc_attention(k2, v2, n_iter=n_iter, lambd=0.3, is_causal=True)
        torch.testing.assert_close(out2[:, :, : t + 1], out[:, :, : t + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(out2[:, :, t + 1 :], out[:, :, t + 1 :])


def test_non_causal_mu_sees_the_whole_sequence():
    k, v = make_kv(1, 1, 6, 4, requires_grad=False)
    k2 = k.clone()
    k2[:, :, -1] *= 50
    out, out2 = (rpc_attention(x, v, n_iter=2, lambd=0.3) for x in (k, k2))
    assert not torch.allclose(out[:, :, 0], out2[:, :, 0])


@pytest.mark.parametrize("is_causal", [False, True])
def test_padding_invariance(is_causal):
    k, v = make_kv(1, 2, 6, 4, requires_grad=False)
    pad_k, pad_v = make_kv(1, 2, 3, 4, requires_grad=False, scale=20.0)
    padding = torch.tensor([[False] * 6 + [True] * 3])
    out = rpc_attention(k, v, n_iter=3, lambd=0.3, is_causal=is_causal)
    padded = rpc_attention(
        torch.cat([k, pad_k], 2), torch.cat([v, pad_v], 2), n_iter=3, lambd=0.3, is_causal=is_causal,
        key_padding_mask=padding,
    )  # fmt: skip
    torch.testing.assert_close(padded[:, :, :6], out)
    assert torch.isfinite(padded).all()


def test_zero_keys_are_finite():
    k = torch.zeros(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    for is_causal in (False, True):
        for convention in ("reference", "pcp"):
            out = rpc_attention(k, v, n_iter=3, lambd=4.0, is_causal=is_causal, convention=convention)
            gk, gv = torch.autograd.grad(out.sum(), (k, v))
            assert torch.isfinite(out).all() and torch.isfinite(gk).all() and torch.isfinite(gv).all()
    # Zero keys give uniform attention: the output of one evaluation is the mean value.
    torch.testing.assert_close(rpc_attention(k, v, n_iter=1, lambd=4.0), v.mean(2, keepdim=True).expand_as(v))
    torch.testing.assert_close(
        rpc_attention(k, v, n_iter=3, lambd=4.0), rpc_attention_reference(k, v, n_iter=3, lambd=4.0)
    )


def test_bf16_autocast_close_to_fp32_with_the_pap_state_in_fp32():
    k, v = make_kv(2, 4, 64, 16, dtype=torch.float32, requires_grad=False)
    expected = rpc_attention(k, v, n_iter=4, lambd=0.5)
    k16, v16 = k.bfloat16().requires_grad_(), v.bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state = rpc_attention(k16, v16, n_iter=4, lambd=0.5, return_state=True)
    out.float().square().sum().backward()
    assert out.dtype == torch.bfloat16
    assert torch.isfinite(out).all() and torch.isfinite(k16.grad).all() and torch.isfinite(v16.grad).all()
    # mu, the shrinkage and the dual stay in fp32 under autocast; only the SDPA evaluations run in bf16.
    assert (state.s.dtype, state.y.dtype, state.mu.dtype) == (torch.float32,) * 3
    # Measured largest difference 0.0053 (bf16 has an 8-bit mantissa; outputs are O(1)).
    torch.testing.assert_close(out.float(), expected, rtol=0, atol=1e-2)


def test_state_matches_reference_and_reports_diagnostics():
    from kpca.attention.reference import pap_single

    k, v = make_kv(1, 1, 6, 4, requires_grad=False)
    out, state = rpc_attention(k, v, n_iter=3, lambd=4.0, return_state=True)
    L, S, Y = pap_single(k[0, 0], v[0, 0], n_iter=3, lambd=4.0, width=4)  # noqa: N806
    torch.testing.assert_close(state.l[0, 0], L)
    torch.testing.assert_close(state.s[0, 0], S)
    torch.testing.assert_close(state.y[0, 0], Y)
    torch.testing.assert_close(out[0, 0], L)
    z_before_last = state.y[0, 0] / state.mu[0, 0] - (k[0, 0] - L - S)
    torch.testing.assert_close(state.k_clean[0, 0], k[0, 0] - S - z_before_last)
    assert state.residual.shape == (3, 1, 1) and state.nonzero_fraction.shape == (3, 1, 1)
    torch.testing.assert_close(state.residual[-1, 0, 0], (k[0, 0] - L - S).norm())
    torch.testing.assert_close(state.nonzero_fraction[-1, 0, 0], (S != 0).double().mean())
    assert 0 < state.nonzero_fraction[0, 0, 0] < 1


def test_dropout_applies_to_the_last_evaluation_only():
    k, v = make_kv(1, 2, 16, 4, requires_grad=False)
    out, state = rpc_attention(k, v, n_iter=2, lambd=0.3, return_state=True)
    dropped, dropped_state = rpc_attention(k, v, n_iter=2, lambd=0.3, dropout_p=0.5, return_state=True)
    # S of the last evaluation depends on the first evaluation's output: unchanged means no dropout there.
    torch.testing.assert_close(dropped_state.s, state.s)
    assert not torch.allclose(dropped, out)


def test_mu_conventions():
    k = torch.ones(1, 2, 4, 3, dtype=torch.float64)
    # ||K||_1 = 12 per head; reference: N C / (4 ||K||_1) = 4 * 6 / 48; pcp uses D = 3.
    torch.testing.assert_close(pap_mu(k, 6), torch.full((1, 2, 1, 1), 0.5, dtype=torch.float64))
    torch.testing.assert_close(pap_mu(k, 3), torch.full((1, 2, 1, 1), 0.25, dtype=torch.float64))
    causal = pap_mu(k, 6, is_causal=True)[0, 0, :, 0]
    torch.testing.assert_close(causal, torch.full((4,), 0.5, dtype=torch.float64))
