"""The paper's scaled-attention variants against materialised float64 formulas, forward and backward."""

import copy
import math

import pytest
import timm
import torch
from timm.layers import Attention

from kpca.attention import AlphaAsymAttention, AttentionSpec, ScaledAttention, swap_attention

DIM, HEADS, N = 12, 3, 6
D = DIM // HEADS


def _qkv(module, x):
    """(B, H, N, D) q, k, v written out from the module's projection."""
    b, n, _ = x.shape
    q, k, v = module.qkv(x).view(b, n, 3, HEADS, D).permute(2, 0, 3, 1, 4)
    return q, k, v


def _softmax(scores, causal=False, padding=None):
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    if padding is not None:
        scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1)


def _output(module, heads_out):
    b, _, n, _ = heads_out.shape
    return module.proj(heads_out.transpose(1, 2).reshape(b, n, DIM))


def _scaled_s_formula(module, x):
    q, k, v = _qkv(module, x)
    a = _softmax(q @ k.transpose(-2, -1) / math.sqrt(D))  # (B, H, N, N)
    eye = torch.eye(N, dtype=x.dtype)
    return _output(module, a @ (eye - module.s_matrix) @ v)  # A (I − S) V


def _scaled_alpha_formula(module, x, causal=False, padding=None):
    q, k, v = _qkv(module, x)
    a = _softmax(q @ k.transpose(-2, -1) / math.sqrt(D), causal, padding)
    sym = _softmax(k @ k.transpose(-2, -1) / math.sqrt(D), causal, padding)
    eye = torch.eye(x.shape[1], dtype=x.dtype)
    return _output(module, a @ (eye - module.alpha * sym) @ v)  # A (I − α softmax(K Kᵀ/√D)) V


def _randomise(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return module


def _assert_same_outputs_and_grads(module, formula, x, causal=False, padding=None):
    params = [x, *module.parameters()]
    out = module(x, is_causal=causal, key_padding_mask=padding)
    expected = formula(module, x, causal, padding) if causal or padding is not None else formula(module, x)
    if padding is not None:  # padded queries' outputs are unspecified: compare and differentiate valid rows only
        out, expected = out * ~padding[..., None], expected * ~padding[..., None]
    torch.testing.assert_close(out, expected)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), params)
    grads_ref = torch.autograd.grad((expected * weights).sum(), params)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref)


def test_scaled_s_is_a_times_i_minus_s_times_v():
    module = _randomise(ScaledAttention(DIM, HEADS, qkv_bias=True, num_tokens=N, dtype=torch.float64)).eval()
    x = torch.randn(2, N, DIM, dtype=torch.float64, requires_grad=True)
    assert module.s_matrix.shape == (HEADS, N, N)
    _assert_same_outputs_and_grads(module, _scaled_s_formula, x)


def test_scaled_alpha_is_a_times_i_minus_alpha_symmetric_softmax_times_v():
    module = _randomise(AlphaAsymAttention(DIM, HEADS, qkv_bias=True, dtype=torch.float64)).eval()
    x = torch.randn(2, N, DIM, dtype=torch.float64, requires_grad=True)
    assert module.alpha.shape == () and module.alpha.item() != 0
    _assert_same_outputs_and_grads(module, _scaled_alpha_formula, x)


def test_scaled_alpha_is_causal_and_padding_safe():
    module = _randomise(AlphaAsymAttention(DIM, HEADS, dtype=torch.float64)).eval()
    x = torch.randn(2, N, DIM, dtype=torch.float64, requires_grad=True)
    _assert_same_outputs_and_grads(module, _scaled_alpha_formula, x, causal=True)
    padding = torch.zeros(2, N, dtype=torch.bool)
    padding[0, 4:] = True
    _assert_same_outputs_and_grads(module, _scaled_alpha_formula, x, padding=padding)


@pytest.mark.parametrize("cls", [ScaledAttention, AlphaAsymAttention])
def test_variants_start_as_timm_attention_with_its_parameter_names(cls):
    timm_attn = Attention(DIM, HEADS, qkv_bias=True).eval()
    kwargs = {"num_tokens": N} if cls is ScaledAttention else {}
    ours = cls(DIM, HEADS, qkv_bias=True, **kwargs).eval()
    extra = "s_matrix" if cls is ScaledAttention else "alpha"
    assert ours.state_dict().keys() - {extra} == timm_attn.state_dict().keys()
    ours.load_state_dict({**timm_attn.state_dict(), extra: torch.zeros_like(getattr(ours, extra))})
    x = torch.randn(2, N, DIM)
    torch.testing.assert_close(ours(x), timm_attn(x))


def test_scaled_s_refuses_causal_padding_and_other_lengths():
    module = ScaledAttention(DIM, HEADS, num_tokens=N)
    x = torch.randn(1, N, DIM)
    with pytest.raises(ValueError, match="cannot be causal.*scaled_alpha"):
        module(x, is_causal=True)
    with pytest.raises(ValueError, match="key_padding_mask"):
        module(x, key_padding_mask=torch.zeros(1, N, dtype=torch.bool))
    with pytest.raises(ValueError, match=f"num_tokens={N} but got N=4"):
        module(torch.randn(1, 4, DIM))
    with pytest.raises(ValueError, match="cannot be causal"):
        ScaledAttention(DIM, HEADS, num_tokens=N, is_causal=True)
    with pytest.raises(ValueError, match="num_tokens must be a positive int"):
        ScaledAttention(DIM, HEADS, num_tokens=0)


@pytest.mark.parametrize(("kind", "cls"), [("scaled_s", ScaledAttention), ("scaled_alpha", AlphaAsymAttention)])
def test_swap_into_a_timm_vit_keeps_the_function_and_trains_the_new_parameter(kind, cls):
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=5)
    vit.eval()
    swapped = copy.deepcopy(vit)
    swaps = swap_attention(swapped, AttentionSpec(kind=kind, layers=[0, 2]))
    assert [(s.block, s.after, s.weights) for s in swaps] == [(0, cls.__name__, "all"), (2, cls.__name__, "all")]
    assert type(swapped.blocks[1].attn) is type(vit.blocks[1].attn)  # the other blocks are left as they are
    if kind == "scaled_s":
        assert swapped.blocks[0].attn.num_tokens == 17  # 16 patches + the class token, read from the ViT
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(swapped(images), vit(images))
    swapped(images).square().sum().backward()
    new = swapped.blocks[0].attn.s_matrix if kind == "scaled_s" else swapped.blocks[0].attn.alpha
    assert new.grad is not None and new.grad.abs().sum() > 0


def test_spec_errors_name_the_fix():
    with pytest.raises(ValueError, match="needs num_tokens"):
        AttentionSpec(kind="scaled_s").build(DIM, HEADS)
    with pytest.raises(ValueError, match="num_tokens must be a positive int or None"):
        AttentionSpec(kind="scaled_s", num_tokens=-3)
    model = torch.nn.Module()  # ViT-like blocks, but no patch_embed to read N from
    model.blocks = torch.nn.ModuleList([torch.nn.Module()])
    model.blocks[0].attn = Attention(DIM, HEADS)
    with pytest.raises(ValueError, match="set AttentionSpec.num_tokens"):
        swap_attention(model, AttentionSpec(kind="scaled_s"))
