"""TwicingAttention, NeuTRENOAttention, EllipticalAttention and their earlier values: modules, ViTs, state, compile.

Each module equals its function (and the float64 reference) forward and backward, given the earlier block's values
as arguments; in a ViT, Elliptical's block l uses block l - 1's values and NeuTRENO's every block block 0's (a
hand-run of the blocks), NeuTRENO's gradients reach block 0's ``qkv``; no module holds a tensor after a forward;
checkpoints are DeiT's; ``torch.compile`` and TorchScript match eager.
"""

import copy

import pytest
import timm
import torch

from kpca.attention import (
    AttentionSpec,
    EllipticalAttention,
    NeuTRENOAttention,
    SoftmaxAttention,
    TwicingAttention,
    elliptical_attention,
    index_attention_blocks,
    neutreno_attention,
    softmax_attention,
)
from kpca.attention.errors import AttentionOptionError
from kpca.attention.swap import swap_attention
from kpca.attention.vit import create_vit
from tests.values_per_call import held_tensors

from .helpers import NEUTRENO_LAMBD, ROBUST_FUNCTIONS, ROBUST_REFERENCES

DIM, HEADS, N = 24, 3, 7
TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 3, "num_heads": 2, "num_classes": 5}
KINDS = ("twicing", "neutreno", "elliptical")
FUNCTION, REFERENCE = ROBUST_FUNCTIONS, ROBUST_REFERENCES


def heads(attn: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """q, k, v (B, H, N, D) of an asymmetric module's projection of (B, N, C) ``x``."""
    b, n, _ = x.shape
    return list(attn.qkv(x).view(b, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4))


def merged(attn: torch.nn.Module, out: torch.Tensor) -> torch.Tensor:
    """(B, H, N, D) heads through the module's output projection: (B, N, C)."""
    b, _, n, _ = out.shape
    return attn.proj(out.transpose(1, 2).reshape(b, n, -1))


def pair(kind: str, is_causal: bool = False) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Block 0 (softmax) and block 1 (``kind``) attention in float64, indexed as one stack."""
    first = SoftmaxAttention(DIM, HEADS, qkv_bias=True, is_causal=is_causal).double()
    second = AttentionSpec(kind=kind, lambd=NEUTRENO_LAMBD if kind == "neutreno" else None).build(
        DIM, HEADS, qkv_bias=True, is_causal=is_causal
    )
    index_attention_blocks([first, second.double()])
    return first, second


def second_block(first: torch.nn.Module, second: torch.nn.Module, x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """Block 1's (B, N, C) output on ``x1`` given block 0's values on ``x0``, as a model's loop passes them."""
    values: list[torch.Tensor] = []
    first(x0, values_out=values)  # block 0's (B, H, N, D) values into the list
    return second(x1, first_values=values[0], previous_values=values[0])


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_module_equals_its_function_and_the_reference_forward_and_backward(kind: str, is_causal: bool):
    first, second = pair(kind, is_causal)
    x0, x1 = (torch.randn(2, N, DIM, dtype=torch.float64, requires_grad=True) for _ in range(2))
    weights = torch.randn(2, N, DIM, dtype=torch.float64)
    params = [x0, x1, *first.parameters(), *second.parameters()]

    out = second_block(first, second, x0, x1)  # (B, N, C)
    grads = torch.autograd.grad((out * weights).sum(), params, allow_unused=True)
    for fn in (FUNCTION[kind], REFERENCE[kind]):
        v0 = heads(first, x0)[2]  # block 0's values (B, H, N, D)
        expected = merged(second, fn(*heads(second, x1), v0, is_causal=is_causal))
        torch.testing.assert_close(out, expected)
        expected_grads = torch.autograd.grad((expected * weights).sum(), params, allow_unused=True)
        for got, want in zip(grads, expected_grads, strict=True):
            assert (got is None) == (want is None)
            if got is not None:
                torch.testing.assert_close(got, want)
    reaches_first = grads[2] is not None and grads[2].abs().sum() > 0  # block 0's qkv weight
    assert reaches_first == (kind == "neutreno")  # NeuTRENO's V_1 carries gradients; Elliptical's m none


def test_neutreno_with_lambda_zero_is_softmax_and_its_gradients_reach_only_block_0s_value_rows():
    first, second = pair("neutreno")
    x0, x1 = torch.randn(2, N, DIM, dtype=torch.float64), torch.randn(2, N, DIM, dtype=torch.float64)
    second_block(first, second, x0, x1).sum().backward()
    rows = first.qkv.weight.grad.abs().sum(dim=1)  # (3C,) [Q; K; V]
    assert rows[: 2 * DIM].eq(0).all() and rows[2 * DIM :].gt(0).all()
    off = NeuTRENOAttention(DIM, HEADS, lambd=0.0).double()
    plain = SoftmaxAttention(DIM, HEADS).double()
    plain.load_state_dict(off.state_dict())
    index_attention_blocks([first, off])
    torch.testing.assert_close(second_block(first, off, x0, x1), plain(x1), rtol=0, atol=0)


def test_twicing_refuses_attention_dropout_and_every_module_keeps_deits_parameters():
    with pytest.raises(ValueError, match="TwicingAttention takes no attention dropout, got attn_drop=0.1"):
        TwicingAttention(DIM, HEADS, attn_drop=0.1)
    deit = SoftmaxAttention(DIM, HEADS, qkv_bias=True, gated=True).state_dict()
    for cls in (TwicingAttention, NeuTRENOAttention, EllipticalAttention):
        module = cls(DIM, HEADS, qkv_bias=True, gated=True)
        assert module.state_dict().keys() == deit.keys() and not module.symmetric
        module.load_state_dict(deit)


def test_a_module_reading_earlier_values_called_without_them_or_in_a_loop_that_cannot_pass_them_names_the_fix():
    alone = EllipticalAttention(DIM, HEADS).double()  # a module on its own is block 0: plain softmax attention
    plain = SoftmaxAttention(DIM, HEADS).double()
    plain.load_state_dict(alone.state_dict())
    x = torch.randn(1, N, DIM, dtype=torch.float64)
    assert torch.equal(alone(x), plain(x))
    first, second = pair("neutreno")
    with pytest.raises(ValueError, match=r"attention in block 1 reads the first block's values .* did not pass them"):
        second(x)  # timm's call, no values
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, **TINY)
    with pytest.raises(ValueError, match=r"blocks \[0, 1, 2\] of the ViT have attention that returns no values"):
        index_attention_blocks([*(b.attn for b in vit.blocks), NeuTRENOAttention(32, 2)], owner="the ViT")
    before = {name: type(module) for name, module in vit.named_modules()}
    with pytest.raises(ValueError, match=r"kind 'neutreno' reads earlier blocks' values, which the loop over "):
        swap_attention(vit, AttentionSpec(kind="neutreno"))  # timm's nn.Sequential of blocks cannot pass them
    assert {name: type(module) for name, module in vit.named_modules()} == before  # refused before any change


def vit(kind: str, **kwargs) -> torch.nn.Module:
    """A tiny ViT with ``kind`` attention, in float64, eval mode."""
    torch.manual_seed(0)
    return create_vit("deit_tiny", AttentionSpec(kind=kind, **kwargs), **TINY).double().eval()


def hand_run(model: torch.nn.Module, images: torch.Tensor, kind: str) -> torch.Tensor:
    """``model.forward_features`` block by block with the functions: block 0 softmax, then ``kind`` on the
    previous block's values (elliptical) or block 0's (neutreno)."""
    x = model.norm_pre(model._pos_embed(model.patch_embed(images)))  # (B, N, C)
    values = []
    for i, block in enumerate(model.blocks):
        q, k, v = heads(block.attn, block.norm1(x))  # (B, H, N, D)
        if i == 0:
            out = softmax_attention(q, k, v)
        elif kind == "elliptical":
            out = elliptical_attention(q, k, v, values[-1])
        else:
            out = neutreno_attention(q, k, v, values[0], lambd=NEUTRENO_LAMBD)
        values.append(v)
        x = x + block.ls1(merged(block.attn, out))
        x = x + block.ls2(block.mlp(block.norm2(x)))
    return model.norm(x)


@pytest.mark.parametrize("kind", ["neutreno", "elliptical"])
def test_a_vit_hands_each_block_the_values_its_kind_asks_for(kind: str):
    model = vit(kind)
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    torch.testing.assert_close(model.forward_features(images), hand_run(model, images, kind), rtol=1e-12, atol=1e-12)
    papers = vit(kind, layers=[1, 2])  # the papers' blocks 2 to the last: block 0 is our softmax attention
    assert [type(b.attn) for b in papers.blocks][0] is SoftmaxAttention
    papers.load_state_dict(model.state_dict())
    assert torch.equal(papers(images), model(images))  # "all" is that set: block 0 has no earlier block


def test_neutreno_gradients_reach_block_0s_qkv_through_every_later_block():
    model, softmax = vit("neutreno"), vit("softmax")
    softmax.load_state_dict(model.state_dict())
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    grads = []
    for m in (model, softmax):
        m(images).sum().backward()
        grads.append(m.blocks[0].attn.qkv.weight.grad)
    assert not torch.allclose(grads[0], grads[1])  # the lambda (V_1 - V_l) terms add to block 0's value rows


@pytest.mark.parametrize("kind", KINDS)
def test_nothing_outlives_a_forward_and_checkpoints_are_deits(kind: str):
    model = vit(kind).train()
    fresh = copy.deepcopy(model)
    first, second = torch.randn(2, 3, 32, 32, dtype=torch.float64), torch.randn(2, 3, 32, 32, dtype=torch.float64)
    model(first).sum().backward()
    assert held_tensors(model) == []  # the values of a forward lived in its loop's local variables only
    torch.testing.assert_close(model(second), fresh(second), rtol=0, atol=0)
    deit = timm.create_model("deit_tiny_patch16_224", pretrained=False, **TINY).double()
    assert model.state_dict().keys() == deit.state_dict().keys()
    deit.load_state_dict(model.state_dict())  # and back, strictly
    model.load_state_dict(deit.state_dict())


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_compiled_vit_matches_eager_without_graph_breaks(kind: str):
    torch._dynamo.reset()
    model = vit(kind).float().train()
    images = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    results = []
    for m in (model, compiled):
        model.zero_grad()
        out = m(images)
        out.square().sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    (eager, eager_grads), (comp, comp_grads) = results
    torch.testing.assert_close(comp, eager)
    for got, want in zip(comp_grads, eager_grads, strict=True):
        torch.testing.assert_close(got, want)
    assert held_tensors(model) == []
    torch.testing.assert_close(compiled(images), model(images))  # a second call: the same graph, nothing stale


@pytest.mark.filterwarnings("ignore:`torch\\.jit\\.script` is deprecated")
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("kind", ["neutreno", "elliptical"])
def test_a_scripted_module_reading_earlier_values_equals_eager_forward_and_backward(kind: str, is_causal: bool):
    first, second = pair(kind, is_causal)
    scripted = torch.jit.script(second)
    x0, x1 = torch.randn(2, N, DIM, dtype=torch.float64), torch.randn(2, N, DIM, dtype=torch.float64)
    padding = torch.zeros(2, N, dtype=torch.bool)
    padding[1, -2:] = True
    values: list[torch.Tensor] = []
    first(x0, values_out=values)
    v0 = values[0]  # (B, H, N, D)
    for module in (second, scripted):
        module.zero_grad()
    for _ in range(2):  # the profiling executor's first run, then its optimised graph
        own: list[torch.Tensor] = []
        eager = second(x1, None, False, padding, v0, v0, own)
        got = scripted(x1, None, False, padding, v0, v0)
        torch.testing.assert_close(got, eager, rtol=1e-13, atol=1e-13)
        assert len(own) == 1 and torch.equal(own[0], heads(second, x1)[2])  # its own values, for later blocks
        own.clear()
    grads = [torch.autograd.grad(out.sum(), list(second.parameters())) for out in (eager, got)]
    for got_grad, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got_grad, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(torch.jit.Error, match="attention in block 1 reads the"):
        scripted(x1)
    with pytest.raises(AttentionOptionError, match="does not apply to kind 'elliptical'"):
        AttentionSpec(kind="elliptical", lambd=0.6)
