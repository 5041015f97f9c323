"""SoftmaxAttention and RPCAttention: timm parity, state_dict round trips, masks, state recording."""

import pytest
import torch
from timm.layers import Attention
from torch import nn

from kpca.attention import RPCAttention, SoftmaxAttention, rpc_attention, softmax_attention

DIM, HEADS = 24, 3


def test_asymmetric_matches_timm_attention():
    timm_attn = Attention(DIM, HEADS, qkv_bias=True, qk_norm=True, scale_norm=True, norm_layer=nn.LayerNorm).eval()
    ours = SoftmaxAttention(DIM, HEADS, qkv_bias=True, qk_norm=True, scale_norm=True, norm_layer=nn.LayerNorm).eval()
    assert ours.state_dict().keys() == timm_attn.state_dict().keys()
    ours.load_state_dict(timm_attn.state_dict())
    x = torch.randn(2, 7, DIM)
    mask = torch.rand(2, 1, 7, 7) > 0.2
    torch.testing.assert_close(ours(x), timm_attn(x))
    torch.testing.assert_close(ours(x, attn_mask=mask), timm_attn(x, attn_mask=mask))
    torch.testing.assert_close(ours(x, is_causal=True), timm_attn(x, is_causal=True))


def test_symmetric_projection_and_forward():
    attn = SoftmaxAttention(DIM, HEADS, qkv_bias=True, symmetric=True).eval()
    assert attn.qkv.weight.shape == (2 * DIM, DIM) and attn.symmetric
    x = torch.randn(2, 7, DIM)
    k, v = attn.qkv(x).view(2, 7, 2, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)  # (2, B, H, N, D)
    expected = attn.proj(softmax_attention(k, k, v).transpose(1, 2).reshape(2, 7, DIM))
    torch.testing.assert_close(attn(x), expected)


def test_rpc_module_computes_rpc_attention_and_adds_no_parameters():
    sym = SoftmaxAttention(DIM, HEADS, qkv_bias=True, symmetric=True)
    rpc = RPCAttention(DIM, HEADS, qkv_bias=True, n_iter=3, lambd=4.0).eval()
    assert rpc.state_dict().keys() == sym.state_dict().keys()
    rpc.load_state_dict(sym.state_dict())
    sym.load_state_dict(rpc.state_dict())
    x = torch.randn(2, 7, DIM)
    k, v = rpc.qkv(x).view(2, 7, 2, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)  # (2, B, H, N, D)
    out = rpc_attention(k, v, n_iter=3, lambd=4.0)  # mu uses C = H * D = DIM by default
    torch.testing.assert_close(rpc(x), rpc.proj(out.transpose(1, 2).reshape(2, 7, DIM)))


@pytest.mark.parametrize("cls", [SoftmaxAttention, RPCAttention])
def test_state_dict_round_trip(cls, tmp_path):
    module = cls(DIM, HEADS, qkv_bias=True, gated=True)
    path = tmp_path / "attn.pt"
    torch.save(module.state_dict(), path)
    restored = cls(DIM, HEADS, qkv_bias=True, gated=True)
    restored.load_state_dict(torch.load(path, weights_only=True))
    x = torch.randn(1, 5, DIM)
    torch.testing.assert_close(restored.eval()(x), module.eval()(x))


def test_rpc_records_state_and_is_causal():
    rpc = RPCAttention(DIM, HEADS, n_iter=2, is_causal=True).eval()
    x = torch.randn(1, 6, DIM)
    assert rpc.last_state is None
    rpc.record_state = True
    out = rpc(x)
    assert rpc.last_state.residual.shape == (2, 1, HEADS)
    assert rpc.last_state.mu.shape == (1, HEADS, 6, 1)  # causal: one mu per position
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, DIM)
    torch.testing.assert_close(rpc(x2)[:, :4], out[:, :4])
    assert "n_iter=2" in repr(rpc)


def test_key_padding_mask_in_modules():
    rpc = RPCAttention(DIM, HEADS, n_iter=2).eval()
    x = torch.randn(1, 5, DIM)
    padded = torch.cat([x, 30 * torch.randn(1, 3, DIM)], 1)
    padding = torch.tensor([[False] * 5 + [True] * 3])
    torch.testing.assert_close(rpc(padded, key_padding_mask=padding)[:, :5], rpc(x))


def test_dropout_only_in_training():
    rpc = RPCAttention(DIM, HEADS, attn_drop=0.5)
    x = torch.randn(2, 9, DIM)
    rpc.eval()
    torch.testing.assert_close(rpc(x), rpc(x))
    rpc.train()
    assert not torch.allclose(rpc(x), rpc(x))
