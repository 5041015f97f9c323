"""Every bad argument raises ValueError or TypeError naming the value."""

import math

import pytest
import torch

from kpca.attention import AttentionSpec, RPCAttention, SoftmaxAttention, rpc_attention, softmax_attention

K = torch.randn(2, 3, 5, 4)
V = torch.randn(2, 3, 5, 4)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_iter": 0}, ValueError, "n_iter must be >= 1.*got 0"),
        ({"n_iter": -3}, ValueError, "got -3"),
        ({"n_iter": 2.0}, TypeError, "n_iter must be an int"),
        ({"n_iter": True}, TypeError, "n_iter must be an int"),
        ({"lambd": 0.0}, ValueError, "lambd must be a positive finite float.*0.0"),
        ({"lambd": -1.0}, ValueError, "-1.0"),
        ({"lambd": math.inf}, ValueError, "inf"),
        ({"lambd": math.nan}, ValueError, "nan"),
        ({"lambd": "4"}, TypeError, "lambd"),
        ({"convention": "admm"}, ValueError, "convention must be one of.*'admm'"),
        ({"embed_dim": 0}, ValueError, "embed_dim.*0"),
        ({"embed_dim": 12, "convention": "pcp"}, ValueError, "embed_dim=12 only applies"),
        ({"dropout_p": 1.0}, ValueError, r"dropout_p must be a float in \[0, 1\), got 1.0"),
        ({"scale": -1.0}, ValueError, "scale.*-1.0"),
        ({"backend": "cuda"}, ValueError, "backend must be one of.*'cuda'"),
        ({"attn_mask": torch.ones(4, 4, dtype=torch.bool)}, ValueError, r"attn_mask shape \(4, 4\)"),
        ({"attn_mask": torch.ones(5, 5, dtype=torch.int64)}, TypeError, "attn_mask dtype torch.int64"),
        ({"key_padding_mask": torch.zeros(2, 4, dtype=torch.bool)}, ValueError, r"key_padding_mask shape \(2, 4\)"),
        ({"key_padding_mask": torch.zeros(2, 5)}, TypeError, "key_padding_mask must be a bool tensor"),
    ],
)
def test_rpc_attention_rejects(kwargs, error, match):
    args = {"n_iter": 2, "lambd": 4.0, **kwargs}
    with pytest.raises(error, match=match):
        rpc_attention(K, V, **args)


@pytest.mark.parametrize(
    ("k", "v", "error", "match"),
    [
        (K[0], V[0], ValueError, r"k must have rank 4, \(B, H, N, D\), got shape \(3, 5, 4\)"),
        (K, V[:, :, :4], ValueError, r"v shape \(2, 3, 4, 4\) does not match k shape \(2, 3, 5, 4\)"),
        (K, V.double(), TypeError, "v is torch.float64.*k is torch.float32"),
        (K.long(), V, TypeError, "k must be a floating-point tensor"),
        (K.numpy(), V, TypeError, "k must be a torch.Tensor"),
    ],
)
def test_rpc_attention_rejects_tensors(k, v, error, match):
    with pytest.raises(error, match=match):
        rpc_attention(k, v, n_iter=2, lambd=4.0)


def test_softmax_attention_rejects_shapes():
    with pytest.raises(ValueError, match=r"k shape \(2, 2, 5, 4\) does not match q shape"):
        softmax_attention(K, K[:, :2], V)
    with pytest.raises(ValueError, match="dropout_p"):
        softmax_attention(K, K, V, dropout_p=-0.1)


def test_modules_and_spec_reject():
    with pytest.raises(ValueError, match="dim=10 is not divisible by num_heads=3"):
        SoftmaxAttention(10, num_heads=3)
    with pytest.raises(ValueError, match="needs a norm_layer"):
        SoftmaxAttention(12, num_heads=3, qk_norm=True)
    with pytest.raises(ValueError, match="n_iter must be >= 1"):
        RPCAttention(12, num_heads=3, n_iter=0)
    with pytest.raises(ValueError, match="kind must be one of.*'rcp'"):
        AttentionSpec(kind="rcp")
    with pytest.raises(ValueError, match="lambd must be a positive finite float"):
        AttentionSpec(kind="rpc", lambd=-4.0)
    with pytest.raises(ValueError, match="distinct non-negative indices, got \\[0, 0\\]"):
        AttentionSpec(kind="rpc", layers=[0, 0])
    with pytest.raises(ValueError, match="'all' or a list of block indices, got 'first'"):
        AttentionSpec(kind="rpc", layers="first")
    with pytest.raises(ValueError, match=r"layers \[12\] out of range for a model with 12 blocks"):
        AttentionSpec(kind="rpc", layers=[0, 12]).block_indices(12)
