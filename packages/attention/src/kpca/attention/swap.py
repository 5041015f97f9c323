"""swap_attention: put any registered attention kind into the blocks of a timm ViT-like model."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from kpca.attention.errors import AttentionOptionError
from kpca.attention.layout import attention_dim, convert_qkv_rows, has_symmetric_qkv
from kpca.attention.modules import index_attention_blocks, reads_earlier_values
from kpca.attention.spec import AttentionSpec


@dataclass(frozen=True)
class AttentionSwap:
    """One replaced attention module: block index, class names before and after, and what moved."""

    block: int
    before: str
    after: str
    weights: str


def swap_attention(model: nn.Module, spec: AttentionSpec, *, task: str = "vision") -> list[AttentionSwap]:
    """Replace ``model.blocks[i].attn`` for the blocks ``spec`` selects, carrying weights over.

    Works on any model with a ``blocks`` sequence whose items hold an ``attn`` module with timm's
    ``Attention`` layout (``qkv``, ``proj``, ``num_heads``), timm's or ours. Weights move where they
    fit: asymmetric -> symmetric keeps the K and V rows of ``qkv`` and drops Q (and ``q_norm``);
    symmetric -> asymmetric initialises Q from K, so the new model computes the same function;
    symmetric <-> RPC move every parameter (RPC adds none); asymmetric -> a scaled-attention kind moves
    every parameter and starts S or α at 0, so the function is unchanged; asymmetric <-> Twicing, NeuTRENO or
    Elliptical move every parameter (they add none). Which block gets what is
    :meth:`AttentionSpec.per_block`: with ``spec.kind == "rpc"`` the blocks outside ``spec.layers``
    become symmetric softmax attention, with ``neutreno`` and ``elliptical`` asymmetric softmax attention,
    otherwise they are left as they are. Then each attention module learns its block index
    (``index_attention_blocks``).

    Kinds that read earlier blocks' values (Elliptical, NeuTRENO) go only into a model whose loop over its blocks
    passes them (class attribute ``passes_earlier_values``: ``kpca.attention.vit_blocks.ValuePassingViT``, the
    language model, Segmenter's decoder); timm's own ``VisionTransformer`` runs ``nn.Sequential`` blocks, which
    cannot, and is refused before anything changes.

    Args:
        model: the model whose blocks' attention is replaced.
        spec: the attention, and which blocks get it.
        task: whose defaults fill the settings ``spec`` leaves None (:meth:`AttentionSpec.resolved`).

    Returns:
        One :class:`AttentionSwap` per replaced module (blocks already of the wanted kind and
        settings are replaced too, so the result reflects ``spec`` exactly).

    Raises:
        ValueError: for a kind reading earlier values and a model that does not pass them.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)) or not all(hasattr(b, "attn") for b in blocks):
        raise TypeError(
            f"swap_attention needs a timm VisionTransformer-like model with .blocks[i].attn, got {type(model).__name__}"
        )
    if spec.kind == "scaled_s" and spec.num_tokens is None:
        spec = dataclasses.replace(spec, num_tokens=_vit_num_tokens(model))
    targets = spec.per_block(len(blocks))
    built = {
        i: target.build(**_shape_of(block.attn), task=task)
        for i, (block, target) in enumerate(zip(blocks, targets, strict=True))
        if target is not None
    }
    owner = f"{type(model).__name__}.blocks"
    attentions = [built.get(i, block.attn) for i, block in enumerate(blocks)]
    if reads_earlier_values(attentions) and not getattr(model, "passes_earlier_values", False):
        raise AttentionOptionError(
            f"attention kind {spec.kind!r} reads earlier blocks' values, which the loop over {owner} does not pass "
            f"({type(model).__name__} runs its blocks one after the other, unaware of values); build the ViT with "
            "kpca.attention.vit.create_vit or timm.create_model (e.g. 'deit_neutreno_tiny_patch16_224'), whose "
            "blocks pass them, or give the model a loop that passes each block's values_out on to the next blocks "
            "(first_values, previous_values)"
        )
    index_attention_blocks(attentions, owner=owner)
    swaps = []
    for i, new in built.items():
        old = blocks[i].attn
        swaps.append(AttentionSwap(i, type(old).__name__, type(new).__name__, _move_weights(old, new)))
        blocks[i].attn = new
    return swaps


def _vit_num_tokens(model: nn.Module) -> int:
    """N of a timm ViT: patches plus prefix (class / distillation / register) tokens."""
    patches = getattr(getattr(model, "patch_embed", None), "num_patches", None)
    if not isinstance(patches, int):
        raise AttentionOptionError(
            f"cannot read the sequence length of {type(model).__name__} (no patch_embed.num_patches); "
            "set AttentionSpec.num_tokens for kind 'scaled_s'"
        )
    return patches + int(getattr(model, "num_prefix_tokens", 1))


def _shape_of(old: nn.Module) -> dict:
    """The :meth:`AttentionSpec.build` arguments of a module shaped like ``old`` (timm's ``Attention`` or ours)."""
    qkv, proj = getattr(old, "qkv", None), getattr(old, "proj", None)
    if not isinstance(qkv, nn.Linear) or not isinstance(proj, nn.Linear) or not hasattr(old, "num_heads"):
        raise TypeError(f"cannot swap {type(old).__name__}: expected timm Attention layout (qkv, proj, num_heads)")
    return {
        "dim": qkv.in_features,
        "num_heads": old.num_heads,
        "attn_head_dim": attention_dim(old) // old.num_heads,
        "dim_out": proj.out_features,
        "qkv_bias": qkv.bias is not None,
        "proj_bias": proj.bias is not None,
        "gated": getattr(old, "gate", None) is not None,
        "attn_drop": old.attn_drop.p,
        "proj_drop": old.proj_drop.p,
        "device": qkv.weight.device,
        "dtype": qkv.weight.dtype,
    }


def _move_weights(old: nn.Module, new: nn.Module) -> str:
    """Carry ``old``'s norms, weights and mode over to ``new`` (its replacement); what moved."""
    attn_dim = attention_dim(old)
    old_symmetric, new_symmetric = has_symmetric_qkv(old), new.symmetric
    new.is_causal = getattr(old, "is_causal", False)
    new.k_norm = copy.deepcopy(old.k_norm)
    new.norm = copy.deepcopy(getattr(old, "norm", nn.Identity()))
    if not new_symmetric:
        new.q_norm = copy.deepcopy(old.k_norm if old_symmetric else old.q_norm)
    with torch.no_grad():
        for name in ("weight", "bias"):
            src = getattr(old.qkv, name)
            if src is not None:
                getattr(new.qkv, name).copy_(convert_qkv_rows(src, attn_dim, new_symmetric))
        new.proj.load_state_dict(old.proj.state_dict())
        if new.gate is not None:
            new.gate.load_state_dict(old.gate.state_dict())
    new.train(old.training)
    if old_symmetric == new_symmetric:
        return "all"
    return "K, V kept; Q dropped" if new_symmetric else "K, V kept; Q initialised from K"
