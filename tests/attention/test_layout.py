"""convert_qkv_rows and is_symmetric_qkv: the [Q;K;V] (asymmetric) and [K;V] (symmetric) qkv row layouts."""

import re

import pytest
import torch

from kpca.attention import convert_qkv_rows, is_symmetric_qkv

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
