"""ViTClassifier: a timm DeiT-family Vision Transformer with its attention chosen by an AttentionSpec.

Legend: B batch, C channels (3), H x W image, N tokens, K classes.
Images enter in pixel space [0, 1]; the network normalises them itself, so corruptions and
attacks act on real pixels.
"""

from __future__ import annotations

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from kpca.attention import AttentionSpec
from kpca.attention.vit import Arch, PixelViT
from kpca.training.checkpointing.weights import read_state_dict


class ViTClassifier(PixelViT):
    """DeiT / SymViT / RPC-SymViT classifier on pixel-space images.

    ``attention.kind`` chooses the model: ``softmax`` is DeiT, ``symmetric`` is SymViT and ``rpc``
    is RPC-SymViT (PAP in ``attention.layers``, symmetric attention elsewhere). The ViT, the normalisation and
    ``init_from`` are :class:`kpca.attention.vit.PixelViT`'s.

    Args:
        arch: ``deit_tiny`` (192 wide, 3 heads), ``deit_small`` (384, 6) or ``deit_base`` (768, 12),
            all 12 blocks with patch 16 unless overridden below.
        num_classes: number of classes K.
        attention: which attention, and in which blocks.
        img_size: input resolution (square).
        patch_size: patch size, default 16.
        embed_dim: width override (for tiny test and demo models).
        depth: number of blocks override.
        num_heads: number of heads override.
        drop_path_rate: stochastic depth rate (DeiT: 0.1).
        drop_rate: dropout before the head.
        mean: per-channel mean used to normalise [0, 1] inputs.
        std: per-channel std used to normalise [0, 1] inputs.
        init_from: checkpoint to start from (ours, timm/DeiT, or the authors' SymViT/RPC format),
            read by :func:`kpca.training.checkpointing.weights.read_state_dict` and converted to this model's
            attention by :func:`kpca.attention.vit.load_vit_state_dict`.
        init_strict: fail on any mismatch with ``init_from`` (a readable report is raised);
            when False, mismatching tensors are skipped and the report is logged.
    """

    def __init__(
        self,
        arch: Arch = "deit_tiny",
        num_classes: int = 1000,
        attention: AttentionSpec = AttentionSpec(),  # noqa: B008 (frozen-like dataclass default)
        img_size: int = 224,
        patch_size: int = 16,
        embed_dim: int | None = None,
        depth: int | None = None,
        num_heads: int | None = None,
        drop_path_rate: float = 0.1,
        drop_rate: float = 0.0,
        mean: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN,
        std: tuple[float, float, float] = IMAGENET_DEFAULT_STD,
        init_from: str | None = None,
        init_strict: bool = True,
    ) -> None:
        super().__init__(
            arch,
            attention,
            mean=mean,
            std=std,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            num_classes=num_classes,
            img_size=img_size,
            patch_size=patch_size,
            drop_path_rate=drop_path_rate,
            drop_rate=drop_rate,
        )
        if init_from is not None:
            self.init_vit(init_from, read_state_dict(init_from), strict=init_strict)

    @property
    def num_classes(self) -> int:
        """Number of output classes K."""
        return self.vit.num_classes

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Classify (B, 3, H, W) pixel-space images in [0, 1]; returns (B, K) logits."""
        return self.vit(self.normalise(images))
