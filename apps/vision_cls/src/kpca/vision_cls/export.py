"""Export of a trained classifier as a timm model folder (``model.safetensors`` and ``config.json``).

``timm.create_model("local-dir:<folder>", pretrained=True)`` rebuilds the trained network: a DeiT with timm alone,
the project's SymViT / RPC / scaled-attention models after ``import kpca.attention.vit`` (which ``import
kpca.vision_cls`` does), whose registry entries name them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from safetensors.torch import save_file

from kpca.attention.vit import ARCHS, model_name, pretrained_cfg
from kpca.training.files import write_atomic, write_tree_atomic


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
    arch = next((a for a, dims in ARCHS.items() if dims["embed_dim"] == vit.embed_dim), "deit_tiny")
    img_size = vit.patch_embed.img_size[0]
    model_args = {
        "img_size": img_size,
        "patch_size": vit.patch_embed.patch_size[0],
        "embed_dim": vit.embed_dim,
        "depth": len(vit.blocks),
        "num_heads": vit.blocks[0].attn.num_heads,
    }
    if spec.kind != "softmax":  # a softmax model is timm's own DeiT: no kpca import needed to load it
        model_args["attention"] = {k: v for k, v in dataclasses.asdict(spec).items() if k != "kind"}
    config = {
        "architecture": model_name(arch, spec.kind),
        "num_classes": vit.num_classes,
        "num_features": vit.num_features,
        "model_args": model_args,
        "pretrained_cfg": pretrained_cfg(
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
