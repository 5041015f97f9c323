"""Read the queries, keys and values that a model's attention layers see, for diagnostics.

Works on timm's ``Attention`` and on this package's modules, which share its layout (``qkv``,
``num_heads``, ``q_norm``, ``k_norm``): the layer input is recorded with a forward pre-hook and
projected again, so nothing in the model changes and no forward is reimplemented.

Legend: B batch, N tokens, C width, H heads, D head dim.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from kpca.attention.layout import attention_dim, is_attention_layer, split_qkv


def attention_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Every attention layer of ``model`` by its qualified name, in order.

    Attention layers are the modules with timm's layout, see :func:`kpca.attention.layout.is_attention_layer`.
    """
    return {name: m for name, m in model.named_modules() if is_attention_layer(m)}


def project_qkv(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """The (B, H, N, D) queries, keys and values that ``module`` computes from its (B, N, C) input ``x``.

    Returns:
        ``(q, k, v, symmetric)``: for a symmetric layer (``qkv`` makes K and V only, as in SymViT and
        RPC-Attention) q is k. Query / key norms are applied as the layer applies them.
    """
    if not is_attention_layer(module):
        raise TypeError(f"{type(module).__name__} has no timm attention layout (qkv Linear, num_heads)")
    head_dim = attention_dim(module) // module.num_heads
    q, k, v = split_qkv(module.qkv(x), module.num_heads, head_dim)  # (B, H, N, D) each; q None if symmetric
    if q is not None:
        q = getattr(module, "q_norm", nn.Identity())(q)
    k = getattr(module, "k_norm", nn.Identity())(k)
    return (k if q is None else q), k, v, q is None


@contextlib.contextmanager
def record_attention_inputs(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Record the input of every attention layer of ``model`` during the forwards run inside the block.

    Yields:
        A dict filled as the model runs: layer name -> its (B, N, C) input of the latest forward (detached).
    """
    inputs: dict[str, torch.Tensor] = {}
    handles = [
        layer.register_forward_pre_hook(lambda _m, args, name=name: inputs.__setitem__(name, args[0].detach()))
        for name, layer in attention_layers(model).items()
    ]
    try:
        with torch.compiler.set_stance("force_eager"):  # a compiled forward does not guard on hooks: run it eager
            yield inputs
    finally:
        for handle in handles:
            handle.remove()
