"""Kernel-PCA diagnostics of softmax attention (the paper's Sec. 2), on (B, H, N, D) tensors.

The kernel is κ(x, y) = exp(xᵀy · scale) (scale = 1/√D), g(x) = Σ_j κ(x, k_j) and the feature
φ(x) = ψ(x) / g(x), where ψ is κ's feature map, so φ(x)ᵀφ(y) = κ(x, y) / (g(x) g(y)). Softmax
attention h_i = Σ_j softmax_j(q_iᵀk_j · scale) v_j is then the projection of φ(q_i) on kernel
principal axes of the centred key features when V = G⁻¹ A (G = diag g(k_j), A the centred Gram
matrix's eigenvectors, each scaled to squared norm 1 / eigenvalue). The functions below measure how
far a layer's learned q, k, v are from that form:

- :func:`projection_loss`: J_proj = (1/N) Σ_i (‖φ(q_i)‖² − ‖h_i‖²), ‖φ(q_i)‖² = κ(q_i, q_i) / g(q_i)².
- :func:`eigenvector_test`: â_d = G V[:, d], γ_d = (K̃_φ â_d) ⊘ (N â_d); γ_d is constant (the
  eigenvalue / N) exactly when â_d is an eigenvector of K̃_φ. Summarised, as in the paper, by the
  mean ± std of |γ_{d,i} − γ_{d,j}| over the pairs i < j. That spread divides by â_d's entries, so
  an entry near zero dominates it and a tiny change of the weights can move it many-fold; the test
  therefore also gives the eigen-residual r_d = ‖K̃_φ â_d − N ρ_d â_d‖ / ‖K̃_φ â_d‖ with
  N ρ_d = â_dᵀK̃_φ â_d / â_dᵀâ_d the Rayleigh quotient: the sine of the angle between K̃_φ â_d and
  â_d, in [0, 1], 0 exactly for an eigenvector, unchanged by scaling â_d, and stable (the statistic
  to read; the spread is kept to compare with the paper).
- :func:`gram_spectrum`: the eigenvalues of K̃_φ = C K_φ C (C = I − 11ᵀ/N), descending.
- :func:`value_alignment`: the share of the centred â's energy inside the span of K̃_φ's top-D_v
  eigenvectors (1 for values in the kernel-PCA form).

Everything is computed in float64 from logarithms (g overflows in float32 for large scores), with
materialised N x N matrices: these are diagnostics for a sample of a batch, not a training path.
The Gram-based quantities use all N keys; ``is_causal`` changes only J_proj, where each query's g
and h sum over the keys it may attend to.

Legend: B batch, H heads, N tokens, D query / key head dim, Dv value head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kpca.attention import _checks


@dataclass(frozen=True)
class EigenvectorTest:
    """The eigenvector test of each value dimension d (all tensors (B, H, Dv), float64).

    Attributes:
        spread_mean: mean over pairs i < j of |γ_{d,i} − γ_{d,j}| (0 when â_d is an eigenvector); the
            paper's statistic, ill-conditioned when an entry of â_d is near zero.
        spread_std: standard deviation of |γ_{d,i} − γ_{d,j}| over the same pairs.
        gamma_mean: mean over i of γ_{d,i}: the eigenvalue / N that â_d would have.
        residual: the eigen-residual r_d = ‖K̃_φ â_d − N ρ_d â_d‖ / ‖K̃_φ â_d‖ in [0, 1] (0 when â_d is an
            eigenvector), N ρ_d the Rayleigh quotient; the well-conditioned statistic.
    """

    spread_mean: torch.Tensor
    spread_std: torch.Tensor
    gamma_mean: torch.Tensor
    residual: torch.Tensor


@dataclass(frozen=True)
class KernelPCADiagnostics:
    """All kernel-PCA diagnostics of one attention layer (float64).

    Attributes:
        projection_loss: (B, H) J_proj.
        eigenvector: the :class:`EigenvectorTest`, (B, H, Dv) each.
        eigenvalues: (B, H, N) eigenvalues of the centred feature Gram matrix K̃_φ, descending.
        value_alignment: (B, H) share of the centred G V inside K̃_φ's top-Dv eigenvector span.
    """

    projection_loss: torch.Tensor
    eigenvector: EigenvectorTest
    eigenvalues: torch.Tensor
    value_alignment: torch.Tensor


def _scale_of(d: int, scale: float | None) -> float:
    _checks.check_scale(scale)
    return 1.0 / math.sqrt(d) if scale is None else scale


def _check_values(k: torch.Tensor, v: torch.Tensor) -> None:
    if v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v shape {tuple(v.shape)} must be (B, H, N, Dv) with (B, H, N) = {tuple(k.shape[:3])} of the keys"
        )


def _causal_mask(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()  # (N, N), True = may attend


def log_normaliser(x: torch.Tensor, k: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
    """The log normaliser log g(x_i) = log Σ_j exp(x_iᵀk_j · scale) of (B, H, M, D) points over (B, H, N, D) keys.

    Returns:
        (B, H, M), float64.
    """
    scale = _scale_of(k.shape[-1], scale)
    return torch.logsumexp(x.double() @ k.double().transpose(-2, -1) * scale, dim=-1)


def feature_gram(k: torch.Tensor, *, scale: float | None = None, centred: bool = True) -> torch.Tensor:
    """The Gram matrix of the key features, K_φ[i, j] = φ(k_i)ᵀφ(k_j), double-centred by default: (B, H, N, N).

    Args:
        k: (B, H, N, D) keys.
        scale: kernel scale, default 1/√D.
        centred: return K̃_φ = C K_φ C with C = I − 11ᵀ/N (the Gram matrix of the centred features).
    """
    _checks.check_qkv(k=k)
    scale = _scale_of(k.shape[-1], scale)
    k64 = k.double()
    scores = k64 @ k64.transpose(-2, -1) * scale  # (B, H, N, N)
    log_g = torch.logsumexp(scores, dim=-1)  # (B, H, N)
    gram = torch.exp(scores - log_g[..., :, None] - log_g[..., None, :])  # (B, H, N, N)
    if not centred:
        return gram
    gram = gram - gram.mean(dim=-1, keepdim=True)
    gram = gram - gram.mean(dim=-2, keepdim=True)
    return (gram + gram.transpose(-2, -1)) / 2  # exact symmetry for eigh


def _feature_scaled_values(k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
    """â = G V: each value row times g(k_j), in float64: (B, H, N, Dv)."""
    return torch.exp(log_normaliser(k, k, scale=scale))[..., None] * v.double()


def projection_loss(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None, is_causal: bool = False
) -> torch.Tensor:
    """J_proj = (1/N) Σ_i (‖φ(q_i)‖² − ‖h_i‖²) per (sample, head): (B, H), float64.

    Args:
        q, k: (B, H, N, D) queries and keys (pass q = k for symmetric attention).
        v: (B, H, N, Dv) values.
        scale: kernel / softmax scale, default 1/√D.
        is_causal: query i's g and h sum over keys j <= i only.
    """
    _checks.check_qkv(q=q, k=k)
    _check_values(k, v)
    scale = _scale_of(k.shape[-1], scale)
    q64, k64, v64 = q.double(), k.double(), v.double()
    scores = q64 @ k64.transpose(-2, -1) * scale  # (B, H, N, N)
    if is_causal:
        scores = scores.masked_fill(~_causal_mask(scores.shape[-1], scores.device), float("-inf"))
    log_g = torch.logsumexp(scores, dim=-1)  # (B, H, N)
    feature_sq = torch.exp((q64 * q64).sum(-1) * scale - 2 * log_g)  # ‖φ(q_i)‖², (B, H, N)
    h = torch.softmax(scores, dim=-1) @ v64  # (B, H, N, Dv)
    return (feature_sq - h.square().sum(-1)).mean(-1)


def _pairwise_spread(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of |x_i − x_j| over the pairs i < j of the last dim, in O(N log N): (...,) each."""
    n = x.shape[-1]
    pairs = n * (n - 1) / 2
    ranks = torch.arange(1, n + 1, dtype=x.dtype, device=x.device)
    sorted_x = x.sort(dim=-1).values
    mean_abs = (sorted_x * (2 * ranks - n - 1)).sum(-1) / pairs  # Σ_{i<j} (x_(j) − x_(i)) / pairs
    centred = x - x.mean(-1, keepdim=True)
    mean_sq = n * centred.square().sum(-1) / pairs  # Σ_{i<j} (x_i − x_j)² = N Σ (x_i − x̄)²
    return mean_abs, (mean_sq - mean_abs.square()).clamp_min(0).sqrt()


def _eigen_residual(gram: torch.Tensor, a_hat: torch.Tensor) -> torch.Tensor:
    """r_d = ‖K̃ â_d − N ρ_d â_d‖ / ‖K̃ â_d‖ of each column of (B, H, N, Dv) ``a_hat``: (B, H, Dv) in [0, 1].

    N ρ_d = â_dᵀK̃ â_d / â_dᵀâ_d makes N ρ_d â_d the orthogonal projection of K̃ â_d on â_d, so r_d is the
    sine of their angle. When K̃ â_d is zero to round-off (â_d = 0, or â_d in K̃'s null space, e.g. a
    constant since K̃ 1 = 0) the eigen-equation K̃ â_d = N ρ_d â_d holds with ρ_d = 0 and r_d is 0.
    """
    n = a_hat.shape[-2]
    tiny = torch.finfo(torch.float64).tiny
    image = gram @ a_hat  # K̃ â, (B, H, N, Dv)
    a_norm = a_hat.norm(dim=-2)  # (B, H, Dv)
    rayleigh = (a_hat * image).sum(-2) / a_norm.square().clamp_min(tiny)  # N ρ, (B, H, Dv)
    residual = (image - rayleigh[..., None, :] * a_hat).norm(dim=-2)  # (B, H, Dv)
    image_norm = image.norm(dim=-2)  # (B, H, Dv)
    # The round-off of K̃ â: N ε ‖K̃‖_F ‖â‖ bounds the error of the matrix-vector product.
    round_off = n * torch.finfo(torch.float64).eps * torch.linalg.matrix_norm(gram)[..., None] * a_norm  # (B, H, Dv)
    return torch.where(image_norm > round_off, residual / image_norm.clamp_min(tiny), 0.0)


def eigenvector_test(
    k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None, gram: torch.Tensor | None = None
) -> EigenvectorTest:
    """The eigenvector test of â_d = G V[:, d]: the paper's γ_d = (K̃_φ â_d) ⊘ (N â_d) and the eigen-residual.

    â_d is not centred, in both statistics: K̃_φ 1 = 0, so a constant offset in â_d makes it no eigenvector
    (γ_d is then not constant and r_d > 0, r_d = ‖offset‖ / ‖â_d‖ when the rest is an eigenvector); the
    kernel-PCA form's â_d = A[:, d] has none (the eigenvectors of nonzero eigenvalues are orthogonal to 1).
    (:func:`value_alignment` centres â, as it measures only the span.) The residual is computed from G V
    scaled by 1 / max_j g(k_j) per head, which it does not depend on, so large scores do not overflow it.

    Args:
        k: (B, H, N, D) keys.
        v: (B, H, N, Dv) values.
        scale: kernel scale, default 1/√D.
        gram: K̃_φ from :func:`feature_gram`, if already computed.

    Returns:
        The spread of each γ_d over its N entries and its residual r_d (B, H, Dv); an â_d entry that is
        exactly zero gives an infinite γ entry, hence an infinite spread, and leaves r_d finite.
        r_d is 0 when K̃_φ â_d is zero to round-off (â_d = 0 or a constant â_d; see above).
    """
    _checks.check_qkv(k=k)
    _check_values(k, v)
    n = k.shape[-2]
    gram = feature_gram(k, scale=scale) if gram is None else gram
    log_g = log_normaliser(k, k, scale=scale)  # (B, H, N)
    a_hat = torch.exp(log_g)[..., None] * v.double()  # G V, (B, H, N, Dv)
    gamma = (gram @ a_hat) / (n * a_hat)  # (B, H, N, Dv)
    spread_mean, spread_std = _pairwise_spread(gamma.transpose(-2, -1))  # (B, H, Dv) each
    scaled = torch.exp(log_g - log_g.amax(-1, keepdim=True))[..., None] * v.double()  # G V / max g, (B, H, N, Dv)
    return EigenvectorTest(spread_mean, spread_std, gamma.mean(-2), _eigen_residual(gram, scaled))


def gram_spectrum(k: torch.Tensor, *, scale: float | None = None, gram: torch.Tensor | None = None) -> torch.Tensor:
    """Eigenvalues of the centred feature Gram matrix K̃_φ, descending: (B, H, N), float64."""
    gram = feature_gram(k, scale=scale) if gram is None else gram
    return torch.linalg.eigvalsh(gram).flip(-1)


def value_alignment(
    k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None, gram: torch.Tensor | None = None
) -> torch.Tensor:
    """Share of the centred â = G V's energy inside the span of K̃_φ's top-Dv eigenvectors: (B, H) in [0, 1].

    1 when the values have the kernel-PCA form V = G⁻¹ A for Dv eigenvectors of the Gram's top Dv;
    trivially 1 when Dv >= N − 1 (the centred vectors then always lie in the span).
    """
    _checks.check_qkv(k=k)
    _check_values(k, v)
    gram = feature_gram(k, scale=scale) if gram is None else gram
    a_hat = _feature_scaled_values(k, v, scale)  # G V, (B, H, N, Dv)
    a_hat = a_hat - a_hat.mean(-2, keepdim=True)
    top = torch.linalg.eigh(gram).eigenvectors.flip(-1)[..., : v.shape[-1]]  # (B, H, N, Dv)
    inside = (top.transpose(-2, -1) @ a_hat).square().sum((-2, -1))
    return inside / a_hat.square().sum((-2, -1)).clamp_min(torch.finfo(torch.float64).tiny)


def kernel_pca_diagnostics(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None, is_causal: bool = False
) -> KernelPCADiagnostics:
    """Every diagnostic of one layer's (B, H, N, ·) queries, keys and values (one Gram matrix for all)."""
    gram = feature_gram(k, scale=scale)
    return KernelPCADiagnostics(
        projection_loss=projection_loss(q, k, v, scale=scale, is_causal=is_causal),
        eigenvector=eigenvector_test(k, v, scale=scale, gram=gram),
        eigenvalues=gram_spectrum(k, scale=scale, gram=gram),
        value_alignment=value_alignment(k, v, scale=scale, gram=gram),
    )
