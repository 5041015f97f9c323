"""The robust family's models against the papers' formulas in float64, forward and backward: ViT, LM, Segmenter.

Each model's stack of blocks is restated here from the formulas, block by block: the attention of block l is the
loop-by-loop float64 oracle of ``kpca.attention.reference`` on that block's own q, k, v (Twicing ``(2A - A²) V``;
NeuTRENO ``A V + lambd (V_1 - V_l)`` with block 0's values V_1; Elliptical ``softmax((q * m) kᵀ · scale) V`` with m
from ``|V_l - V_{l-1}|``), block 0 of NeuTRENO and Elliptical is plain softmax attention (there is no earlier block),
and the blocks are wired as the papers' models: pre-norm for the ViT and Segmenter's encoder and decoder, post-norm
for the WikiText-103 LM (the authors' lmtool-fwms), with the LM's Elliptical in both conventions (``causal``: ours,
a prefix mean and 1/sqrt(D); ``reference``: the authors', the whole segment's mean and no 1/sqrt(D)). The
restatement and the model share weights; outputs and every parameter's gradient must agree.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from kpca.attention import AttentionSpec
from kpca.attention.reference import (
    elliptical_attention_reference,
    neutreno_attention_reference,
    softmax_attention_reference,
    twicing_attention_reference,
)
from kpca.attention.vit import create_vit
from kpca.language_model.model import CausalTransformerLM
from kpca.segmentation.model import Segmenter

KINDS = ("twicing", "neutreno", "elliptical")
VISION_LAMBD, LANGUAGE_LAMBD = 0.6, 0.4  # NeuTRENO's papers
TOLERANCE = {"rtol": 1e-10, "atol": 1e-12}


def attention_by_formula(
    attn: nn.Module,
    x: torch.Tensor,
    kind: str,
    index: int,
    earlier: list[torch.Tensor],
    *,
    lambd: float = VISION_LAMBD,
    is_causal: bool = False,
    convention: str = "causal",
) -> torch.Tensor:
    """Block ``index``'s attention on (B, N, C) ``x`` from the formulas; appends its (B, H, N, D) values to ``earlier``.

    ``earlier`` holds the values of blocks 0 .. index - 1 of this forward.
    """
    b, n, _ = x.shape
    q, k, v = attn.qkv(x).view(b, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)  # (B, H, N, D) each
    if kind == "twicing":
        heads = twicing_attention_reference(q, k, v, is_causal=is_causal)
    elif index == 0:  # NeuTRENO and Elliptical have no earlier block
        heads = softmax_attention_reference(q, k, v, is_causal=is_causal)
    elif kind == "neutreno":
        heads = neutreno_attention_reference(q, k, v, earlier[0], lambd=lambd, is_causal=is_causal)
    else:
        heads = elliptical_attention_reference(q, k, v, earlier[-1], is_causal=is_causal, convention=convention)
    earlier.append(v)
    return attn.proj(heads.transpose(1, 2).reshape(b, n, -1))  # (B, N, C)


def pre_norm_blocks(blocks: nn.ModuleList, x: torch.Tensor, kind: str) -> torch.Tensor:
    """ViT blocks (timm's ``Block``): ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``, block after block."""
    earlier: list[torch.Tensor] = []
    for index, block in enumerate(blocks):
        x = x + attention_by_formula(block.attn, block.norm1(x), kind, index, earlier)
        x = x + block.mlp(block.norm2(x))
    return x


def vit_by_formula(vit: nn.Module, images: torch.Tensor, kind: str) -> torch.Tensor:
    """A ViT's final normalised (B, 1 + N, C) tokens: timm's embedding (patches, class token, positions), the blocks
    restated, the final norm."""
    tokens = vit.norm_pre(vit._pos_embed(vit.patch_embed(images)))  # (B, 1 + N, C)
    return vit.norm(pre_norm_blocks(vit.blocks, tokens, kind))


def assert_same_outputs_and_gradients(model: nn.Module, got: torch.Tensor, expected: torch.Tensor) -> None:
    """``got`` (the model) equals ``expected`` (the formulas), and so does the gradient of every parameter."""
    torch.testing.assert_close(got, expected, **TOLERANCE)
    weights = torch.randn_like(got)
    named = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
    params = [param for _, param in named]
    grads = [torch.autograd.grad((out * weights).sum(), params, allow_unused=True) for out in (got, expected)]
    for (name, _), want, have in zip(named, grads[1], grads[0], strict=True):
        assert (want is None) == (have is None), name
        if want is not None:
            torch.testing.assert_close(have, want, **TOLERANCE, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("kind", KINDS)
def test_vit_equals_the_formulas(kind: str):
    torch.manual_seed(0)
    vit = create_vit(
        "deit_tiny", AttentionSpec(kind=kind), img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2
    ).double()
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    assert_same_outputs_and_gradients(vit, vit.forward_features(images), vit_by_formula(vit, images, kind))


LM_CASES = [
    ("twicing", {}),
    ("neutreno", {}),  # the language default, 0.4
    ("elliptical", {"convention": "causal"}),
    ("elliptical", {"convention": "reference"}),  # the authors' LM
]


@pytest.mark.parametrize(("kind", "settings"), LM_CASES, ids=["twicing", "neutreno", "elliptical", "elliptical-ref"])
def test_language_model_equals_the_formulas(kind: str, settings: dict):
    torch.manual_seed(0)
    spec = AttentionSpec(kind=kind, layers="all", **settings)
    model = CausalTransformerLM(
        vocab_size=40, context=12, width=32, depth=3, num_heads=2, ffn_dim=48, dropout=0.0, attention=spec
    ).double()
    tokens = torch.randint(0, 40, (2, 12))
    x = model.embed(tokens) * math.sqrt(model.width) + model.pos_embed[:12]  # (B, N, C)
    earlier: list[torch.Tensor] = []
    for index, block in enumerate(model.blocks):  # post-norm, the authors' lmtool-fwms blocks
        attended = attention_by_formula(
            block.attn, x, kind, index, earlier, lambd=LANGUAGE_LAMBD, is_causal=True,
            convention=settings.get("convention", "causal"),
        )  # fmt: skip
        x = block.norm1(x + attended)
        x = block.norm2(x + block.ffn.fc2(block.ffn.activation(block.ffn.fc1(x))))
    assert_same_outputs_and_gradients(model, model.hidden(tokens), x)


@pytest.mark.parametrize("kind", KINDS)
def test_segmenter_encoder_and_decoder_equal_the_formulas(kind: str):
    torch.manual_seed(0)
    spec = AttentionSpec(kind=kind)
    model = Segmenter(
        num_classes=3, attention=spec, decoder_attention=spec, decoder_dropout=0.0, img_size=32, patch_size=8,
        embed_dim=32, depth=2, num_heads=2, drop_path_rate=0.0,
    ).double()  # fmt: skip
    images = torch.rand(2, 3, 32, 32, dtype=torch.float64)
    encoded = vit_by_formula(model.vit, model.normalise(images), kind)  # (B, 1 + N, E)
    decoder = model.decoder
    x = decoder.proj_dec(encoded[:, 1:])  # (B, N, D)
    x = torch.cat([x, decoder.cls_emb.expand(2, -1, -1)], dim=1)  # (B, N + K, D): the class embeddings appended
    x = decoder.decoder_norm(pre_norm_blocks(decoder.blocks, x, kind))  # its own block 0
    patches = nn.functional.normalize(x[:, :-3] @ decoder.proj_patch, dim=-1)  # (B, N, D)
    classes = nn.functional.normalize(x[:, -3:] @ decoder.proj_classes, dim=-1)  # (B, K, D)
    masks = decoder.mask_norm(patches @ classes.transpose(1, 2)).transpose(1, 2).reshape(2, 3, 4, 4)  # (B, K, 4, 4)
    assert_same_outputs_and_gradients(model, model.forward_masks(images), masks)
