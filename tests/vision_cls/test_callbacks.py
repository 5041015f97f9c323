"""class_token_attention (AttentionMaps' maps): the class token's attention, for each attention layout."""

import math

import pytest
import torch

from kpca.attention import AttentionSpec, RPCAttention
from kpca.vision_cls.callbacks import class_token_attention
from kpca.vision_cls.model import ViTClassifier

TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 3}


def written_out(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, H, N) softmax over j of q_0 · k_j / sqrt(D), for (B, H, N, D) q and k."""
    return (torch.einsum("bhd,bhnd->bhn", q[:, :, 0], k) / math.sqrt(k.shape[-1])).softmax(-1)


def heads(rows: torch.Tensor) -> torch.Tensor:
    """(B, N, H * D) projection rows as (B, H, N, D), H = 2."""
    return rows.unflatten(-1, (2, -1)).transpose(1, 2)


@pytest.mark.parametrize("kind", ["softmax", "symmetric"])
def test_class_token_attention_reads_q_and_k_from_the_layers_rows(kind: str):
    attn = ViTClassifier("deit_tiny", attention=AttentionSpec(kind=kind), **TINY).vit.blocks[0].attn
    tokens = torch.randn(2, 17, 32)  # (B, N, C): class token + 4 x 4 patches
    projected = attn.qkv(tokens)  # (B, N, 3 * 32) [Q;K;V] or (B, N, 2 * 32) [K;V]
    k = heads(projected[..., -64:-32])
    q = k if kind == "symmetric" else heads(projected[..., :32])
    with torch.no_grad():
        torch.testing.assert_close(class_token_attention(attn, tokens), written_out(q, k))


def test_class_token_attention_of_rpc_is_its_last_pap_evaluation_on_the_cleaned_keys():
    model = ViTClassifier("deit_tiny", attention=AttentionSpec(kind="rpc", n_iter=2, layers=[0]), **TINY).eval()
    attn = model.vit.blocks[0].attn
    assert isinstance(attn, RPCAttention) and not attn.record_state
    tokens = torch.randn(2, 17, 32)
    with torch.no_grad():
        probs = class_token_attention(attn, tokens)
    assert not attn.record_state  # restored
    k_clean = attn.last_state.k_clean  # (B, H, N, D)
    torch.testing.assert_close(probs, written_out(k_clean, k_clean))
    assert not torch.allclose(k_clean, heads(attn.qkv(tokens)[..., :32]))  # not the raw keys
