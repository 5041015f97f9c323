"""The attention calls of the modules, in the form TorchScript compiles and torch.fx records as one node each.

Legend: B batch, H heads, N tokens, D head dim.

A module's forward is plain tensor code around one or two of these calls. In eager Python each call is the public
function (``softmax_attention``, ``rpc_attention``, the robust family's): argument checks, the backend chosen per
call (Triton for CUDA inputs), PAP's autograd Functions that save one int8 mask per iteration. TorchScript compiles
only the ``torch.jit.is_scripting()`` branch: the torch backend on plain ops (``masked_sdpa``,
``_pap.pap_attention``, ``robust.rescaled_sdpa``), the same forward operations, so the same values. Values from
earlier blocks (NeuTRENO's, Elliptical's) are arguments like any other. ``kpca.attention.modules`` registers the calls
with ``torch.fx.wrap``: a symbolic trace (timm's, torchvision's feature extractor, ``torch.fx.symbolic_trace``)
records each as one node, which runs the eager function (its checks then see real tensors), and which TorchScript
compiles if the traced graph is scripted. Arguments are positional, as TorchScript wants them.
"""

from __future__ import annotations

import torch

from kpca.attention._masks import masked_sdpa
from kpca.attention._pap import pap_attention
from kpca.attention.errors import AttentionOptionError
from kpca.attention.functional import rpc_attention, softmax_attention
from kpca.attention.robust import elliptical_attention, neutreno_attention, rescaled_sdpa, twicing_attention


def _torch_backend_only(backend: str) -> None:
    """A scripted model runs the torch backend: refuse an explicit ``triton`` rather than fall back silently."""
    if backend == "triton":
        raise RuntimeError(
            "backend='triton' cannot run in a TorchScript model, which runs the torch backend; build the attention "
            "with backend='torch' or 'auto', or run the model eagerly (or with torch.compile) for Triton"
        )


def softmax_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    backend: str,
) -> torch.Tensor:
    """``softmax_attention(q, k, v, ...)`` on (B, H, N, D) tensors: (B, H, N, D)."""
    if torch.jit.is_scripting():
        _torch_backend_only(backend)
        return masked_sdpa(q, k, v, attn_mask, key_padding_mask, is_causal, dropout_p, None)
    return softmax_attention(
        q,
        k,
        v,
        attn_mask=attn_mask,
        key_padding_mask=key_padding_mask,
        is_causal=is_causal,
        dropout_p=dropout_p,
        backend=backend,
    )


def rpc_call(
    k: torch.Tensor,
    v: torch.Tensor,
    n_iter: int,
    lambd: float,
    convention: str,
    width: int,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    backend: str,
) -> torch.Tensor:
    """``rpc_attention(k, v, ...)`` on (B, H, N, D) keys and values: (B, H, N, D).

    ``width`` is the width in mu: ``embed_dim`` (C) for the reference convention, the head dim D for pcp.
    """
    if torch.jit.is_scripting():
        _torch_backend_only(backend)
        pcp = convention == "pcp"
        return pap_attention(k, v, n_iter, lambd, pcp, width, attn_mask, key_padding_mask, is_causal, dropout_p)
    out = rpc_attention(
        k,
        v,
        n_iter=n_iter,
        lambd=lambd,
        attn_mask=attn_mask,
        key_padding_mask=key_padding_mask,
        is_causal=is_causal,
        dropout_p=dropout_p,
        embed_dim=width if convention == "reference" else None,
        convention=convention,
        backend=backend,
    )
    assert isinstance(out, torch.Tensor)  # no state asked for: the output alone
    return out


def refuse_token_order(is_causal: bool, key_padding_mask: torch.Tensor | None) -> None:
    """Scaled Attention S mixes values across all N tokens: no causal mask or key padding can hold."""
    if is_causal or key_padding_mask is not None:
        raise AttentionOptionError(
            "ScaledAttention mixes values across all tokens (A (I - S) V), so it cannot be causal or take a "
            "key_padding_mask; use kind 'scaled_alpha' (causal and padding safe) or plain softmax attention"
        )


def scaled_values(
    v: torch.Tensor, s_matrix: torch.Tensor, is_causal: bool, key_padding_mask: torch.Tensor | None
) -> torch.Tensor:
    """The values ``(I − S) V`` of Scaled Attention S: (B, H, N, D), for (B, H, N, D) ``v`` and (H, N, N) ``s_matrix``.

    Raises:
        ValueError: for a causal call, a key padding mask, or N other than the one S was built for.
    """
    refuse_token_order(is_causal, key_padding_mask)
    n, built_for = v.shape[2], s_matrix.shape[-1]
    if n != built_for:
        raise AttentionOptionError(
            f"ScaledAttention was built for num_tokens={built_for} but got N={n} tokens; build it "
            "(AttentionSpec.num_tokens) for the model's sequence length"
        )
    return v - s_matrix.to(v.dtype) @ v  # (H, N, N) @ (B, H, N, D) -> (B, H, N, D)


def twicing_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
) -> torch.Tensor:
    """``twicing_attention(q, k, v, ...)`` on (B, H, N, D) tensors: (B, H, N, D); no attention dropout."""
    if torch.jit.is_scripting():
        u1 = masked_sdpa(q, k, v, attn_mask, key_padding_mask, is_causal, 0.0, None)  # A v, (B, H, N, D)
        return u1 + masked_sdpa(q, k, v - u1, attn_mask, key_padding_mask, is_causal, 0.0, None)
    return twicing_attention(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal)


def neutreno_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_first: torch.Tensor,
    lambd: float,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
) -> torch.Tensor:
    """``neutreno_attention(q, k, v, v_first, lambd=lambd, ...)`` on (B, H, N, D) tensors: (B, H, N, D)."""
    if torch.jit.is_scripting():
        out = masked_sdpa(q, k, v, attn_mask, key_padding_mask, is_causal, dropout_p, None)  # (B, H, N, D)
        return out + lambd * (v_first - v)
    return neutreno_attention(
        q, k, v, v_first, lambd=lambd, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
        dropout_p=dropout_p,
    )  # fmt: skip


def elliptical_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_prev: torch.Tensor,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    convention: str = "causal",
) -> torch.Tensor:
    """``elliptical_attention(q, k, v, v_prev, ...)`` on (B, H, N, D) tensors: (B, H, N, D)."""
    if torch.jit.is_scripting():
        return rescaled_sdpa(q, k, v, v_prev, attn_mask, key_padding_mask, is_causal, dropout_p, None, convention)
    return elliptical_attention(
        q, k, v, v_prev, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
        dropout_p=dropout_p, convention=convention,
    )  # fmt: skip
