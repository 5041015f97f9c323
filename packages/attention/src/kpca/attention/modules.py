"""Attention nn.Modules that drop into timm Vision Transformers (``Block(attn_layer=...)``).

Legend: B batch, N tokens, C model width, H heads, D head dim.

Parameter names follow timm's ``Attention`` (``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``gate``,
``proj``). The asymmetric projection is ``qkv = Linear(dim, 3 * H * D)`` (Q, K, V), so its
state_dict is timm's; the symmetric one is ``qkv = Linear(dim, 2 * H * D)`` (K, V), as in SymViT.
``RPCAttention`` adds no parameter to symmetric attention: checkpoints move between the two.
"""

from __future__ import annotations

import abc

import torch
from torch import nn

from kpca.attention._backend import Backend, check_backend
from kpca.attention._checks import Convention, check_pap_args
from kpca.attention.functional import RPCState, rpc_attention, softmax_attention
from kpca.attention.layout import is_symmetric_qkv, qkv_rows, split_qkv


class _ProjectedAttention(nn.Module, abc.ABC):
    """Shared projections of timm-style self-attention; subclasses implement ``_attend``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        symmetric: bool,
        attn_head_dim: int | None,
        dim_out: int | None,
        qkv_bias: bool,
        qk_norm: bool,
        scale_norm: bool,
        proj_bias: bool,
        gated: bool,
        attn_drop: float,
        proj_drop: float,
        norm_layer: type[nn.Module] | None,
        is_causal: bool,
        backend: Backend,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
    ) -> None:
        super().__init__()
        check_backend(backend)
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        if attn_head_dim is None and dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}; pick num_heads dividing dim")
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("qk_norm=True or scale_norm=True needs a norm_layer, e.g. norm_layer=nn.LayerNorm")
        dd = {"device": device, "dtype": dtype}
        self.num_heads = num_heads
        self.head_dim = attn_head_dim or dim // num_heads
        self.attn_dim = num_heads * self.head_dim
        self.is_causal = is_causal
        self.backend = backend
        self.qkv = nn.Linear(dim, qkv_rows(self.attn_dim, symmetric), bias=qkv_bias, **dd)
        self.q_norm = norm_layer(self.head_dim, **dd) if qk_norm and not symmetric else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(self.attn_dim, **dd) if scale_norm else nn.Identity()
        self.gate = nn.Linear(dim, self.attn_dim, bias=qkv_bias, **dd) if gated else None
        self.proj = nn.Linear(self.attn_dim, dim_out or dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    @property
    def symmetric(self) -> bool:
        """Whether queries are the keys (the projection makes K and V only)."""
        return is_symmetric_qkv(self.qkv.weight, self.attn_dim)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Self-attention over tokens.

        Args:
            x: (B, N, C) tokens.
            attn_mask: bool (True = attend) or float additive mask broadcastable to (B, H, N, N).
            is_causal: causal attention for this call (also on when the module was built causal).
            key_padding_mask: (B, N) bool, True = padded token.

        Returns:
            (B, N, dim_out) tokens.
        """
        b, n, _ = x.shape
        q, k, v = split_qkv(self.qkv(x), self.num_heads, self.head_dim)  # (B, H, N, D) each; q None if symmetric
        if q is not None:
            q = self.q_norm(q)
        k = self.k_norm(k)
        out = self._attend(
            k if q is None else q,
            k,
            v,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            is_causal=is_causal or self.is_causal,
            dropout_p=self.attn_drop.p if self.training else 0.0,
            backend=self.backend,
        )  # (B, H, N, D)
        out = self.norm(out.transpose(1, 2).reshape(b, n, self.attn_dim))  # (B, N, H * D)
        if self.gate is not None:
            out = out * self.gate(x).sigmoid()
        return self.proj_drop(self.proj(out))  # (B, N, dim_out)

    @abc.abstractmethod
    def _attend(self, q, k, v, **kwargs) -> torch.Tensor:
        """Attend with (B, H, N, D) q, k, v; q is k for symmetric modules."""


class SoftmaxAttention(_ProjectedAttention):
    """Softmax self-attention, asymmetric (timm's ``Attention``) or symmetric (SymViT: q = k).

    Args:
        dim: input width C.
        num_heads: number of heads H.
        attn_head_dim: head dim D, default dim // num_heads.
        dim_out: output width, default dim.
        qkv_bias: bias in the input projection.
        qk_norm: normalise queries and keys per head with ``norm_layer``.
        scale_norm: normalise the attention output before the output projection.
        proj_bias: bias in the output projection.
        gated: sigmoid gate on the attention output (timm's ``gated``).
        attn_drop: dropout on attention probabilities.
        proj_drop: dropout after the output projection.
        norm_layer: normalisation class for ``qk_norm`` / ``scale_norm``.
        symmetric: project K and V only (``Linear(dim, 2 * H * D)``) and use q = k.
        is_causal: always attend causally.
        backend: "auto" (the global default, else Triton for supported CUDA inputs, else torch),
            "torch" or "triton"; resolved at each call, see ``kpca.attention.set_backend``.
        device, dtype: factory arguments for the parameters.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        gated: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        *,
        symmetric: bool = False,
        is_causal: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            dim, num_heads, symmetric, attn_head_dim, dim_out, qkv_bias, qk_norm, scale_norm,
            proj_bias, gated, attn_drop, proj_drop, norm_layer, is_causal, backend, device, dtype,
        )  # fmt: skip

    def _attend(self, q, k, v, **kwargs) -> torch.Tensor:
        return softmax_attention(q, k, v, **kwargs)


class RPCAttention(_ProjectedAttention):
    """RPC-Attention: symmetric self-attention whose heads run Principal Attention Pursuit.

    Takes the arguments of :class:`SoftmaxAttention` (always symmetric) plus the PAP settings.
    Set ``record_state = True`` on an instance to keep the last forward's :class:`RPCState`
    in ``last_state`` (detached) for diagnostics.

    Args:
        n_iter: attention evaluations per forward (the paper: 4 or 6 in block 0, 2 in all blocks).
        lambd: sparsity weight (the paper: 4).
        convention: "reference" (the authors' code) or "pcp" (textbook PCP), see ``rpc_attention``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        gated: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        *,
        n_iter: int = 4,
        lambd: float = 4.0,
        convention: Convention = "reference",
        is_causal: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            dim, num_heads, True, attn_head_dim, dim_out, qkv_bias, qk_norm, scale_norm,
            proj_bias, gated, attn_drop, proj_drop, norm_layer, is_causal, backend, device, dtype,
        )  # fmt: skip
        check_pap_args(n_iter, lambd, convention, None)
        self.n_iter = n_iter
        self.lambd = lambd
        self.convention = convention
        self.record_state = False
        self.last_state: RPCState | None = None

    def extra_repr(self) -> str:
        """The PAP settings, shown in ``repr(module)``."""
        return f"n_iter={self.n_iter}, lambd={self.lambd}, convention={self.convention!r}"

    def _attend(self, q, k, v, **kwargs) -> torch.Tensor:
        out = rpc_attention(
            k,
            v,
            n_iter=self.n_iter,
            lambd=self.lambd,
            convention=self.convention,
            embed_dim=self.attn_dim if self.convention == "reference" else None,
            return_state=self.record_state,
            **kwargs,
        )
        if not self.record_state:
            return out
        out, self.last_state = out
        return out


def _asymmetric_only(module: nn.Module, is_causal: bool, key_padding_mask: torch.Tensor | None) -> None:
    """Scaled Attention S mixes values across all N tokens: no causal mask or key padding can hold."""
    if is_causal or key_padding_mask is not None:
        raise ValueError(
            f"{type(module).__name__} mixes values across all tokens (A (I - S) V), so it cannot be causal or "
            "take a key_padding_mask; use kind 'scaled_alpha' (causal and padding safe) or plain softmax attention"
        )


class ScaledAttention(_ProjectedAttention):
    """Scaled Attention S (the paper's Sec. 4): asymmetric softmax attention ``A (I − S) V``.

    ``S`` is a learnable (H, N, N) matrix per layer (``s_matrix``), initialised to 0, so the layer
    starts as timm's ``Attention``, whose parameter names it keeps (plus ``s_matrix``). Computed as one
    SDPA call on the reparametrised values ``V − S V``. Takes :class:`SoftmaxAttention`'s arguments
    (always asymmetric) plus:

    Args:
        num_tokens: N, the fixed sequence length (ViT: patches + prefix tokens); other lengths raise.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        gated: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        *,
        num_tokens: int,
        is_causal: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            dim, num_heads, False, attn_head_dim, dim_out, qkv_bias, qk_norm, scale_norm,
            proj_bias, gated, attn_drop, proj_drop, norm_layer, is_causal, backend, device, dtype,
        )  # fmt: skip
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"num_tokens must be a positive int (N, the sequence length), got {num_tokens!r}")
        _asymmetric_only(self, is_causal, None)
        self.num_tokens = num_tokens
        self.s_matrix = nn.Parameter(torch.zeros(num_heads, num_tokens, num_tokens, device=device, dtype=dtype))

    def extra_repr(self) -> str:
        """The sequence length S is built for, shown in ``repr(module)``."""
        return f"num_tokens={self.num_tokens}"

    def _attend(self, q, k, v, **kwargs) -> torch.Tensor:
        _asymmetric_only(self, kwargs["is_causal"], kwargs["key_padding_mask"])
        if v.shape[-2] != self.num_tokens:
            raise ValueError(
                f"ScaledAttention was built for num_tokens={self.num_tokens} but got N={v.shape[-2]} tokens; "
                "build it (AttentionSpec.num_tokens) for the model's sequence length"
            )
        v = v - self.s_matrix.to(v.dtype) @ v  # (I − S) V: (H, N, N) @ (B, H, N, D) -> (B, H, N, D)
        return softmax_attention(q, k, v, **kwargs)


class AlphaAsymAttention(_ProjectedAttention):
    """Scaled Attention α × Asym (the paper's Sec. 4): ``A (I − α softmax(K Kᵀ · scale)) V``.

    ``alpha`` is a learnable scalar per layer, initialised to 0, so the layer starts as timm's
    ``Attention`` (same parameter names, plus ``alpha``). Two SDPA calls: the symmetric map on the
    keys reparametrises the values, ``V − α softmax(K Kᵀ) V``, then the asymmetric map attends over
    them. Causal masks and key padding apply to both maps, so the layer is causal- and padding-safe;
    attention dropout applies to the asymmetric map only. Takes :class:`SoftmaxAttention`'s arguments
    (always asymmetric).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        gated: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        *,
        is_causal: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            dim, num_heads, False, attn_head_dim, dim_out, qkv_bias, qk_norm, scale_norm,
            proj_bias, gated, attn_drop, proj_drop, norm_layer, is_causal, backend, device, dtype,
        )  # fmt: skip
        self.alpha = nn.Parameter(torch.zeros((), device=device, dtype=dtype))

    def _attend(self, q, k, v, **kwargs) -> torch.Tensor:
        symmetric = softmax_attention(k, k, v, **{**kwargs, "dropout_p": 0.0})  # softmax(K Kᵀ) V, (B, H, N, D)
        return softmax_attention(q, k, v - self.alpha.to(v.dtype) * symmetric, **kwargs)
