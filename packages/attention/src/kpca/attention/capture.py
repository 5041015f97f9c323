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


def _head_dim(module: nn.Module) -> int:
    attn_dim = getattr(module, "attn_dim", None) or module.head_dim * module.num_heads
    return attn_dim // module.num_heads


def is_attention_layer(module: nn.Module) -> bool:
    """Whether ``module`` has timm's attention layout: a ``qkv`` Linear making 2 or 3 x H x D features."""
    qkv, heads = getattr(module, "qkv", None), getattr(module, "num_heads", None)
    if not isinstance(qkv, nn.Linear) or not isinstance(heads, int) or not hasattr(module, "head_dim"):
        return False
    return qkv.out_features in (2 * heads * _head_dim(module), 3 * heads * _head_dim(module))


def attention_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Every attention layer of ``model`` (see :func:`is_attention_layer`) by its qualified name, in order."""
    return {name: m for name, m in model.named_modules() if is_attention_layer(m)}


def project_qkv(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """The (B, H, N, D) queries, keys and values that ``module`` computes from its (B, N, C) input ``x``.

    Returns:
        ``(q, k, v, symmetric)``: for a symmetric layer (``qkv`` makes K and V only, as in SymViT and
        RPC-Attention) q is k. Query / key norms are applied as the layer applies them.
    """
    if not is_attention_layer(module):
        raise TypeError(f"{type(module).__name__} has no timm attention layout (qkv Linear, num_heads)")
    b, n, _ = x.shape
    head_dim = _head_dim(module)
    n_proj = module.qkv.out_features // (module.num_heads * head_dim)
    qkv = module.qkv(x).reshape(b, n, n_proj, module.num_heads, head_dim).permute(2, 0, 3, 1, 4)  # (P, B, H, N, D)
    k_norm = getattr(module, "k_norm", nn.Identity())
    if n_proj == 2:
        k, v = qkv.unbind(0)
        k = k_norm(k)
        return k, k, v, True
    q, k, v = qkv.unbind(0)
    return getattr(module, "q_norm", nn.Identity())(q), k_norm(k), v, False


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
        yield inputs
    finally:
        for handle in handles:
            handle.remove()
