"""timm's own model checks on the project's registered ViTs: forward, backward, features, TorchScript, torch.fx.

Mirrors the tests of timm's ``tests/test_models.py`` that its ViTs run (huggingface/pytorch-image-models at commit
aa4b5850c1543fa488abf260f18390eda46cf85d; the timm these tests run is the one pinned in
``requirements/constraints.txt``), on every name ``kpca.attention.vit`` registers, treated as timm treats its own
ViTs (``deit*``), with timm's ``deit_tiny_patch16_224`` as the control that passes them in timm:

- ``test_model_forward``: the output has the batch and no NaN, and is the same with ``set_grad_checkpointing()``.
- ``test_model_backward``: every parameter gets a gradient.
- ``test_model_default_cfgs`` (timm's ``_non_std`` form, which timm runs on its ViTs by name, ``deit*``, ``vit_*``):
  features, pre-logits and pooled widths, a model without classifier, the cfg's classifier and first conv.
- ``test_model_forward_features`` / ``test_model_forward_intermediates``: ``features_only`` models and
  ``forward_intermediates`` give timm's shapes, the last intermediate is ``forward_features``' (before its norm),
  and gradient checkpointing changes nothing.
- ``test_model_forward_torchscript``: ``torch.jit.script`` of the model built under ``set_scriptable(True)``, run
  in eval mode. Here its output also equals the eager output, its gradients equal eager's on every call (the
  scripted attention differentiates plain ops), and it saves and loads (no Python left in it).
- ``test_model_forward_fx``: the model traced by timm's ``_create_fx_model`` (torchvision's feature extractor with
  timm's no-trace modules and functions) gives exactly the eager output.
- ``test_model_backward_fx``: the traced model in train mode gives every parameter a gradient; here equal to eager's.
- ``test_model_forward_fx_torchscript``: the traced model, scripted, runs; here its output equals the eager output.

and ``torch.export`` (not in timm's file) gives the eager output. The models are the registered names at the size of
timm's ``test_vit`` (32 px, patch 8, width 32, 2 blocks, 2 heads), which holds every attention kind: RPC in block 0
and symmetric in block 1 (``rpc_symvit``), symmetric (``symvit``), and the scaled kinds, whose S and α are
randomised here so that they count; Twicing, NeuTRENO and Elliptical in both blocks (NeuTRENO and Elliptical in block
1 read block 0's values, which the model's loop passes: the scripted, traced and exported graphs carry them as
edges). One real-size model runs the same checks (``slow``).
"""

import pytest
import timm
import torch
from timm.models import get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import NodePathTracer, create_feature_extractor, get_graph_node_names

from kpca.attention import RPCAttention, ScaledAttention, _calls
from kpca.attention.spec import kinds, registered_kind
from kpca.attention.vit import ARCHS, TIMM_DEIT, model_name

# torch deprecates TorchScript (a DeprecationWarning in 2.11, a FutureWarning in 2.14); these tests check that the
# models still script, as timm's do.
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:`torch\\.jit\\.(script|save|load)` is deprecated:{category}")
    for category in ("DeprecationWarning", "FutureWarning")
]

OURS = [kind for kind in kinds() if registered_kind(kind).vit_family != TIMM_DEIT]  # softmax: timm's own DeiT
REGISTERED = [model_name(arch, kind) for kind in OURS for arch in ARCHS]
NAMES = ["deit_tiny_patch16_224", *REGISTERED]
TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
_CALLS = 2 + torch._C._jit_get_num_profiled_runs()
"""Runs of a scripted model per check: the executor profiles the first, then runs an optimised graph."""


def _create_fx_model(model: torch.nn.Module, train: bool = False) -> torch.nn.Module:
    """timm's ``_create_fx_model`` (tests/test_models.py, Apache-2.0): the traced model returning its last node."""
    tracer_kwargs = {
        "leaf_modules": get_notrace_modules(),
        "autowrap_functions": get_notrace_functions(),
        "param_shapes_constant": True,
    }
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    eval_return_nodes = [eval_nodes[-1]]
    train_return_nodes = [train_nodes[-1]]
    if train:
        graph = NodePathTracer(**tracer_kwargs).trace(model)
        graph_nodes = list(reversed(graph.nodes))
        output_node_names = [n.name for n in graph_nodes[0]._input_nodes]
        graph_node_names = [n.name for n in graph_nodes]
        output_node_indices = [-graph_node_names.index(node_name) for node_name in output_node_names]
        train_return_nodes = [train_nodes[ix] for ix in output_node_indices]
    return create_feature_extractor(
        model, train_return_nodes=train_return_nodes, eval_return_nodes=eval_return_nodes, tracer_kwargs=tracer_kwargs
    )


def _model(name: str, scriptable: bool = False, **kwargs) -> torch.nn.Module:
    """The registered model ``name`` at the tiny size, its scaled-attention parameters randomised."""
    with timm.set_scriptable(scriptable):
        model = timm.create_model(name, pretrained=False, **{**TINY, **kwargs})
    for param_name, param in model.named_parameters():
        if param_name.endswith((".s_matrix", ".alpha")):
            torch.nn.init.normal_(param, std=0.1)
    return model


def _fx_output(fx_model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    return torch.cat(tuple(fx_model(images).values()))


def _grads(model: torch.nn.Module, out: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradient of every parameter of ``model`` for the loss ``out.mean()``."""
    named = dict(model.named_parameters())
    return dict(zip(named, torch.autograd.grad(out.mean(), list(named.values())), strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_model_forward(name: str):
    model = _model(name).eval()
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        out = model(images)
        model.set_grad_checkpointing()
        checkpointed = model(images)
    assert out.shape[0] == 1 and not torch.isnan(out).any()
    assert torch.equal(checkpointed, out)  # timm: allclose(rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_model_backward(name: str):
    model = _model(name, num_classes=42).train()
    out = model(torch.randn(2, 3, 32, 32))
    out.mean().backward()
    assert out.shape == (2, 42) and not torch.isnan(out).any()
    missing = [param_name for param_name, param in model.named_parameters() if param.grad is None]
    assert missing == []


@pytest.mark.parametrize("name", NAMES)
def test_model_default_cfgs(name: str):
    model = _model(name).eval()  # timm's test_model_default_cfgs_non_std, the form it runs on its ViTs
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        features = model.forward_features(images)  # (B, 1 + N, C)
        pre_logits = model.forward_head(features, pre_logits=True)
        assert features.shape[-1] == model.num_features and pre_logits.shape[1] == model.head_hidden_size
        model.reset_classifier(0)
        assert model.num_classes == 0 and model(images).shape == pre_logits.shape
        assert _model(name, num_classes=0).eval()(images).shape[-1] == model.num_features
    cfg, state = model.default_cfg, model.state_dict()
    assert f"{cfg['classifier']}.weight" in _model(name).state_dict() and f"{cfg['first_conv']}.weight" in state


@pytest.mark.parametrize("name", NAMES)
def test_model_forward_features(name: str):
    model = _model(name, depth=3, features_only=True).eval()  # FeatureGetterNet (forward_intermediates), last 3
    channels, reductions = model.feature_info.channels(), model.feature_info.reduction()
    features = model(torch.randn(1, 3, 32, 32))
    assert len(features) == len(channels) >= 3
    for out, width, reduction in zip(features, channels, reductions, strict=True):
        assert out.shape == (1, width, 32 // reduction, 32 // reduction) and not torch.isnan(out).any()


@pytest.mark.parametrize("name", NAMES)
def test_model_forward_intermediates(name: str):
    model = _model(name).eval()
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        final, intermediates = model.forward_intermediates(images, output_fmt="NCHW")
        assert torch.equal(final, model.forward_features(images))
        assert [tuple(y.shape) for y in intermediates] == [(1, 32, 4, 4)] * TINY["depth"]
        ((tokens, prefix),) = model.forward_intermediates(
            images, indices=[1], output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True
        )  # (B, N, C), (B, 1, C) of the last block
        assert torch.equal(model.norm(torch.cat([prefix, tokens], dim=1)), final)
        model.set_grad_checkpointing()
        again, _ = model.forward_intermediates(images, output_fmt="NCHW")
    assert torch.equal(again, final)


@pytest.mark.parametrize("name", NAMES)
def test_model_forward_torchscript(name: str, tmp_path):
    model = _model(name, scriptable=True).eval()
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = model(images)
        scripted = torch.jit.script(model)
        outputs = [scripted(images) for _ in range(_CALLS)]
        torch.jit.save(scripted, tmp_path / "model.pt")
        loaded = torch.jit.load(tmp_path / "model.pt")(images)
    assert outputs[0].shape[0] == 1 and not torch.isnan(outputs[0]).any()
    for out in [*outputs, loaded]:
        torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("name", NAMES)
def test_model_backward_torchscript(name: str):
    model = _model(name, num_classes=42).train()
    images = torch.randn(2, 3, 32, 32)
    expected = _grads(model, model(images))
    scripted = torch.jit.script(model)
    for _ in range(_CALLS):
        for param_name, grad in _grads(scripted, scripted(images)).items():
            torch.testing.assert_close(grad, expected[param_name], msg=lambda m, p=param_name: f"{p}: {m}")


@pytest.mark.parametrize("name", NAMES)
def test_model_forward_fx(name: str):
    model = _model(name).eval()
    images = torch.randn(1, 3, 32, 32)
    with torch.inference_mode():
        expected = model(images)
        out = _fx_output(_create_fx_model(model), images)
    assert torch.equal(out, expected)  # timm: torch.all(fx_outputs == outputs)
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("name", NAMES)
def test_model_backward_fx(name: str):
    model = _model(name, num_classes=42).train()
    images = torch.randn(2, 3, 32, 32)
    expected = _grads(model, model(images))
    fx_model = _create_fx_model(model, train=True)
    out = _fx_output(fx_model, images)
    out.mean().backward()
    assert out.shape[-1] == 42 and not torch.isnan(out).any()
    grads = {param_name: param.grad for param_name, param in fx_model.named_parameters()}
    assert grads.keys() == expected.keys() and all(grad is not None for grad in grads.values())
    for param_name, grad in grads.items():
        torch.testing.assert_close(grad, expected[param_name], msg=lambda m, p=param_name: f"{p}: {m}")


@pytest.mark.parametrize("name", NAMES)
def test_model_forward_fx_torchscript(name: str):
    model = _model(name, scriptable=True).eval()
    images = torch.randn(1, 3, 32, 32)
    scripted = torch.jit.script(_create_fx_model(model))
    with torch.inference_mode():
        expected = model(images)
        outputs = [_fx_output(scripted, images) for _ in range(_CALLS)]
    for out in outputs:
        torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("name", NAMES)
def test_model_export(name: str):
    model = _model(name).eval()
    images = torch.randn(1, 3, 32, 32)
    exported = torch.export.export(model, (images,))
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(images), model(images))


def test_a_trace_records_each_attention_call_as_one_node():
    model = _model("rpc_symvit_tiny_patch16_224").eval()  # RPC in block 0, symmetric in block 1
    graph = _create_fx_model(model).graph
    calls = [node.target for node in graph.nodes if getattr(node.target, "__module__", None) == _calls.__name__]
    assert calls == [_calls.rpc_call, _calls.softmax_call]  # each runs the eager function: checks, backends


def test_tracing_a_recording_rpc_layer_names_the_fix():
    model = _model("rpc_symvit_tiny_patch16_224").eval()
    rpc = model.blocks[0].attn
    assert isinstance(rpc, RPCAttention)
    rpc.record_state = True
    with pytest.raises(ValueError, match="set record_state = False before tracing"):
        torch.fx.symbolic_trace(model)


def test_traced_and_scripted_scaled_attention_check_the_sequence_length_when_run():
    attn = ScaledAttention(32, 2, num_tokens=17).eval()
    short = torch.randn(1, 16, 32)  # (B, N, C), N = 16
    traced = torch.fx.symbolic_trace(attn)  # the check is in the graph's node and runs on the real tensors
    with pytest.raises(ValueError, match="built for num_tokens=17 but got N=16 tokens"):
        traced(short)
    with pytest.raises(torch.jit.Error, match="built for num_tokens=17 but got N=16 tokens"):
        torch.jit.script(attn)(short)


@pytest.mark.slow
def test_a_real_size_model_scripts_and_traces():
    with timm.set_scriptable(True):
        model = timm.create_model("rpc_symvit_tiny_patch16_224", pretrained=False).eval()  # 224 px, 12 blocks
    images = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = model(images)
        scripted = torch.jit.script(model)
        for _ in range(_CALLS):
            torch.testing.assert_close(scripted(images), expected)
        assert torch.equal(_fx_output(_create_fx_model(model), images), expected)
        torch.testing.assert_close(_fx_output(torch.jit.script(_create_fx_model(model)), images), expected)
