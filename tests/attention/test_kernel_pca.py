"""Kernel-PCA diagnostics on cases with known answers, against independent Gram-matrix computations."""

import itertools
import math

import pytest
import torch
from timm.layers import Attention

from kpca.attention import RPCAttention, SoftmaxAttention
from kpca.attention.capture import attention_layers, project_qkv, record_attention_inputs
from kpca.attention.kernel_pca import (
    eigenvector_test,
    feature_gram,
    gram_spectrum,
    kernel_pca_diagnostics,
    projection_loss,
    value_alignment,
)

B, H, N, D, DV = 2, 2, 9, 4, 3


def _kernel(x, y):
    """κ(x, y) = exp(xᵀy / √D) for (N, D) x (M, D), written out."""
    return torch.exp(x @ y.T / math.sqrt(x.shape[-1]))


def _kpca_form(k):
    """Values in the exact kernel-PCA form for keys k: V = G⁻¹ A_top, with the top-DV eigenvectors of the
    centred feature Gram matrix scaled to squared norm 1 / eigenvalue. Computed per (sample, head) from κ.

    Returns (values (B, H, N, DV), eigenvalues (B, H, DV), scaled eigenvectors (B, H, N, DV)).
    """
    values, eigvals, vectors = torch.zeros(B, H, N, DV, dtype=k.dtype), torch.zeros(B, H, DV), torch.zeros(B, H, N, DV)
    vectors = vectors.double()
    eigvals = eigvals.double()
    centre = torch.eye(N, dtype=k.dtype) - 1 / N
    for b, h in itertools.product(range(B), range(H)):
        kk = _kernel(k[b, h], k[b, h])  # (N, N)
        g = kk.sum(1)  # g(k_j)
        gram = centre @ (kk / g[:, None] / g[None, :]) @ centre
        lam, vec = torch.linalg.eigh(gram)
        lam, vec = lam.flip(0)[:DV], vec.flip(1)[:, :DV]
        a = vec / lam.sqrt()
        values[b, h] = a / g[:, None]
        eigvals[b, h], vectors[b, h] = lam, a
    return values, eigvals, vectors


def _keys(scale=0.7):
    return scale * torch.randn(B, H, N, D, dtype=torch.float64)


def test_gram_is_the_centred_gram_of_the_normalised_kernel():
    k = _keys()
    gram = feature_gram(k)
    centre = torch.eye(N, dtype=k.dtype) - 1 / N
    for b, h in itertools.product(range(B), range(H)):
        kk = _kernel(k[b, h], k[b, h])
        g = kk.sum(1)
        torch.testing.assert_close(gram[b, h], centre @ (kk / g[:, None] / g[None, :]) @ centre)
    eig = gram_spectrum(k)
    assert eig.shape == (B, H, N) and (eig[..., :-1] >= eig[..., 1:]).all()
    assert eig.min() > -1e-12  # a Gram matrix: positive semi-definite
    torch.testing.assert_close(eig[..., -1], torch.zeros(B, H, dtype=torch.float64), atol=1e-12, rtol=0)  # C 1 = 0


def test_values_in_kernel_pca_form_make_gamma_constant_at_the_eigenvalue():
    k = _keys()
    v, eigvals, _ = _kpca_form(k)
    test = eigenvector_test(k, v)
    assert test.spread_mean.shape == test.spread_std.shape == test.gamma_mean.shape == (B, H, DV)
    torch.testing.assert_close(test.spread_mean, torch.zeros(B, H, DV, dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(test.gamma_mean, eigvals / N)  # K̃ â = λ â, so γ = λ / N


def test_random_values_are_not_eigenvectors_and_not_aligned():
    k = _keys()
    v = torch.randn(B, H, N, DV, dtype=torch.float64)
    test = eigenvector_test(k, v)
    assert (test.spread_mean > 1e-3).all()
    alignment = value_alignment(k, v)
    assert ((alignment > 0) & (alignment < 0.99)).all()


def test_pairwise_spread_equals_the_brute_force_over_pairs():
    k = _keys()
    v = torch.randn(B, H, N, DV, dtype=torch.float64)
    test = eigenvector_test(k, v)
    gram = feature_gram(k)
    for b, h, d in itertools.product(range(B), range(H), range(DV)):
        kk = _kernel(k[b, h], k[b, h])
        a_hat = kk.sum(1) * v[b, h, :, d]  # G V[:, d]
        gamma = (gram[b, h] @ a_hat) / (N * a_hat)
        gaps = torch.stack([(gamma[i] - gamma[j]).abs() for i, j in itertools.combinations(range(N), 2)])
        torch.testing.assert_close(test.spread_mean[b, h, d], gaps.mean())
        torch.testing.assert_close(test.spread_std[b, h, d], gaps.std(unbiased=False))
        torch.testing.assert_close(test.gamma_mean[b, h, d], gamma.mean())


def test_values_in_kernel_pca_form_are_aligned():
    k = _keys()
    v, _, _ = _kpca_form(k)
    torch.testing.assert_close(value_alignment(k, v), torch.ones(B, H, dtype=torch.float64))


def _projection_loss_from_the_gram(q, k, a):
    """(1/N) Σ_i ‖φ(q_i) − P φ(q_i)‖², P the projection on the axes u_d = Σ_j a_dj φ̃(k_j), by the kernel trick."""
    losses = torch.zeros(B, H, dtype=torch.float64)
    for b, h in itertools.product(range(B), range(H)):
        g_q = _kernel(q[b, h], k[b, h]).sum(1)  # g(q_i)
        g_k = _kernel(k[b, h], k[b, h]).sum(1)  # g(k_j)
        cross = _kernel(q[b, h], k[b, h]) / g_q[:, None] / g_k[None, :]  # φ(q_i)ᵀφ(k_j)
        cross = cross - cross.mean(1, keepdim=True)  # φ(q_i)ᵀφ̃(k_j): the key features centred
        coords = cross @ a[b, h]  # (N, DV) coordinates on orthonormal axes
        self_sq = torch.diagonal(_kernel(q[b, h], q[b, h])) / g_q.square()  # ‖φ(q_i)‖²
        losses[b, h] = (self_sq - coords.square().sum(1)).mean()
    return losses


@pytest.mark.parametrize("symmetric", [True, False])
def test_projection_loss_is_the_kernel_pca_reconstruction_error_in_kernel_pca_form(symmetric):
    k = _keys()
    q = k if symmetric else _keys()
    v, _, a = _kpca_form(k)
    expected = _projection_loss_from_the_gram(q, k, a)
    loss = projection_loss(q, k, v)
    torch.testing.assert_close(loss, expected)
    assert (loss >= -1e-12).all()  # a squared distance to a subspace
    # More components can only reconstruct better: the loss with DV - 1 axes is larger.
    torch.testing.assert_close(projection_loss(q, k, v[..., :-1]), _projection_loss_from_the_gram(q, k, a[..., :-1]))
    assert (projection_loss(q, k, v[..., :-1]) >= loss).all()


def test_causal_projection_loss_sums_each_query_over_its_prefix():
    q, k, v = _keys(), _keys(), torch.randn(B, H, N, DV, dtype=torch.float64)
    loss = projection_loss(q, k, v, is_causal=True)
    expected = torch.zeros(B, H, dtype=torch.float64)
    for b, h in itertools.product(range(B), range(H)):
        for i in range(N):
            weights = _kernel(q[b, h, i : i + 1], k[b, h, : i + 1])[0]  # κ(q_i, k_j), j <= i
            g = weights.sum()
            h_i = (weights / g) @ v[b, h, : i + 1]
            expected[b, h] += (torch.exp(q[b, h, i] @ q[b, h, i] / math.sqrt(D)) / g**2 - h_i.square().sum()) / N
    torch.testing.assert_close(loss, expected)


def test_float32_inputs_give_float64_diagnostics_close_to_the_float64_ones():
    k = _keys()
    v = torch.randn(B, H, N, DV, dtype=torch.float64)
    full = kernel_pca_diagnostics(k, k, v)
    single = kernel_pca_diagnostics(k.float(), k.float(), v.float())
    assert single.projection_loss.dtype == torch.float64 and single.eigenvalues.dtype == torch.float64
    torch.testing.assert_close(single.projection_loss, full.projection_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(single.eigenvalues, full.eigenvalues, rtol=1e-5, atol=1e-6)


def test_large_scores_stay_finite():
    k = 40 * torch.randn(1, 1, N, D)  # exp(k kᵀ / √D) overflows float64 without logarithms
    diagnostics = kernel_pca_diagnostics(k, k, torch.randn(1, 1, N, DV))
    assert torch.isfinite(diagnostics.projection_loss).all() and torch.isfinite(diagnostics.eigenvalues).all()


def test_shape_errors_name_the_shapes():
    k = _keys()
    with pytest.raises(ValueError, match=r"v shape \(2, 2, 5, 3\) must be \(B, H, N, Dv\)"):
        projection_loss(k, k, torch.randn(2, 2, 5, 3))
    with pytest.raises(ValueError, match="scale must be a positive finite float"):
        feature_gram(k, scale=-1.0)


@pytest.mark.parametrize(
    "layer",
    [
        lambda: Attention(12, 3, qkv_bias=True),
        lambda: SoftmaxAttention(12, 3, qkv_bias=True),
        lambda: SoftmaxAttention(12, 3, symmetric=True),
        lambda: RPCAttention(12, 3, n_iter=2),
    ],
    ids=["timm", "softmax", "symmetric", "rpc"],
)
def test_recorded_inputs_reproduce_the_layers_queries_keys_and_values(layer):
    model = torch.nn.Sequential(torch.nn.Linear(12, 12), layer())
    model.eval()
    x = torch.randn(2, 5, 12)
    assert list(attention_layers(model)) == ["1"]
    with record_attention_inputs(model) as inputs:
        out = model(x)
    assert not model[1]._forward_pre_hooks  # the hooks are gone afterwards
    q, k, v, symmetric = project_qkv(model[1], inputs["1"])
    assert symmetric == (model[1].qkv.out_features == 24) and (q is k) == symmetric
    if not isinstance(model[1], RPCAttention):  # RPC's output is not one softmax of these q, k
        heads = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), -1) @ v  # (B, H, N, D)
        torch.testing.assert_close(out, model[1].proj(heads.transpose(1, 2).reshape(2, 5, 12)))
