"""ViTClassifier shapes, parameter counts, attention per block, normalisation and init_from loading (CPU)."""

import argparse
import copy
from pathlib import Path

import pytest
import timm
import torch
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV2, NativeScaler, get_state_dict

from kpca.attention import AttentionSpec, RPCAttention, SoftmaxAttention, swap_attention
from kpca.attention.vit import load_vit_state_dict
from kpca.training.checkpointing.weights import read_state_dict
from kpca.vision_cls.model import ViTClassifier
from kpca.vision_cls.module import ClassificationModule
from tests.attention.helpers import assert_vit_holds

TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
SHALLOW = {"img_size": 32, "depth": 2}  # DeiT's width and heads, 2 blocks on 2 x 2 patches: fast at any width
DEIT_WIDTHS = [("deit_tiny", 192), ("deit_small", 384), ("deit_base", 768)]


def tiny(kind: str = "symmetric", num_classes: int = 5, **kwargs) -> ViTClassifier:
    """A 2-block, 32-wide classifier on 32 px images (4 x 4 patches), without stochastic depth, in eval mode."""
    layers = [0] if kind == "rpc" else "all"
    args = {**TINY, "num_classes": num_classes, "drop_path_rate": 0.0, **kwargs}
    attention = AttentionSpec(kind=kind, n_iter=2 if kind == "rpc" else None, layers=layers)
    return ViTClassifier("deit_tiny", attention=attention, **args).eval()


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save(state: dict, path: Path) -> Path:
    torch.save(state, path)
    return path


@pytest.mark.parametrize("kind", ["softmax", "symmetric", "rpc"])
def test_logits_shape(kind: str):
    images = torch.rand(3, 3, 32, 32)  # (B, C, H, W)
    logits = tiny(kind, num_classes=7)(images)
    assert logits.shape == (3, 7) and torch.isfinite(logits).all()


def test_deit_tiny_parameter_counts_and_rpc_keys_match_symvit():
    with torch.device("meta"):  # construction only: shapes without allocating or initialising weights
        deit, symvit, rpc = (
            ViTClassifier("deit_tiny", attention=AttentionSpec(kind=kind, layers=[0] if kind == "rpc" else "all"))
            for kind in ("softmax", "symmetric", "rpc")
        )
    assert num_params(deit) == pytest.approx(5.72e6, abs=0.01e6)
    assert num_params(symvit) == pytest.approx(5.27e6, abs=0.01e6)
    # SymViT drops the Q projection (weight C x C and bias C) in each of the 12 blocks, C = 192.
    assert num_params(deit) - num_params(symvit) == 12 * (192 * 192 + 192)
    assert num_params(rpc) == num_params(symvit)
    assert rpc.state_dict().keys() == symvit.state_dict().keys()


def test_rpc_in_chosen_block_and_symmetric_softmax_elsewhere():
    model = tiny("rpc", depth=3)
    attns = [block.attn for block in model.vit.blocks]
    assert isinstance(attns[0], RPCAttention) and attns[0].n_iter == 2
    assert all(type(a) is SoftmaxAttention and a.symmetric for a in attns[1:])


def test_forward_normalises_pixel_images():
    model = tiny("softmax")
    images = torch.rand(2, 3, 32, 32)  # (B, C, H, W) in [0, 1]
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)  # timm IMAGENET_DEFAULT_MEAN
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    torch.testing.assert_close(model(images), model.vit((images - mean) / std))
    assert not torch.allclose(model(images), model.vit(images))


def test_init_from_timm_deit_file_drops_q_into_symvit(tmp_path: Path):
    timm_vit = timm.create_model("deit_tiny_patch16_224", pretrained=False, num_classes=5, **TINY).eval()
    path = save({"model": timm_vit.state_dict()}, tmp_path / "deit.pth")
    report = load_vit_state_dict(tiny("symmetric").vit, read_state_dict(path))
    assert report.clean and report.loaded == len(tiny("symmetric").vit.state_dict())
    assert sorted(report.converted) == [
        f"blocks.{i}.attn.qkv.{p}: K, V rows kept, Q dropped (asymmetric -> symmetric)"
        for i in range(2)
        for p in ("bias", "weight")
    ]
    loaded = tiny("symmetric", init_from=str(path))
    # The same conversion as swapping the attention of the timm model in place.
    expected = copy.deepcopy(timm_vit)
    swap_attention(expected, AttentionSpec(kind="symmetric"))
    images = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(loaded(images), expected((images - loaded.mean) / loaded.std))
    assert not torch.allclose(loaded(images), tiny("symmetric")(images))


def test_init_from_lightning_checkpoint_round_trip_ignores_ema(tmp_path: Path):
    module = ClassificationModule(tiny("rpc"), ema_decay=0.9)
    with torch.no_grad():
        for p in module.ema.parameters():
            p.add_(1.0)  # the EMA weights differ from the net's; they must not be the ones loaded
    assert any(k.startswith("ema.") for k in module.state_dict())
    path = save({"epoch": 3, "state_dict": module.state_dict()}, tmp_path / "last.ckpt")
    loaded = tiny("rpc", init_from=str(path))
    images = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(loaded(images), module.net(images), rtol=0, atol=0)


def test_init_from_other_head_raises_report_unless_not_strict(tmp_path: Path):
    source = tiny("symmetric", num_classes=10)
    path = save({"state_dict": {f"net.{k}": v for k, v in source.state_dict().items()}}, tmp_path / "ten.ckpt")
    with pytest.raises(ValueError, match="init_strict") as excinfo:
        tiny("symmetric", num_classes=5, init_from=str(path))
    message = str(excinfo.value)
    assert "shape mismatch (2):" in message and "head.weight: checkpoint (10, 32) vs model (5, 32)" in message
    target = tiny("symmetric", num_classes=5)
    head_before = target.vit.head.weight.detach().clone()
    report = load_vit_state_dict(target.vit, read_state_dict(path), strict=False)
    assert report.mismatched == [
        "head.weight: checkpoint (10, 32) vs model (5, 32)",
        "head.bias: checkpoint (10,) vs model (5,)",
    ]
    torch.testing.assert_close(target.vit.head.weight, head_before)
    torch.testing.assert_close(target.vit.blocks[1].attn.qkv.weight, source.vit.blocks[1].attn.qkv.weight)
    lenient = tiny("symmetric", num_classes=5, init_from=str(path), init_strict=False)
    torch.testing.assert_close(lenient.vit.patch_embed.proj.weight, source.vit.patch_embed.proj.weight)


def test_init_from_interpolates_pos_embed_to_new_image_size(tmp_path: Path):
    source = tiny("symmetric")  # 32 px: 4 x 4 patches + class token
    path = save({"model": source.vit.state_dict()}, tmp_path / "small.pth")
    target = tiny("symmetric", img_size=48, init_from=str(path))  # 6 x 6 patches
    assert target.vit.pos_embed.shape == (1, 37, 32)
    torch.testing.assert_close(target.vit.pos_embed[:, :1], source.vit.pos_embed[:, :1])  # the class token's
    assert target(torch.rand(1, 3, 48, 48)).shape == (1, 5)


@pytest.mark.parametrize(
    ("arch", "width", "kind"),
    [(arch, width, kind) for arch, width in DEIT_WIDTHS[:2] for kind in ("symmetric", "rpc")]
    + [("deit_base", 768, "rpc")],  # RPC in block 0, symmetric in block 1: both kinds at width 768 in one build
)
def test_init_from_a_deit_file_at_deits_widths_keeps_k_and_v(arch: str, width: int, kind: str, tmp_path: Path):
    deit = timm.create_model(f"{arch}_patch16_224", pretrained=False, num_classes=5, **SHALLOW)
    path = save(deit.state_dict(), tmp_path / f"{arch}.pth")
    attention = AttentionSpec(kind=kind, layers=[0] if kind == "rpc" else "all")
    model = ViTClassifier(arch, num_classes=5, attention=attention, init_from=str(path), **SHALLOW)
    assert [b.attn.qkv.out_features for b in model.vit.blocks] == [2 * width] * 2  # [K;V]
    assert_vit_holds(model.vit, deit.state_dict(), width)


@pytest.mark.parametrize(("arch", "width"), DEIT_WIDTHS)
def test_init_from_a_symvit_file_at_deits_widths_starts_deit_with_q_equal_to_k(arch: str, width: int, tmp_path: Path):
    symvit = ViTClassifier(arch, num_classes=5, attention=AttentionSpec(kind="symmetric"), **SHALLOW).eval()
    path = save({"model": symvit.vit.state_dict()}, tmp_path / "symvit.pth")
    deit = ViTClassifier(arch, num_classes=5, init_from=str(path), **SHALLOW).eval()
    assert [b.attn.qkv.out_features for b in deit.vit.blocks] == [3 * width] * 2  # [Q;K;V]
    assert_vit_holds(deit.vit, symvit.vit.state_dict(), width)
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(deit(images), symvit(images))  # symmetric attention is softmax with Q = K


@pytest.mark.slow
def test_init_from_timm_deit_tiny_state_dict_into_a_full_size_symvit(tmp_path: Path):
    deit = timm.create_model("deit_tiny_patch16_224", pretrained=False)
    path = save(deit.state_dict(), tmp_path / "deit_tiny.pth")
    model = ViTClassifier("deit_tiny", attention=AttentionSpec(kind="symmetric"), init_from=str(path))
    assert_vit_holds(model.vit, deit.state_dict(), 192)


def test_init_from_missing_file_names_the_path(tmp_path: Path):
    missing = tmp_path / "nope.ckpt"
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        tiny(init_from=str(missing))


def authors_state_keys(depth: int) -> list[str]:
    """The state_dict keys of the RPC authors' ViT (rachtsy/KPCA_code Robust/softmax.py VisionTransformer, Block,
    Attention with ``qkv = Linear(dim, 2 * dim)``, timm's PatchEmbed and Mlp), written out from their code."""
    block = [
        f"{module}.{param}"
        for module in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2")
        for param in ("weight", "bias")
    ]
    return [
        "cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias",
        *(f"blocks.{i}.{key}" for i in range(depth) for key in block),
        "norm.weight", "norm.bias", "head.weight", "head.bias",
    ]  # fmt: skip


def training_file(weights: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, object]:
    """A checkpoint as DeiT's and the authors' main_train.py save it each epoch (KPCA_code Robust/main_train.py)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = CosineLRScheduler(optimizer, t_initial=300, warmup_t=5, warmup_lr_init=1e-6, lr_min=1e-5)
    args = argparse.Namespace(model="deit_tiny_patch16_224", batch_size=128, lr=5e-4, num_iter=4, lambd=4.0, layer=0)
    return {
        "model": weights,
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": scheduler.state_dict(),
        "epoch": 299,
        "model_ema": get_state_dict(ModelEmaV2(model)),
        "scaler": NativeScaler(device="cpu").state_dict(),
        "args": args,
    }


@pytest.mark.parametrize("kind", ["softmax", "symmetric", "rpc"])
def test_init_from_a_deit_or_authors_training_file_with_its_args_namespace(kind: str, tmp_path: Path):
    source = tiny(kind)
    weights = source.vit.state_dict()
    if kind != "softmax":  # SymViT and RPC: the authors' layout, K and V rows in a 2C-row qkv
        assert list(weights) == authors_state_keys(depth=2)
        assert weights["blocks.0.attn.qkv.weight"].shape == (2 * 32, 32)
    path = save(training_file(weights, source.vit), tmp_path / "checkpoint.pth")
    loaded = tiny(kind, init_from=str(path))
    images = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(loaded(images), source(images), rtol=0, atol=0)
    assert not torch.allclose(tiny(kind)(images), source(images))


def test_init_from_deit_released_file(tmp_path: Path):
    source = tiny("softmax")
    path = save({"model": source.vit.state_dict()}, tmp_path / "deit_tiny_patch16_224-a1311bcf.pth")
    images = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(tiny("softmax", init_from=str(path))(images), source(images), rtol=0, atol=0)


class NotAWeight:
    """A pickled class that init_from must not unpickle."""


def test_init_from_refuses_other_pickled_classes_naming_file_and_class(tmp_path: Path):
    weights = tiny("symmetric").vit.state_dict()
    path = save({"model": weights, "args": argparse.Namespace(lr=1.0), "extra": NotAWeight()}, tmp_path / "odd.pth")
    with pytest.raises(
        ValueError, match=r"odd\.pth' holds pickled classes \['tests\.vision_cls\.test_model\.NotAWeight'"
    ):
        tiny("symmetric", init_from=str(path))
    assert argparse.Namespace not in torch.serialization.get_safe_globals()  # allowed per call, not registered
