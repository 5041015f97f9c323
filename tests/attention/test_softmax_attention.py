"""softmax_attention against the materialised reference, with every mask combination."""

import pytest
import torch

from kpca.attention import softmax_attention
from kpca.attention.reference import softmax_attention_reference

from .helpers import outputs_and_grads


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("padded", [False, True])
def test_matches_reference(is_causal, mask_kind, padded):
    b, h, n, d = 2, 3, 6, 4
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    attn_mask = None
    if mask_kind == "bool":
        attn_mask = (torch.rand(n, n) > 0.3) | torch.eye(n, dtype=torch.bool)
    elif mask_kind == "float":
        attn_mask = torch.randn(b, 1, n, n, dtype=torch.float64)
    padding = torch.tensor([[False] * 4 + [True] * 2, [True] + [False] * 5]) if padded else None
    valid = torch.ones(b, 1, n, 1, dtype=torch.float64) if padding is None else (~padding)[:, None, :, None].double()
    kwargs = {"attn_mask": attn_mask, "key_padding_mask": padding, "is_causal": is_causal}

    out, grads = outputs_and_grads(lambda q, k, v: softmax_attention(q, k, v, **kwargs) * valid, q, k, v)
    ref, grads_ref = outputs_and_grads(lambda q, k, v: softmax_attention_reference(q, k, v, **kwargs), q, k, v)
    torch.testing.assert_close(out, ref)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref)


def test_scale_and_symmetric_use():
    k, v = torch.randn(1, 2, 5, 4, dtype=torch.float64), torch.randn(1, 2, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(softmax_attention(k, k, v, scale=0.3), softmax_attention_reference(k, k, v, scale=0.3))
