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
    log_normaliser,
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
    assert test.spread_mean.shape == test.spread_std.shape == test.gamma_mean.shape == test.residual.shape == (B, H, DV)
    torch.testing.assert_close(test.spread_mean, torch.zeros(B, H, DV, dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(test.gamma_mean, eigvals / N)  # K̃ â = λ â, so γ = λ / N


def _centred_gram_eigh(k):
    """Eigenvalues (B, H, N) and eigenvectors (B, H, N, N) of K̃_φ written out from κ, descending."""
    lam, vec = torch.zeros(B, H, N, dtype=k.dtype), torch.zeros(B, H, N, N, dtype=k.dtype)
    centre = torch.eye(N, dtype=k.dtype) - 1 / N
    for b, h in itertools.product(range(B), range(H)):
        kk = _kernel(k[b, h], k[b, h])
        g = kk.sum(1)
        eigvals, eigvecs = torch.linalg.eigh(centre @ (kk / g[:, None] / g[None, :]) @ centre)
        lam[b, h], vec[b, h] = eigvals.flip(0), eigvecs.flip(1)
    return lam, vec


def _values_of(k, a_hat):
    """The values V = G⁻¹ â whose â = G V is ``a_hat`` (B, H, N, Dv)."""
    return a_hat / torch.exp(log_normaliser(k, k))[..., None]


def test_values_in_kernel_pca_form_have_eigen_residual_zero():
    k = _keys()
    v, _, _ = _kpca_form(k)
    residual = eigenvector_test(k, v).residual
    assert residual.shape == (B, H, DV) and residual.dtype == torch.float64
    torch.testing.assert_close(residual, torch.zeros(B, H, DV, dtype=torch.float64), atol=1e-12, rtol=0)


def test_eigen_residual_of_two_mixed_eigenvectors_is_the_hand_computed_value():
    # â = u_i + u_j (orthonormal, K̃ u = λ u): N ρ = (λ_i + λ_j) / 2, K̃ â − N ρ â = (λ_i − λ_j)(u_i − u_j) / 2,
    # so r = |λ_i − λ_j| / √(2 (λ_i² + λ_j²)).
    k = _keys()
    lam, vec = _centred_gram_eigh(k)
    pairs = [(0, 2), (1, 4)]
    a_hat = torch.stack([vec[..., i] + vec[..., j] for i, j in pairs], dim=-1)  # (B, H, N, 2)
    expected = torch.stack(
        [(lam[..., i] - lam[..., j]).abs() / (2 * (lam[..., i] ** 2 + lam[..., j] ** 2)).sqrt() for i, j in pairs], -1
    )
    torch.testing.assert_close(eigenvector_test(k, _values_of(k, a_hat)).residual, expected)
    assert (expected > 0.1).all() and (expected < 0.9).all()  # away from the ends, where a mutation would hide


def test_eigen_residual_of_random_values_equals_the_eigen_expansion():
    # â = Σ_i c_i u_i: r² = Σ_i (λ_i − μ)² c_i² / Σ_i λ_i² c_i², μ = Σ_i λ_i c_i² / Σ_i c_i² (the Rayleigh quotient).
    k = _keys()
    v = torch.randn(B, H, N, DV, dtype=torch.float64)
    lam, vec = _centred_gram_eigh(k)
    coefficients = vec.transpose(-2, -1) @ (torch.exp(log_normaliser(k, k))[..., None] * v)  # (B, H, N, DV)
    weights = coefficients.square()
    mu = (lam[..., None] * weights).sum(-2) / weights.sum(-2)  # (B, H, DV)
    expected = (
        ((lam[..., None] - mu[..., None, :]) ** 2 * weights).sum(-2) / (lam[..., None] ** 2 * weights).sum(-2)
    ).sqrt()
    residual = eigenvector_test(k, v).residual
    torch.testing.assert_close(residual, expected)
    assert ((residual > 0.1) & (residual < 1)).all()


def test_eigen_residual_counts_a_constant_offset_as_gamma_does():
    # â is not centred: â = u_1 + m 1 (u_1 ⟂ 1) gives K̃ â = λ_1 u_1 and r = ‖m 1‖ / ‖â‖; γ is not constant either.
    k = _keys()
    lam, vec = _centred_gram_eigh(k)
    offsets = torch.tensor([0.1, 0.5, 2.0], dtype=torch.float64)
    a_hat = vec[..., :1] + offsets  # (B, H, N, 3)
    test = eigenvector_test(k, _values_of(k, a_hat))
    expected = (math.sqrt(N) * offsets / (1 + N * offsets.square()).sqrt()).expand(B, H, 3)
    torch.testing.assert_close(test.residual, expected)
    assert (test.spread_mean > 0.01 * lam[..., :1] / N).all()  # γ of u_1 alone would be λ_1 / N everywhere


def test_eigen_residual_does_not_change_when_a_value_dimension_is_scaled():
    k = _keys()
    v = torch.randn(B, H, N, DV, dtype=torch.float64)
    residual = eigenvector_test(k, v).residual
    factors = torch.tensor([1e-6, -7.0, 1e5], dtype=torch.float64)  # one per value dimension
    torch.testing.assert_close(eigenvector_test(k, v * factors).residual, residual, rtol=1e-12, atol=0)
    assert ((residual >= 0) & (residual <= 1)).all()


def test_eigen_residual_is_zero_where_the_gram_maps_the_values_to_zero():
    k = _keys()
    constant = _values_of(k, torch.ones(B, H, N, DV, dtype=torch.float64))  # â = 1: K̃ 1 = 0 up to round-off
    assert (eigenvector_test(k, constant).residual == 0).all()
    assert (eigenvector_test(k, torch.zeros(B, H, N, DV, dtype=torch.float64)).residual == 0).all()  # â = 0
    same_keys = _keys()[..., :1, :].expand(B, H, 8, D)  # K̃ = 0: every feature is the mean
    assert (eigenvector_test(same_keys, torch.randn(B, H, 8, DV, dtype=torch.float64)).residual == 0).all()


def test_eigen_residual_is_stable_where_the_published_spread_is_not():
    # One entry of â_0 near zero (1e-9 of its scale): a perturbation of k and v of 1e-6 of their norms moves that
    # entry by ~1e3 times itself, so γ_0 and its spread change many-fold, while r_0 moves by ~1e-6.
    generator = torch.Generator().manual_seed(7)
    k = 0.7 * torch.randn(1, 1, N, D, dtype=torch.float64, generator=generator)
    v = torch.randn(1, 1, N, DV, dtype=torch.float64, generator=generator)
    v[0, 0, 4, 0] = 1e-9 * v[0, 0, :, 0].abs().mean()

    def perturbed(x):
        noise = torch.randn(x.shape, dtype=torch.float64, generator=generator)
        return x + 1e-6 * x.norm() * noise / noise.norm()

    before = kernel_pca_diagnostics(k, k, v).eigenvector
    k2 = perturbed(k)
    after = kernel_pca_diagnostics(k2, k2, perturbed(v)).eigenvector
    spread_change = (after.spread_mean[0, 0, 0] / before.spread_mean[0, 0, 0] - 1).abs()
    residual_change = (after.residual[0, 0, 0] / before.residual[0, 0, 0] - 1).abs()
    assert spread_change > 0.5, spread_change
    assert residual_change < 1e-4, residual_change
    assert before.residual[0, 0, 0] > 0.1  # not an eigenvector: the residual measures something


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
    residual = diagnostics.eigenvector.residual  # computed from G V / max g, which does not overflow
    assert ((residual >= 0) & (residual <= 1)).all()


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
