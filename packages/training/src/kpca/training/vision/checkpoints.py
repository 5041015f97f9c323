"""Loading ViT weights from our checkpoints, timm/DeiT files or the authors' SymViT/RPC files into a timm ViT."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from timm.layers import resample_abs_pos_embed
from torch import nn

from kpca.attention import convert_qkv_rows
from kpca.training.checkpointing.weights import read_state_dict

logger = logging.getLogger(__name__)


@dataclass
class LoadReport:
    """What happened to each tensor when loading a checkpoint into a model."""

    source: str
    loaded: int = 0
    converted: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True when every model tensor was found and fitted."""
        return not (self.missing or self.unexpected or self.mismatched)

    def __str__(self) -> str:
        lines = [f"loaded {self.loaded} tensors from {self.source}"]
        for title, items in (
            ("converted", self.converted),
            ("missing in the checkpoint", self.missing),
            ("unexpected in the checkpoint", self.unexpected),
            ("shape mismatch", self.mismatched),
            ("skipped on purpose", self.skipped),
        ):
            if items:
                lines.append(f"{title} ({len(items)}):")
                lines.extend(f"  {item}" for item in items)
        return "\n".join(lines)


def _fit(key: str, src: torch.Tensor, dst: torch.Tensor, num_prefix_tokens: int) -> tuple[torch.Tensor | None, str]:
    """``src`` reshaped to ``dst`` where a known conversion applies, and a note; (None, reason) otherwise."""
    if src.shape == dst.shape:
        return src, ""
    if key.endswith(("attn.qkv.weight", "attn.qkv.bias")) and src.shape[1:] == dst.shape[1:]:
        width = dst.shape[0] // 2 if dst.shape[0] % 3 else dst.shape[0] // 3
        if {src.shape[0], dst.shape[0]} == {2 * width, 3 * width}:
            to_symmetric = dst.shape[0] == 2 * width
            dropped, initialised = "K, V rows kept, Q dropped", "Q initialised from K (symmetric -> asymmetric)"
            note = f"{dropped} (asymmetric -> symmetric)" if to_symmetric else initialised
            return convert_qkv_rows(src, width, symmetric=to_symmetric), f"{key}: {note}"
    if key == "pos_embed" and src.shape[-1] == dst.shape[-1]:
        grid = int(math.isqrt(dst.shape[1] - num_prefix_tokens))
        resized = resample_abs_pos_embed(src, [grid, grid], num_prefix_tokens=num_prefix_tokens)
        if resized.shape == dst.shape:
            return resized, f"pos_embed: interpolated {tuple(src.shape)} -> {tuple(dst.shape)}"
    return None, f"{key}: checkpoint {tuple(src.shape)} vs model {tuple(dst.shape)}"


def load_weights(
    net: nn.Module, path: str | Path, *, strict: bool = True, skip_prefixes: tuple[str, ...] = ()
) -> LoadReport:
    """Load a checkpoint into ``net.vit`` (a timm VisionTransformer), converting what fits.

    Symmetric and asymmetric attention convert into each other (see ``_fit``), position embeddings
    are interpolated to the model's grid. With ``strict`` any missing, unexpected or mismatched
    tensor raises a ValueError holding the full report; otherwise those tensors are skipped and
    the report is logged. Checkpoint tensors whose names start with one of ``skip_prefixes`` (e.g. a
    classifier head that a segmentation encoder lacks) are left out and listed as skipped.

    Returns:
        The :class:`LoadReport`.
    """
    vit = net.vit
    target = vit.state_dict()
    report = LoadReport(source=str(path))
    fitted = {}
    state = read_state_dict(path)
    for key, src in state.items():
        if key.startswith(skip_prefixes) and key not in target:
            report.skipped.append(key)
            continue
        if key not in target:
            report.unexpected.append(key)
            continue
        value, note = _fit(key, src, target[key], getattr(vit, "num_prefix_tokens", 1))
        if value is None:
            report.mismatched.append(note)
            continue
        if note:
            report.converted.append(note)
        fitted[key] = value.to(target[key].dtype)
    report.missing = [key for key in target if key not in state]
    if strict and not report.clean:
        raise ValueError(f"init_from does not fit the model (set init_strict=false to skip these):\n{report}")
    vit.load_state_dict(fitted, strict=False)
    report.loaded = len(fitted)
    logger.info("%s", report)
    return report
