"""AttentionSpec: the one serialisable object with which apps and configs choose attention."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from torch import nn

from kpca.attention._backend import Backend, check_backend
from kpca.attention._checks import Convention, check_pap_args
from kpca.attention.modules import AlphaAsymAttention, RPCAttention, ScaledAttention, SoftmaxAttention

AttentionKind = Literal["softmax", "symmetric", "rpc", "scaled_s", "scaled_alpha"]
KINDS: tuple[str, ...] = get_args(AttentionKind)


@dataclass
class AttentionSpec:
    """Which attention a transformer uses, and in which blocks.

    Usable as a LightningCLI / jsonargparse argument type, e.g. in YAML::

        attention:
          kind: rpc
          n_iter: 4
          layers: [0]

    Args:
        kind: ``softmax`` (asymmetric, DeiT), ``symmetric`` (SymViT), ``rpc`` (RPC-SymViT), or the paper's
            scaled-attention variants of asymmetric attention: ``scaled_s`` (``A (I − S) V``, a learnable
            H x N x N ``S`` per layer, init 0) and ``scaled_alpha`` (``A (I − α softmax(K Kᵀ/√D)) V``, a
            learnable scalar α per layer, init 0).
        n_iter: PAP attention evaluations per RPC layer (>= 1); used by ``rpc`` only.
        lambd: PAP sparsity weight (> 0, finite); used by ``rpc`` only.
        layers: ``"all"`` or a list of block indices that get ``kind``. With ``rpc`` the other
            blocks are symmetric softmax (an RPC model is a SymViT with PAP in chosen blocks);
            with the other kinds the other blocks are left as they are (see :meth:`per_block`).
        convention: ``reference`` (the authors' mu and threshold) or ``pcp`` (textbook PCP).
        backend: ``auto``, ``torch`` or ``triton`` (see ``kpca.attention.set_backend``).
        num_tokens: N for ``scaled_s`` (its S is N x N); None lets ``swap_attention`` read it from a timm
            ViT (patches + prefix tokens).
    """  # noqa: D214, D405 (the YAML key ``attention:`` above is no docstring section)

    kind: AttentionKind = "softmax"
    n_iter: int = 4
    lambd: float = 4.0
    layers: Literal["all"] | list[int] = "all"
    convention: Convention = "reference"
    backend: Backend = "auto"
    num_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"AttentionSpec.kind must be one of {KINDS}, got {self.kind!r}")
        check_pap_args(self.n_iter, self.lambd, self.convention, None)
        check_backend(self.backend)
        if self.num_tokens is not None and (
            isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or self.num_tokens < 1
        ):
            raise ValueError(f"AttentionSpec.num_tokens must be a positive int or None, got {self.num_tokens!r}")
        if self.layers != "all":
            layers = self.layers
            if isinstance(layers, (str, int)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in layers
            ):
                raise ValueError(f"AttentionSpec.layers must be 'all' or a list of block indices, got {layers!r}")
            if any(i < 0 for i in layers) or len(set(layers)) != len(layers):
                raise ValueError(f"AttentionSpec.layers must hold distinct non-negative indices, got {list(layers)}")

    def block_indices(self, depth: int) -> list[int]:
        """The indices of the blocks that get ``kind`` in a model of ``depth`` blocks."""
        if self.layers == "all":
            return list(range(depth))
        too_big = [i for i in self.layers if i >= depth]
        if too_big:
            raise ValueError(f"AttentionSpec.layers {too_big} out of range for a model with {depth} blocks")
        return sorted(self.layers)

    def per_block(self, depth: int) -> list[AttentionSpec | None]:
        """The attention of each of ``depth`` blocks, as ``swap_attention`` and the apps apply it.

        Args:
            depth: number of blocks in the model.

        Returns:
            One entry per block: this spec for the blocks :meth:`block_indices` selects; for the
            others, with ``kind == "rpc"``, a symmetric spec on the same backend (an RPC model is a
            SymViT with PAP in chosen blocks), else None, meaning "leave that block's attention as it is".

        Raises:
            ValueError: if ``layers`` names a block index >= ``depth``.
        """
        chosen = set(self.block_indices(depth))
        rest = AttentionSpec(kind="symmetric", backend=self.backend) if self.kind == "rpc" else None
        return [self if i in chosen else rest for i in range(depth)]

    def build(self, dim: int, num_heads: int = 8, **kwargs) -> nn.Module:
        """Build the attention module of ``kind`` with timm ``Attention`` keywords (``qkv_bias``, ...).

        Raises:
            ValueError: for ``scaled_s`` without ``num_tokens``.
        """
        return _BUILDERS[self.kind](self, dim, num_heads, **kwargs)


def _softmax(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return SoftmaxAttention(dim, num_heads, backend=spec.backend, **kwargs)


def _symmetric(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return SoftmaxAttention(dim, num_heads, symmetric=True, backend=spec.backend, **kwargs)


def _rpc(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return RPCAttention(
        dim, num_heads, n_iter=spec.n_iter, lambd=spec.lambd, convention=spec.convention, backend=spec.backend, **kwargs
    )


def _scaled_s(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    if spec.num_tokens is None:
        raise ValueError(
            "AttentionSpec(kind='scaled_s') needs num_tokens (N, the sequence length) to build S; set it, "
            "or let swap_attention read it from a timm ViT"
        )
    return ScaledAttention(dim, num_heads, num_tokens=spec.num_tokens, backend=spec.backend, **kwargs)


def _scaled_alpha(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> nn.Module:
    return AlphaAsymAttention(dim, num_heads, backend=spec.backend, **kwargs)


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "softmax": _softmax,
    "symmetric": _symmetric,
    "rpc": _rpc,
    "scaled_s": _scaled_s,
    "scaled_alpha": _scaled_alpha,
}
"""The attention module of each kind in :data:`KINDS`: ``builder(spec, dim, num_heads, **timm_attention_kwargs)``."""
