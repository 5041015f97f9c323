"""Attention nn.Modules that drop into timm Vision Transformers (``Block(attn_layer=...)``).

Legend: B batch, N tokens, C model width, H heads, D head dim.

Parameter names follow timm's ``Attention`` (``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``gate``,
``proj``). The asymmetric projection is ``qkv = Linear(dim, 3 * H * D)`` (Q, K, V), so its
state_dict is timm's; the symmetric one is ``qkv = Linear(dim, 2 * H * D)`` (K, V), as in SymViT.
``RPCAttention`` adds no parameter to symmetric attention: checkpoints move between the two. The robust family
(``TwicingAttention``, ``NeuTRENOAttention``, ``EllipticalAttention``) is asymmetric, as the papers' DeiT attention,
and adds no parameter: a DeiT checkpoint loads as it is.

Elliptical and NeuTRENO read values of earlier blocks of the same forward (the previous block's, block 0's). They are
arguments of the call, as x-transformers passes its ``value_residual``: ``forward`` takes them (``first_values``,
``previous_values``) and appends the block's own values to a list of the caller's (``values_out``), and the model
that owns the loop over its blocks passes them on (:class:`~kpca.attention.vit_blocks.ValuePassingViT`, the
language model, Segmenter's decoder). No module keeps anything from one call to the next, so threads,
``nn.DataParallel`` replicas, activation checkpointing, TorchScript, torch.fx and ``torch.compile`` see plain
tensors.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, TypedDict

import torch
from torch import nn

from kpca.attention._backend import Backend, check_backend
from kpca.attention._calls import (
    elliptical_call,
    neutreno_call,
    refuse_token_order,
    rpc_call,
    scaled_values,
    softmax_call,
    twicing_call,
)
from kpca.attention._checks import (
    Convention,
    EllipticalConvention,
    check_elliptical_convention,
    check_pap_args,
)
from kpca.attention.errors import AttentionOptionError
from kpca.attention.functional import RPCState, rpc_attention
from kpca.attention.layout import qkv_rows, split_heads
from kpca.attention.robust import _check_lambd

if TYPE_CHECKING:
    from typing_extensions import Unpack

# A symbolic trace records each attention call as one node (see kpca.attention._calls), as timm's own tracer
# records the functions it registers; torch.fx.wrap works with every tracer.
torch.fx.wrap("softmax_call")
torch.fx.wrap("rpc_call")
torch.fx.wrap("scaled_values")
torch.fx.wrap("twicing_call")
torch.fx.wrap("neutreno_call")
torch.fx.wrap("elliptical_call")


class AttentionOptions(TypedDict, total=False):
    """The keywords every attention module here takes: timm ``Attention``'s, plus ``is_causal`` and ``backend``.

    Attributes:
        attn_head_dim: head dim D, default dim // num_heads.
        dim_out: output width, default dim.
        qkv_bias: bias in the input projection (default False).
        qk_norm: normalise queries and keys per head with ``norm_layer`` (default False).
        scale_norm: normalise the attention output before the output projection (default False).
        proj_bias: bias in the output projection (default True).
        gated: sigmoid gate on the attention output, timm's ``gated`` (default False).
        attn_drop: dropout on attention probabilities (default 0).
        proj_drop: dropout after the output projection (default 0).
        norm_layer: normalisation class for ``qk_norm`` / ``scale_norm`` (default None).
        is_causal: always attend causally (default False).
        backend: "auto" (the global default, else Triton for supported CUDA inputs, else torch), "torch" or
            "triton"; resolved at each eager call, see ``kpca.attention.set_backend``. A TorchScript model runs
            torch (and refuses "triton").
        device, dtype: factory arguments for the parameters.
    """

    attn_head_dim: int | None
    dim_out: int | None
    qkv_bias: bool
    qk_norm: bool
    scale_norm: bool
    proj_bias: bool
    gated: bool
    attn_drop: float
    proj_drop: float
    norm_layer: type[nn.Module] | None
    is_causal: bool
    backend: Backend
    device: torch.device | str | None
    dtype: torch.dtype | None


class _ProjectedAttention(nn.Module, abc.ABC):
    """Shared projections of timm-style self-attention; subclasses implement ``_attend``.

    What the forward needs to know is decided and checked here, once, and stored: the forward is plain tensor code
    that TorchScript compiles and torch.fx traces, as timm's ``Attention``.

    Attributes:
        symmetric: whether queries are the keys (the projection makes K and V only, ``[K;V]``).
        num_heads: H.
        head_dim: D.
        attn_dim: H * D, the rows in each of Q, K and V.
        earlier_values: which earlier block's values the kind reads (class attribute): ``""`` none, ``"first"``
            block 0's (NeuTRENO), ``"previous"`` the block before's (Elliptical).
        block_index: this module's block in its model's stack of blocks (0 for a module on its own), set by
            :func:`index_attention_blocks`; a kind reading earlier values is plain softmax attention in block 0, and
            refuses a call without them in any other block.
    """

    __constants__ = ["earlier_values"]  # a class attribute: TorchScript reads it as a constant
    earlier_values: ClassVar[str] = ""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        symmetric: bool,
        *,
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
        is_causal: bool = False,
        backend: Backend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_backend(backend)
        if num_heads < 1:
            raise AttentionOptionError(f"num_heads must be >= 1, got {num_heads}")
        if attn_head_dim is None and dim % num_heads:
            raise AttentionOptionError(
                f"dim={dim} is not divisible by num_heads={num_heads}; pick num_heads dividing dim"
            )
        if (qk_norm or scale_norm) and norm_layer is None:
            raise AttentionOptionError(
                "qk_norm=True or scale_norm=True needs a norm_layer, e.g. norm_layer=nn.LayerNorm"
            )
        dd = {"device": device, "dtype": dtype}
        self.symmetric = symmetric
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
        self.block_index = 0

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
        first_values: torch.Tensor | None = None,
        previous_values: torch.Tensor | None = None,
        values_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Self-attention over tokens: timm ``Attention``'s call, plus the values of earlier blocks of this forward.

        Args:
            x: (B, N, C) tokens.
            attn_mask: bool (True = attend) or float additive mask broadcastable to (B, H, N, N).
            is_causal: causal attention for this call (also on when the module was built causal).
            key_padding_mask: (B, N) bool, True = padded token.
            first_values: (B, H, N, D) values of block 0 of this forward, None in block 0.
            previous_values: (B, H, N, D) values of the block before, None in block 0.
            values_out: a list of the caller's that this call appends its (B, H, N, D) values to, for the blocks
                after it; None: not asked for. (A TorchScript module called from Python appends to a copy of the
                list: script the model that owns the loop over its blocks, as ``torch.jit.script(vit)`` does.)

        Returns:
            (B, N, dim_out) tokens.

        Raises:
            ValueError: for a kind that reads earlier values, in a block other than 0, called without them.
        """
        b, n, _ = x.shape
        q, k, v = split_heads(self.qkv(x), self.symmetric, self.num_heads, self.head_dim)  # (B, H, N, D); q None: K
        k = self.k_norm(k)
        queries = k if q is None else self.q_norm(q)
        causal = True if self.is_causal else is_causal  # no branch on the argument: a torch.fx trace has a Proxy
        dropout_p = self.attn_drop.p if self.training else 0.0
        earlier = self._earlier(first_values, previous_values)  # (B, H, N, D) or None
        out = self._attend(queries, k, v, earlier, attn_mask, key_padding_mask, causal, dropout_p)
        if values_out is not None:
            values_out.append(v)
        out = self.norm(out.transpose(1, 2).reshape(b, n, self.attn_dim))  # (B, H, N, D) -> (B, N, H * D)
        if self.gate is not None:
            out = out * self.gate(x).sigmoid()
        return self.proj_drop(self.proj(out))  # (B, N, dim_out)

    def _earlier(self, first_values: torch.Tensor | None, previous_values: torch.Tensor | None) -> torch.Tensor | None:
        """The earlier block's (B, H, N, D) values that this kind reads, or None (block 0, or a kind reading none)."""
        if self.earlier_values == "":
            return None
        earlier = first_values if self.earlier_values == "first" else previous_values
        if earlier is None and self.block_index > 0:
            raise ValueError(
                "attention in block " + str(self.block_index) + " reads the " + self.earlier_values + " block's "
                "values of the same forward, and this call did not pass them: run it through its model's blocks "
                "(kpca.attention.vit's ViTs, the language model and Segmenter pass them), or pass first_values "
                "and previous_values, the earlier blocks' values (each block's values_out)"
            )
        return earlier

    @abc.abstractmethod
    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        earlier: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool,
        dropout_p: float,
    ) -> torch.Tensor:
        """Attend with (B, H, N, D) q, k, v (q is k for symmetric modules), and an earlier block's values: (B, H, N, D).

        ``earlier`` is the (B, H, N, D) values the kind reads (``earlier_values``), None where it reads none or in
        block 0.
        """


class SoftmaxAttention(_ProjectedAttention):
    """Softmax self-attention, asymmetric (timm's ``Attention``) or symmetric (SymViT: q = k).

    Args:
        dim: input width C.
        num_heads: number of heads H.
        symmetric: project K and V only (``Linear(dim, 2 * H * D)``) and use q = k.
        **kwargs: timm ``Attention``'s keywords and ours, see :class:`AttentionOptions`.
    """

    def __init__(
        self, dim: int, num_heads: int = 8, *, symmetric: bool = False, **kwargs: Unpack[AttentionOptions]
    ) -> None:
        super().__init__(dim, num_heads, symmetric, **kwargs)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        earlier: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool,
        dropout_p: float,
    ) -> torch.Tensor:
        return softmax_call(q, k, v, attn_mask, key_padding_mask, is_causal, dropout_p, self.backend)


class RPCAttention(_ProjectedAttention):
    """RPC-Attention: symmetric self-attention whose heads run Principal Attention Pursuit.

    Takes the arguments of :class:`SoftmaxAttention` (always symmetric) plus the PAP settings.
    Set ``record_state = True`` on an instance to keep the last eager forward's :class:`RPCState`
    in ``last_state`` (detached) for diagnostics; TorchScript and torch.fx graphs record none.

    Args:
        n_iter: attention evaluations per forward (the paper: 4 or 6 in block 0, 2 in all blocks).
        lambd: sparsity weight (the paper: 4).
        convention: "reference" (the authors' code) or "pcp" (textbook PCP), see ``rpc_attention``.
    """

    __jit_ignored_attributes__ = ["last_state"]  # eager diagnostics (a dataclass): no TorchScript attribute

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        n_iter: int = 4,
        lambd: float = 4.0,
        convention: Convention = "reference",
        **kwargs: Unpack[AttentionOptions],
    ) -> None:
        super().__init__(dim, num_heads, True, **kwargs)
        check_pap_args(n_iter, lambd, convention, None)
        self.n_iter = n_iter
        self.lambd = float(lambd)
        self.convention = convention
        self.mu_width = self.attn_dim if convention == "reference" else self.head_dim  # C (the authors'), D for pcp
        self.record_state = False
        self.last_state: RPCState | None = None

    def extra_repr(self) -> str:
        """The PAP settings, shown in ``repr(module)``."""
        return f"n_iter={self.n_iter}, lambd={self.lambd}, convention={self.convention!r}"

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        earlier: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool,
        dropout_p: float,
    ) -> torch.Tensor:
        if not torch.jit.is_scripting() and self.record_state:
            return self._attend_recording(k, v, attn_mask, key_padding_mask, is_causal, dropout_p)
        return rpc_call(
            k, v, self.n_iter, self.lambd, self.convention, self.mu_width, attn_mask, key_padding_mask, is_causal,
            dropout_p, self.backend,
        )  # fmt: skip

    def _attend_recording(self, k, v, attn_mask, key_padding_mask, is_causal: bool, dropout_p: float) -> torch.Tensor:
        """:meth:`_attend` keeping the :class:`RPCState` in ``last_state``; eager only."""
        if isinstance(k, torch.fx.Proxy):
            raise ValueError(
                "RPCAttention.record_state keeps the state of eager forwards, and a torch.fx trace has none; "
                "set record_state = False before tracing"
            )
        embed_dim = self.mu_width if self.convention == "reference" else None
        out, self.last_state = rpc_attention(
            k, v, n_iter=self.n_iter, lambd=self.lambd, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
            is_causal=is_causal, dropout_p=dropout_p, embed_dim=embed_dim, convention=self.convention,
            return_state=True, backend=self.backend,
        )  # fmt: skip
        return out


class ScaledAttention(_ProjectedAttention):
    """Scaled Attention S (the paper's Sec. 4): asymmetric softmax attention ``A (I − S) V``.

    ``S`` is a learnable (H, N, N) matrix per layer (``s_matrix``), initialised to 0, so the layer
    starts as timm's ``Attention``, whose parameter names it keeps (plus ``s_matrix``). Computed as one
    SDPA call on the reparametrised values ``V − S V``. Takes :class:`SoftmaxAttention`'s arguments
    (always asymmetric) plus:

    Args:
        num_tokens: N, the fixed sequence length (ViT: patches + prefix tokens); other lengths raise.
    """

    def __init__(self, dim: int, num_heads: int = 8, *, num_tokens: int, **kwargs: Unpack[AttentionOptions]) -> None:
        super().__init__(dim, num_heads, False, **kwargs)
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
            raise AttentionOptionError(
                f"num_tokens must be a positive int (N, the sequence length), got {num_tokens!r}"
            )
        refuse_token_order(self.is_causal, None)
        self.num_tokens = num_tokens
        like = self.qkv.weight
        self.s_matrix = nn.Parameter(
            torch.zeros(num_heads, num_tokens, num_tokens, device=like.device, dtype=like.dtype)
        )

    def extra_repr(self) -> str:
        """The sequence length S is built for, shown in ``repr(module)``."""
        return f"num_tokens={self.num_tokens}"

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        earlier: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool,
        dropout_p: float,
    ) -> torch.Tensor:
        v = scaled_values(v, self.s_matrix, is_causal, key_padding_mask)  # (I − S) V, (B, H, N, D)
        return softmax_call(q, k, v, attn_mask, None, False, dropout_p, self.backend)


class AlphaAsymAttention(_ProjectedAttention):
    """Scaled Attention α × Asym (the paper's Sec. 4): ``A (I − α softmax(K Kᵀ · scale)) V``.

    ``alpha`` is a learnable scalar per layer, initialised to 0, so the layer starts as timm's
    ``Attention`` (same parameter names, plus ``alpha``). Two SDPA calls: the symmetric map on the
    keys reparametrises the values, ``V − α softmax(K Kᵀ) V``, then the asymmetric map attends over
    them. Causal masks and key padding apply to both maps, so the layer is causal- and padding-safe;
    attention dropout applies to the asymmetric map only. Takes :class:`SoftmaxAttention`'s arguments
    (always asymmetric).
    """

    def __init__(self, dim: int, num_heads: int = 8, **kwargs: Unpack[AttentionOptions]) -> None:
        super().__init__(dim, num_heads, False, **kwargs)
        like = self.qkv.weight
        self.alpha = nn.Parameter(torch.zeros((), device=like.device, dtype=like.dtype))

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        earlier: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool,
        dropout_p: float,
    ) -> torch.Tensor:
        backend = self.backend
        symmetric = softmax_call(k, k, v, attn_mask, key_padding_mask, is_causal, 0.0, backend)  # softmax(K Kᵀ) V
        v = v - self.alpha.to(v.dtype) * symmetric  # (B, H, N, D)
        return softmax_call(q, k, v, attn_mask, key_padding_mask, is_causal, dropout_p, backend)


class TwicingAttention(_ProjectedAttention):
    """Twicing attention (Abdullaev & Nguyen, ICLR 2025): asymmetric attention with ``(2A - A²) V``.

    Takes :class:`SoftmaxAttention`'s arguments (always asymmetric, timm's parameter names); two SDPA calls per
    forward (``kpca.attention.twicing_attention``). No cross-layer state.

    Raises:
        ValueError: for ``attn_drop > 0``: the two SDPA calls would draw different dropout masks (the papers train
            with attention dropout 0).
    """

    def __init__(self, dim: int, num_heads: int = 8, **kwargs: Unpack[AttentionOptions]) -> None:
        super().__init__(dim, num_heads, False, **kwargs)
        if self.attn_drop.p != 0.0:
            raise AttentionOptionError(
                f"TwicingAttention takes no attention dropout, got attn_drop={self.attn_drop.p}: its two SDPA calls "
                "would draw different masks; set the model's attention dropout to 0 (the papers' setting)"
            )

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        earlier: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool,
        dropout_p: float,
    ) -> torch.Tensor:
        return twicing_call(q, k, v, attn_mask, key_padding_mask, is_causal)


class NeuTRENOAttention(_ProjectedAttention):
    """NeuTRENO (Nguyen et al., NeurIPS 2023): asymmetric attention ``A V + lambd (V_1 - V)``.

    ``V_1`` is the values of block 0 of the same forward, not detached (gradients reach block 0's ``qkv``), passed
    as ``first_values`` (``earlier_values = "first"``). In block 0 the module is block 0 itself: plain softmax
    attention (``V_1 - V = 0``). Takes :class:`SoftmaxAttention`'s arguments (always
    asymmetric, timm's parameter names, no parameter added) plus:

    Args:
        lambd: the fidelity weight lambda >= 0 (the papers: 0.6 vision, 0.4 language).
    """

    earlier_values = "first"

    def __init__(self, dim: int, num_heads: int = 8, *, lambd: float = 0.6, **kwargs: Unpack[AttentionOptions]) -> None:
        super().__init__(dim, num_heads, False, **kwargs)
        _check_lambd(lambd)
        self.lambd = float(lambd)

    def extra_repr(self) -> str:
        """The fidelity weight, shown in ``repr(module)``."""
        return f"lambd={self.lambd}"

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        earlier: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool,
        dropout_p: float,
    ) -> torch.Tensor:
        if earlier is None:  # block 0
            return softmax_call(q, k, v, attn_mask, key_padding_mask, is_causal, dropout_p, self.backend)
        return neutreno_call(q, k, v, earlier, self.lambd, attn_mask, key_padding_mask, is_causal, dropout_p)


class EllipticalAttention(_ProjectedAttention):
    """Elliptical attention (Nielsen et al., NeurIPS 2024): asymmetric softmax attention on rescaled queries.

    ``softmax((q * m) kᵀ / sqrt(D)) V``, m the per-dimension mean of ``|V - V_prev|`` over tokens over its maximum
    (prefix means when causal), without gradient (``kpca.attention.elliptical_attention``); ``V_prev`` is the
    previous block's values of the same forward, passed as ``previous_values`` (``earlier_values = "previous"``) and
    read without gradient. In block 0 there is no previous block: plain softmax attention.
    Takes :class:`SoftmaxAttention`'s arguments (always asymmetric, timm's parameter names, no parameter added), and
    ``convention``: ``causal`` (ours: a strictly causal prefix-mean estimate under causal attention, 1/sqrt(D) kept)
    or ``reference`` (the authors' code: in a causal model the estimate is the whole segment's mean, which sees
    later tokens, and the scores drop 1/sqrt(D); the same as ours in a non-causal one).
    """

    earlier_values = "previous"

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        convention: EllipticalConvention = "causal",
        **kwargs: Unpack[AttentionOptions],
    ) -> None:
        check_elliptical_convention(convention)
        super().__init__(dim, num_heads, False, **kwargs)
        self.convention = convention

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        earlier: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool,
        dropout_p: float,
    ) -> torch.Tensor:
        if earlier is None:  # block 0
            return softmax_call(q, k, v, attn_mask, key_padding_mask, is_causal, dropout_p, self.backend)
        return elliptical_call(q, k, v, earlier, attn_mask, key_padding_mask, is_causal, dropout_p, self.convention)


def index_attention_blocks(attentions: Sequence[nn.Module], owner: str = "the model") -> None:
    """Give each of ``attentions``, the attention modules of one stack of blocks, block 0 first, its ``block_index``.

    A model that owns a loop over its blocks calls it once built (``swap_attention`` does for the ViTs and
    Segmenter's decoder). Modules that are not ``kpca.attention``'s (timm's ``Attention``) are left as they are.

    Raises:
        ValueError: if a module reads earlier blocks' values and some module of the stack is not one of
            ``kpca.attention``'s, so that it returns no values to pass on (e.g. timm's ``Attention``).
    """
    reads = sorted({getattr(module, "earlier_values", "") for module in attentions} - {""})
    foreign = [i for i, module in enumerate(attentions) if not isinstance(module, _ProjectedAttention)]
    if reads and foreign:
        raise AttentionOptionError(
            f"blocks {foreign} of {owner} have attention that returns no values "
            f"({type(attentions[foreign[0]]).__name__}), which the attention reading the {' and '.join(reads)} "
            "block's values needs; give those blocks kpca.attention modules (AttentionSpec's per_block does: kind "
            "'softmax' for plain ones)"
        )
    for index, module in enumerate(attentions):
        if isinstance(module, _ProjectedAttention):
            module.block_index = index


def reads_earlier_values(attentions: Sequence[nn.Module]) -> bool:
    """Whether some module of ``attentions`` reads values of earlier blocks (Elliptical, NeuTRENO)."""
    return any(getattr(module, "earlier_values", "") for module in attentions)
