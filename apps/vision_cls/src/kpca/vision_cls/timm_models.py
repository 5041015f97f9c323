"""The project's ViTs in timm's model registry, and export of a trained classifier as a timm model folder.

Importing :mod:`kpca.vision_cls` registers, for each size ``tiny`` / ``small`` / ``base`` (DeiT's widths, 12
blocks, patch 16, 224 px):

- ``symvit_<size>_patch16_224``: SymViT (symmetric attention in every block);
- ``rpc_symvit_<size>_patch16_224``: RPC-SymViT (PAP with n_iter 4, lambd 4 in block 0, as the paper's example);
- ``deit_scaled_s_<size>_patch16_224`` / ``deit_scaled_alpha_<size>_patch16_224``: the scaled-attention variants.

``timm.create_model(name, attention={"n_iter": 2, "layers": "all"}, ...)`` overrides the attention settings
(any :class:`kpca.attention.AttentionSpec` field but ``kind``). These models expect timm-normalised inputs (their
``pretrained_cfg`` mean / std), not the pixel-space images of :class:`kpca.vision_cls.model.ViTClassifier`.

:func:`export_timm` writes ``model.safetensors`` and ``config.json`` in timm's hub layout, so that
``timm.create_model("local-dir:<folder>", pretrained=True)`` rebuilds the trained network (after ``import
kpca.vision_cls`` for the project's architectures; a DeiT needs only timm).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import timm
from safetensors.torch import save_file
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import VisionTransformer, build_model_with_cfg, load_pretrained
from timm.models._registry import generate_default_cfgs, register_model

from kpca.attention import AttentionSpec, swap_attention
from kpca.training.files import write_atomic, write_tree_atomic

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"embed_dim": 192, "depth": 12, "num_heads": 3},
    "small": {"embed_dim": 384, "depth": 12, "num_heads": 6},
    "base": {"embed_dim": 768, "depth": 12, "num_heads": 12},
}
FAMILIES: dict[str, AttentionSpec] = {
    "symvit": AttentionSpec(kind="symmetric"),
    "rpc_symvit": AttentionSpec(kind="rpc", n_iter=4, lambd=4.0, layers=[0]),
    "deit_scaled_s": AttentionSpec(kind="scaled_s"),
    "deit_scaled_alpha": AttentionSpec(kind="scaled_alpha"),
}
FAMILY_OF_KIND = {spec.kind: family for family, spec in FAMILIES.items()}


def _pretrained_cfg(**overrides) -> dict:
    """A timm pretrained cfg of the project's models: ImageNet normalisation, DeiT's evaluation transform."""
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.875,
        "interpolation": "bicubic", "fixed_input_size": True, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj", "classifier": "head", "license": "apache-2.0",
        **overrides,
    }  # fmt: skip


def model_name(family: str, size: str) -> str:
    """The registered timm name of a family and size, e.g. ``rpc_symvit_tiny_patch16_224``."""
    return f"{family}_{size}_patch16_224"


default_cfgs = generate_default_cfgs({model_name(f, s): _pretrained_cfg() for f in FAMILIES for s in SIZES})


def build_registered(name: str, family: str, size: str, pretrained: bool = False, **kwargs) -> VisionTransformer:
    """Build ``name``: timm's VisionTransformer of ``size`` with the family's attention swapped in.

    Args:
        name: the registered model name (timm's variant name).
        family: a key of :data:`FAMILIES`.
        size: a key of :data:`SIZES`.
        pretrained: load the weights the pretrained cfg points at (e.g. a ``local-dir:`` export), after the swap.
        **kwargs: timm ``VisionTransformer`` arguments, and ``attention``: a dict of AttentionSpec fields.
    """
    overrides = kwargs.pop("attention", None) or {}
    if "kind" in overrides and overrides["kind"] != FAMILIES[family].kind:
        raise ValueError(f"{name} has attention kind {FAMILIES[family].kind!r}; got attention={overrides!r}")
    spec = dataclasses.replace(FAMILIES[family], **{k: v for k, v in overrides.items() if k != "kind"})
    vit = build_model_with_cfg(VisionTransformer, name, pretrained=False, **{**SIZES[size], "patch_size": 16, **kwargs})
    swap_attention(vit, spec)
    if pretrained:
        load_pretrained(vit, num_classes=vit.num_classes, in_chans=3)
    return vit


def _entrypoint(family: str, size: str) -> Callable[..., VisionTransformer]:
    name = model_name(family, size)

    def create(pretrained: bool = False, **kwargs) -> VisionTransformer:
        return build_registered(name, family, size, pretrained=pretrained, **kwargs)

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = f"{name}: timm ViT-{size} with {FAMILIES[family].kind} attention (kpca.vision_cls)."
    return create


for _family in FAMILIES:
    for _size in SIZES:
        register_model(_entrypoint(_family, _size))


def export_timm(classifier, out_dir: str | Path) -> Path:
    """Write a :class:`~kpca.vision_cls.model.ViTClassifier` as a timm model folder (safetensors + config.json).

    The folder is written next to its destination and moved into place, so it is whole or absent.

    Args:
        classifier: the trained classifier (its ``vit``, ``attention``, ``mean`` and ``std`` are exported).
        out_dir: the folder to create; it must not exist yet.

    Returns:
        The folder, for ``timm.create_model(f"local-dir:{folder}", pretrained=True)``.
    """
    folder = Path(out_dir)
    if folder.exists():
        raise FileExistsError(f"{folder} exists; choose a new --out_dir (an export never overwrites files)")
    vit, spec = classifier.vit, classifier.attention
    size = next((s for s, dims in SIZES.items() if dims["embed_dim"] == vit.embed_dim), "tiny")
    img_size = vit.patch_embed.img_size[0]
    model_args = {
        "img_size": img_size,
        "patch_size": vit.patch_embed.patch_size[0],
        "embed_dim": vit.embed_dim,
        "depth": len(vit.blocks),
        "num_heads": vit.blocks[0].attn.num_heads,
    }
    if spec.kind == "softmax":
        architecture = f"deit_{size}_patch16_224"  # timm's own DeiT: no kpca import needed to load it
    else:
        architecture = model_name(FAMILY_OF_KIND[spec.kind], size)
        model_args["attention"] = {k: v for k, v in dataclasses.asdict(spec).items() if k != "kind"}
    config = {
        "architecture": architecture,
        "num_classes": vit.num_classes,
        "num_features": vit.num_features,
        "model_args": model_args,
        "pretrained_cfg": _pretrained_cfg(
            num_classes=vit.num_classes,
            input_size=(3, img_size, img_size),
            mean=_decimal(classifier.mean),
            std=_decimal(classifier.std),
        ),
    }
    tensors = {name: t.detach().cpu().contiguous() for name, t in vit.state_dict().items()}

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_atomic(tmp / "config.json", lambda f: json.dump(config, f, indent=2), mode="w", encoding="utf-8")

    write_tree_atomic(folder, "config.json", write, what="timm export")
    return folder


def _decimal(values) -> tuple[float, ...]:
    """A float32 buffer's values as the decimals they were configured with (0.485, not 0.48500001430511475)."""
    return tuple(float(f"{v:.7g}") for v in values.flatten().tolist())


def load_exported(folder: str | Path, **kwargs) -> VisionTransformer:
    """``timm.create_model("local-dir:<folder>", pretrained=True, **kwargs)``: an exported model, back in timm."""
    return timm.create_model(f"local-dir:{Path(folder)}", pretrained=True, **kwargs)
