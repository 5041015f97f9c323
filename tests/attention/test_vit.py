"""kpca.attention.vit: create_vit, the timm registry entries, the pretrained filter and load_vit_state_dict."""

import re
from pathlib import Path

import pytest
import timm
import torch

from kpca.attention import (
    AlphaAsymAttention,
    AttentionSpec,
    RPCAttention,
    ScaledAttention,
    SoftmaxAttention,
    register_attention_kind,
)
from kpca.attention import spec as spec_module
from kpca.attention.errors import AttentionOptionError
from kpca.attention.vit import check_vit_sizes, create_vit, load_vit_state_dict, model_name

from .helpers import assert_vit_holds

TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
SHALLOW = {"img_size": 32, "depth": 2}  # DeiT's width and heads, 2 blocks on 2 x 2 patches: fast at any width


def test_names_follow_timm():
    assert model_name("deit_small", "softmax") == "deit_small_patch16_224"  # timm's own DeiT
    assert model_name("deit_base", "rpc") == "rpc_symvit_base_patch16_224"
    assert model_name("deit_tiny", "scaled_alpha") == "deit_scaled_alpha_tiny_patch16_224"


def _plain(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> torch.nn.Module:
    return SoftmaxAttention(dim, num_heads, backend=spec.backend, **kwargs)


def test_a_registered_kind_names_and_builds_its_vits(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(spec_module, "_REGISTRY", dict(spec_module._REGISTRY))
    register_attention_kind("plain", others="symmetric", vit_defaults={"layers": [1]})(_plain)  # the one registration
    assert model_name("deit_tiny", "plain") == "deit_plain_tiny_patch16_224"
    assert spec_module.registered_kind("plain").vit_attention() == AttentionSpec(kind="plain", layers=[1])
    vit = create_vit("deit_tiny", AttentionSpec(kind="plain", layers=[0]), **SHALLOW)
    assert [type(b.attn) for b in vit.blocks] == [SoftmaxAttention, SoftmaxAttention]
    assert [b.attn.symmetric for b in vit.blocks] == [False, True]  # block 1: the registered others
    with pytest.raises(ValueError, match="vit_family='symvit' for kind 'twin' names the ViTs of kind 'symmetric'"):
        register_attention_kind("twin", vit_family="symvit")(_plain)
    with pytest.raises(ValueError, match="n_iter does not apply to kind 'broken'"):
        register_attention_kind("broken", vit_defaults={"n_iter": 4})(_plain)
    assert "twin" not in spec_module.kinds() and "broken" not in spec_module.kinds()
    with pytest.raises(ValueError, match="AttentionSpec.kind must be one of .*, got 'other'"):
        model_name("deit_tiny", "other")


@pytest.mark.parametrize(
    ("kind", "first", "rest"),
    [
        ("softmax", timm.layers.Attention, timm.layers.Attention),
        ("symmetric", SoftmaxAttention, SoftmaxAttention),
        ("rpc", RPCAttention, SoftmaxAttention),
        ("scaled_s", ScaledAttention, ScaledAttention),
        ("scaled_alpha", AlphaAsymAttention, AlphaAsymAttention),
    ],
)
def test_create_vit_has_deits_size_and_the_attention_asked_for(kind, first, rest):
    with torch.device("meta"):  # construction only: full-size shapes without initialising weights
        vit = create_vit("deit_small", AttentionSpec(kind=kind, layers=[0] if kind == "rpc" else "all"))
    assert (vit.embed_dim, len(vit.blocks), vit.blocks[0].attn.num_heads) == (384, 12, 6)
    assert vit.patch_embed.patch_size == (16, 16) and vit.num_classes == 1000
    assert type(vit.blocks[0].attn) is first and all(type(b.attn) is rest for b in vit.blocks[1:])


def test_create_vit_drops_none_overrides_and_names_a_bad_arch():
    vit = create_vit("deit_tiny", embed_dim=None, depth=2, img_size=32, num_classes=3)
    assert (vit.embed_dim, len(vit.blocks), vit.num_classes) == (192, 2, 3)
    message = "arch='deit_huge' is not one of 'deit_tiny', 'deit_small', 'deit_base'; choose one of DeiT's sizes."
    with pytest.raises(ValueError, match=re.escape(message)):
        create_vit("deit_huge")


@pytest.mark.parametrize(
    ("name", "first", "rest"),
    [
        ("symvit_tiny_patch16_224", SoftmaxAttention, SoftmaxAttention),
        ("rpc_symvit_tiny_patch16_224", RPCAttention, SoftmaxAttention),
        ("deit_scaled_s_tiny_patch16_224", ScaledAttention, ScaledAttention),
        ("deit_scaled_alpha_tiny_patch16_224", AlphaAsymAttention, AlphaAsymAttention),
    ],
)
def test_registered_models_have_their_attention(name, first, rest):
    assert name in timm.list_models()
    vit = timm.create_model(name, **TINY, num_classes=5)
    assert type(vit.blocks[0].attn) is first and type(vit.blocks[1].attn) is rest
    if "symvit" in name:
        assert vit.blocks[1].attn.symmetric


def test_registered_models_take_attention_overrides_but_not_another_kind():
    tuned = timm.create_model("rpc_symvit_tiny_patch16_224", attention={"n_iter": 2, "layers": "all"}, **TINY)
    assert all(isinstance(b.attn, RPCAttention) and b.attn.n_iter == 2 for b in tuned.blocks)
    with pytest.raises(ValueError, match="rpc_symvit_tiny_patch16_224 has attention kind 'rpc'"):
        timm.create_model("rpc_symvit_tiny_patch16_224", attention={"kind": "softmax"})


def test_create_vit_and_the_registered_name_build_the_same_model():
    torch.manual_seed(0)
    registered = timm.create_model("rpc_symvit_tiny_patch16_224", **TINY)
    torch.manual_seed(0)
    created = create_vit("deit_tiny", AttentionSpec(kind="rpc", n_iter=4, lambd=4.0, layers=[0]), **TINY)
    expected = registered.state_dict()
    assert created.state_dict().keys() == expected.keys()
    assert all(torch.equal(value, expected[key]) for key, value in created.state_dict().items())


@pytest.mark.parametrize(("arch", "family", "width"), [("deit_tiny", "symvit", 192), ("deit_small", "rpc_symvit", 384)])
def test_pretrained_deit_file_converts_into_symvit_and_rpc_through_timm(arch, family, width, tmp_path: Path):
    deit = timm.create_model(f"{arch}_patch16_224", pretrained=False, **SHALLOW)
    path = tmp_path / f"{arch}.pth"
    torch.save({"model": deit.state_dict()}, path)  # DeiT's released layout
    name = f"{family}_{arch.removeprefix('deit_')}_patch16_224"
    vit = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **SHALLOW)
    assert vit.blocks[0].attn.qkv.out_features == 2 * width
    assert_vit_holds(vit, deit.state_dict(), width)


def test_pretrained_symvit_file_starts_a_deit_with_q_equal_to_k(tmp_path: Path):
    symvit = create_vit("deit_tiny", AttentionSpec(kind="symmetric"), **SHALLOW).eval()
    path = tmp_path / "symvit.pth"
    torch.save(symvit.state_dict(), path)
    deit = create_vit("deit_tiny", pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **SHALLOW).eval()
    assert deit.blocks[0].attn.qkv.out_features == 3 * 192
    assert_vit_holds(deit, symvit.state_dict(), 192)
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(deit(images), symvit(images))  # symmetric attention is softmax attention with Q = K


def test_pretrained_file_of_another_width_is_refused_by_timm(tmp_path: Path):
    path = tmp_path / "small.pth"
    torch.save(create_vit("deit_small", **SHALLOW).state_dict(), path)
    with pytest.raises(RuntimeError, match=r"blocks\.0\.attn\.qkv\.weight"):
        create_vit(
            "deit_tiny",
            AttentionSpec(kind="symmetric"),
            pretrained=True,
            pretrained_cfg_overlay={"file": str(path)},
            **SHALLOW,
        )


def test_load_report_lists_conversions_skips_and_mismatches():
    source = create_vit("deit_tiny", num_classes=10, **TINY)
    state = {**source.state_dict(), "dist_token": torch.zeros(1, 1, 32)}
    target = create_vit("deit_tiny", AttentionSpec(kind="symmetric"), num_classes=5, **TINY)
    head_before = target.head.weight.detach().clone()
    with pytest.raises(ValueError, match=r"deit\.pth does not fit the model \(set init_strict=false to skip these\)"):
        load_vit_state_dict(target, state, source="deit.pth", strict_option="init_strict=false")
    report = load_vit_state_dict(target, state, strict=False, skip_prefixes=("dist_",), source="deit.pth")
    assert report.mismatched == [
        "head.weight: checkpoint (10, 32) vs model (5, 32)",
        "head.bias: checkpoint (10,) vs model (5,)",
    ]
    assert report.skipped == ["dist_token"] and not report.unexpected and not report.missing
    assert sorted(report.converted) == [
        f"blocks.{i}.attn.qkv.{p}: K, V rows kept, Q dropped (asymmetric -> symmetric)"
        for i in range(2)
        for p in ("bias", "weight")
    ]
    assert report.loaded == len(target.state_dict()) - 2
    assert str(report).startswith(f"loaded {report.loaded} tensors from deit.pth\nconverted (4):")
    assert torch.equal(target.head.weight, head_before)
    assert_vit_holds(target, {**source.state_dict(), "head.weight": head_before, "head.bias": target.head.bias}, 32)


def test_load_vit_state_dict_interpolates_pos_embed_to_the_models_grid():
    source = create_vit("deit_tiny", **TINY)  # 32 px: 4 x 4 patches + class token
    target = create_vit("deit_tiny", **{**TINY, "img_size": 48})  # 6 x 6 patches
    report = load_vit_state_dict(target, source.state_dict())
    assert report.clean and report.converted == ["pos_embed: interpolated (1, 17, 32) -> (1, 37, 32)"]
    src, dst = source.pos_embed, target.pos_embed
    torch.testing.assert_close(dst[:, :1], src[:, :1])  # the class token's embedding is kept
    grid = src[:, 1:].reshape(1, 4, 4, 32).permute(0, 3, 1, 2)  # (1, C, 4, 4)
    resized = torch.nn.functional.interpolate(grid, size=(6, 6), mode="bicubic", antialias=True)  # (1, C, 6, 6)
    torch.testing.assert_close(dst[:, 1:], resized.flatten(2).transpose(1, 2))  # (1, 36, C)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"patch_size": 0}, "patch_size=0 must be 1 or more"),
        ({"embed_dim": 0}, "embed_dim=0 must be 1 or more"),
        ({"img_size": 30, "patch_size": 8}, "img_size=30 is not a multiple of patch_size=8: .* e.g. img_size=24"),
        ({"embed_dim": 32, "num_heads": 3}, "embed_dim=32 is not divisible by num_heads=3"),
        ({"drop_path_rate": 1.0}, r"drop_path_rate=1.0 must be in \[0, 1\)"),
    ],
)
def test_vit_sizes_timm_would_fail_on_later_are_refused(sizes: dict, message: str):
    with pytest.raises(AttentionOptionError, match=message):
        check_vit_sizes(sizes)
    check_vit_sizes({"img_size": 32, "patch_size": 8, "embed_dim": 32, "num_heads": 2, "drop_path_rate": 0.1})
    check_vit_sizes({"img_size": None, "embed_dim": None})  # the architecture's own
