"""kpca.attention.layout: the [Q;K;V] (asymmetric) and [K;V] (symmetric) qkv row layouts, and asking a layer."""

import re

import pytest
import torch
from timm.layers import Attention
from torch import nn

from kpca.attention import AttentionSpec, RPCAttention, SoftmaxAttention, convert_qkv_rows, is_symmetric_qkv
from kpca.attention.layout import attention_dim, has_symmetric_qkv, is_attention_layer, split_qkv

A = 6  # attn_dim


def qkv_rows(n_blocks: int, bias: bool) -> torch.Tensor:
    """A (n_blocks * A, 5) weight or (n_blocks * A,) bias whose every entry is distinct."""
    shape = (n_blocks * A,) if bias else (n_blocks * A, 5)
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(shape)


@pytest.mark.parametrize("bias", [False, True], ids=["weight", "bias"])
def test_asymmetric_to_symmetric_drops_the_q_rows(bias):
    rows = qkv_rows(3, bias)  # [Q;K;V]
    out = convert_qkv_rows(rows, A, symmetric=True)
    assert out.shape == (2 * A, *rows.shape[1:])
    torch.testing.assert_close(out, rows[A:])
    assert is_symmetric_qkv(out, A) and not is_symmetric_qkv(rows, A)


@pytest.mark.parametrize("bias", [False, True], ids=["weight", "bias"])
def test_symmetric_to_asymmetric_copies_k_into_q(bias):
    rows = qkv_rows(2, bias)  # [K;V]
    out = convert_qkv_rows(rows, A, symmetric=False)
    assert out.shape == (3 * A, *rows.shape[1:])
    torch.testing.assert_close(out[:A], rows[:A])
    torch.testing.assert_close(out[A:], rows)


@pytest.mark.parametrize(("n_blocks", "symmetric"), [(3, False), (2, True)])
@pytest.mark.parametrize("bias", [False, True], ids=["weight", "bias"])
def test_same_layout_is_returned_unchanged(n_blocks, symmetric, bias):
    rows = qkv_rows(n_blocks, bias)
    assert convert_qkv_rows(rows, A, symmetric) is rows


@pytest.mark.parametrize("bias", [False, True], ids=["weight", "bias"])
def test_round_trip_keeps_k_and_v_and_sets_q_to_k(bias):
    rows = qkv_rows(3, bias)
    back = convert_qkv_rows(convert_qkv_rows(rows, A, symmetric=True), A, symmetric=False)
    torch.testing.assert_close(back[:A], rows[A : 2 * A])  # Q == K
    torch.testing.assert_close(back[A:], rows[A:])


@pytest.mark.parametrize(("shape", "attn_dim"), [((4 * A, 5), A), ((A,), A), ((12,), 0)])
def test_other_row_counts_name_shape_attn_dim_and_the_layouts(shape, attn_dim):
    message = re.escape(f"shape {tuple(shape)}") + rf".*attn_dim={attn_dim}.*\[Q;K;V\].*\[K;V\]"
    for fn in (lambda r: convert_qkv_rows(r, attn_dim, True), lambda r: is_symmetric_qkv(r, attn_dim)):
        with pytest.raises(ValueError, match=message):
            fn(torch.zeros(shape))


@pytest.mark.parametrize("symmetric", [False, True], ids=["QKV", "KV"])
def test_split_qkv_takes_each_head_from_its_columns(symmetric):
    heads, head_dim, attn_dim = 2, 3, 6
    n_blocks = 2 if symmetric else 3
    projected = torch.arange(2 * 4 * n_blocks * attn_dim, dtype=torch.float32).view(2, 4, n_blocks * attn_dim)

    def head(block: int, h: int) -> torch.Tensor:  # (B, N, D): columns of head h in block (Q, K or V) ``block``
        start = block * attn_dim + h * head_dim
        return projected[:, :, start : start + head_dim]

    q, k, v = split_qkv(projected, heads, head_dim)
    assert (q is None) == symmetric and k.shape == v.shape == (2, heads, 4, head_dim)
    for h in range(heads):
        assert torch.equal(k[:, h], head(n_blocks - 2, h)) and torch.equal(v[:, h], head(n_blocks - 1, h))
        if not symmetric:
            assert torch.equal(q[:, h], head(0, h))


def test_split_qkv_names_a_width_that_fits_no_layout():
    with pytest.raises(ValueError, match=re.escape("shape (1, 5, 24) fits no layout for num_heads=2, head_dim=3")):
        split_qkv(torch.zeros(1, 5, 24), 2, 3)


def test_the_layout_is_asked_of_the_layer_not_guessed_from_the_row_count():
    symvit_tiny = SoftmaxAttention(192, 3, symmetric=True)  # [K;V] of width 192: 384 rows
    narrow = SoftmaxAttention(128, 2)  # [Q;K;V] of width 128: 384 rows too
    assert symvit_tiny.qkv.out_features == narrow.qkv.out_features == 384
    assert has_symmetric_qkv(symvit_tiny) and attention_dim(symvit_tiny) == 192
    assert not has_symmetric_qkv(narrow) and attention_dim(narrow) == 128


@pytest.mark.parametrize(
    ("layer", "symmetric"),
    [
        (Attention(24, 3), False),
        (SoftmaxAttention(24, 3), False),
        (SoftmaxAttention(24, 3, symmetric=True), True),
        (RPCAttention(24, 3), True),
        (AttentionSpec(kind="scaled_alpha").build(24, 3), False),
    ],
    ids=["timm", "softmax", "symmetric", "rpc", "scaled_alpha"],
)
def test_attention_layers_report_their_layout(layer, symmetric):
    assert is_attention_layer(layer) and attention_dim(layer) == 24
    assert has_symmetric_qkv(layer) == symmetric


def test_other_modules_are_no_attention_layers():
    assert not is_attention_layer(nn.Linear(4, 4))
    odd = SoftmaxAttention(24, 3)
    odd.qkv = nn.Linear(24, 4 * 24)  # four blocks of rows: no layout
    assert not is_attention_layer(odd)
