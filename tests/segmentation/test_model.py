"""Segmenter and its mask-transformer head: shapes, attention per AttentionSpec, padding, and init_from."""

from pathlib import Path

import pytest
import torch

from kpca.attention import AttentionSpec, RPCAttention, SoftmaxAttention
from kpca.segmentation.model import MaskTransformerHead, Segmenter
from kpca.training.vision.vit import build_vit

pytestmark = pytest.mark.mmseg

TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "drop_path_rate": 0.0}
RPC = AttentionSpec(kind="rpc", n_iter=6, layers=[0])


def test_head_maps_patch_tokens_to_class_masks():
    head = MaskTransformerHead(in_dim=24, num_classes=5, dim=128)
    masks = head(torch.randn(2, 12, 24), grid=(3, 4))  # (B, N, E) tokens on a 3 x 4 grid
    assert masks.shape == (2, 5, 3, 4)
    assert len(head.blocks) == 2 and head.blocks[0].attn.num_heads == 2  # width // 64
    torch.testing.assert_close(masks.mean(1), torch.zeros(2, 3, 4), atol=1e-5, rtol=0)  # LayerNorm over classes


def test_head_with_rpc_attention_is_symmetric_and_trains():
    head = MaskTransformerHead(in_dim=16, num_classes=3, dim=64, num_heads=2, attention=RPC)
    first, second = (block.attn for block in head.blocks)
    assert isinstance(first, RPCAttention) and first.n_iter == 6 and first.symmetric
    assert isinstance(second, SoftmaxAttention) and second.symmetric  # RPC models are symmetric elsewhere
    assert first.qkv.out_features == 2 * 64  # K and V only
    tokens = torch.randn(2, 9, 16, requires_grad=True)
    head(tokens, grid=(3, 3)).square().sum().backward()
    assert torch.isfinite(tokens.grad).all() and tokens.grad.abs().sum() > 0


@pytest.mark.parametrize("size", [(32, 32), (40, 27)])
def test_segmenter_gives_logits_at_the_input_size(size: tuple[int, int]):
    net = Segmenter(num_classes=7, attention=RPC, **TINY).eval()
    images = torch.rand(2, 3, *size)  # (B, C, H, W), not always a multiple of the patch size
    logits = net(images)
    assert logits.shape == (2, 7, *size)
    assert net.forward_masks(torch.rand(1, 3, 32, 48)).shape == (1, 7, 4, 6)  # pos-embed interpolated to 4 x 6


def test_encoder_and_decoder_attention_follow_their_specs():
    net = Segmenter(num_classes=4, attention=RPC, decoder_attention=AttentionSpec(kind="symmetric"), **TINY)
    assert [type(b.attn).__name__ for b in net.vit.blocks] == ["RPCAttention", "SoftmaxAttention"]
    assert not any(isinstance(b.attn, RPCAttention) for b in net.decoder.blocks)
    assert Segmenter(num_classes=4, attention=RPC, **TINY).decoder_attention == RPC  # default: the encoder's
    assert net.decoder.blocks[0].attn.num_heads == 1 and net.decoder.cls_emb.shape == (1, 4, 32)


def test_unknown_arch_is_rejected():
    with pytest.raises(ValueError, match="arch must be one of"):
        Segmenter(arch="vit_huge", **TINY)


def test_init_from_a_classifier_checkpoint_skips_the_head_and_interpolates_pos_embed(tmp_path: Path):
    vit = build_vit("deit_tiny", AttentionSpec(kind="symmetric"), num_classes=10, **{**TINY, "img_size": 16})
    path = tmp_path / "classifier.ckpt"  # a vision-cls checkpoint: the classifier's ViT under net.vit.
    torch.save({"state_dict": {f"net.vit.{k}": v for k, v in vit.state_dict().items()}}, path)
    net = Segmenter(num_classes=5, attention=RPC, init_from=str(path), **TINY)  # 2 x 2 grid -> 4 x 4 grid
    torch.testing.assert_close(net.vit.blocks[0].attn.qkv.weight, vit.blocks[0].attn.qkv.weight)
    assert net.vit.pos_embed.shape == (1, 17, 32)
    with pytest.raises(ValueError, match="shape mismatch") as info:
        Segmenter(num_classes=5, init_from=str(path), **{**TINY, "embed_dim": 64})
    assert "skipped on purpose" in str(info.value) and "head.weight" in str(info.value)
