"""swap_attention on tiny timm Vision Transformers (pretrained=False)."""

import pytest
import timm
import torch

from kpca.attention import AttentionSpec, RPCAttention, SoftmaxAttention, swap_attention


def tiny_vit(**kwargs):
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=48, depth=4,
        num_heads=3, num_classes=5, **kwargs,
    ).eval()  # fmt: skip


def test_symmetric_from_asymmetric_keeps_k_and_v_rows():
    model = tiny_vit()
    old_qkv = model.blocks[1].attn.qkv.weight.detach().clone()
    swaps = swap_attention(model, AttentionSpec(kind="symmetric"))
    assert [s.block for s in swaps] == [0, 1, 2, 3]
    assert swaps[1].before == "Attention" and swaps[1].after == "SoftmaxAttention"
    assert swaps[1].weights == "K, V kept; Q dropped"
    new = model.blocks[1].attn
    assert new.symmetric and isinstance(new, SoftmaxAttention)
    torch.testing.assert_close(new.qkv.weight, old_qkv[48:])
    assert torch.isfinite(model(torch.randn(2, 3, 32, 32))).all()


def test_rpc_in_chosen_blocks_others_symmetric_and_checkpoint_moves():
    model = tiny_vit()
    swap_attention(model, AttentionSpec(kind="symmetric"))
    sym_state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 32, 32)
    sym_out = model(x)
    swaps = swap_attention(model, AttentionSpec(kind="rpc", n_iter=4, lambd=4.0, layers=[0, 2]))
    assert [type(b.attn).__name__ for b in model.blocks] == ["RPCAttention", "SoftmaxAttention"] * 2
    assert all(s.weights == "all" for s in swaps)
    assert model.blocks[0].attn.n_iter == 4
    assert model.state_dict().keys() == sym_state.keys()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, sym_state[key])
    rpc_out = model(x)
    assert not torch.allclose(rpc_out, sym_out)
    # and back: an RPC checkpoint loads strictly into a SymViT and reproduces the SymViT.
    swap_attention(model, AttentionSpec(kind="symmetric"))
    torch.testing.assert_close(model(x), sym_out)


def test_asymmetric_from_symmetric_initialises_q_from_k():
    model = tiny_vit()
    swap_attention(model, AttentionSpec(kind="symmetric"))
    x = torch.randn(2, 3, 32, 32)
    sym_out = model(x)
    swaps = swap_attention(model, AttentionSpec(kind="softmax", layers=[1]))
    assert [s.block for s in swaps] == [1] and swaps[0].weights == "K, V kept; Q initialised from K"
    assert not model.blocks[1].attn.symmetric and model.blocks[0].attn.symmetric
    torch.testing.assert_close(model(x), sym_out)


def test_training_mode_dtype_and_dropout_carried():
    model = tiny_vit(attn_drop_rate=0.1).double().train()
    swap_attention(model, AttentionSpec(kind="rpc", layers=[3]))
    attn = model.blocks[3].attn
    assert isinstance(attn, RPCAttention) and attn.training
    assert attn.qkv.weight.dtype == torch.float64 and attn.attn_drop.p == 0.1


def test_rejects_models_without_blocks():
    with pytest.raises(TypeError, match="needs a timm VisionTransformer-like model with .blocks"):
        swap_attention(torch.nn.Linear(2, 2), AttentionSpec())
    with pytest.raises(ValueError, match=r"layers \[7\] out of range for a model with 4 blocks"):
        swap_attention(tiny_vit(), AttentionSpec(kind="rpc", layers=[7]))
