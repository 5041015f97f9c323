"""Segmenter: a timm DeiT encoder and a mask-transformer decoder, both with attention chosen by an AttentionSpec.

Legend: B batch, C channels (3), H x W image, P patch size, Gh x Gw patch grid, N = Gh * Gw patch tokens,
E encoder width, D decoder width, K classes.
Images enter in pixel space [0, 1]; the network normalises them itself (as the vision app does), so corruptions
act on real pixels.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import trunc_normal_
from torch import nn

from kpca.attention import AttentionSpec, swap_attention
from kpca.attention.vit import Arch, PixelViT
from kpca.attention.vit_blocks import ValuePassingBlock
from kpca.training.checkpointing.weights import read_state_dict
from kpca.training.errors import OptionError

logger = logging.getLogger(__name__)


class MaskTransformerHead(nn.Module):
    """Segmenter's mask transformer (Strudel et al. 2021): class embeddings attend jointly with patch tokens.

    Patch tokens are projected to width D, ``num_classes`` learnt class embeddings are appended, the sequence goes
    through ``depth`` pre-norm transformer blocks (timm ``Block``, attention replaced per ``attention``), and the
    masks are the products of L2-normalised patch and class features, LayerNorm-ed over classes.

    It follows the authors' ``segm/model/decoder_rpc.py`` (a fork of Segmenter's): the same layers, LayerNorm eps
    1e-5, dropout and initialisation. mmseg's ``SegmenterMaskTransformerHead`` computes the same function (tested
    with copied weights); it stores ``proj_patch`` and ``proj_classes`` as bias-free ``Linear`` layers (transposed)
    and initialises them differently.

    Attention goes the ViTs' one way, as the encoder's does (:func:`kpca.attention.vit.create_vit`): timm blocks are
    built with softmax attention and initialised, then ``swap_attention`` replaces it for ``attention`` (for a
    non-softmax kind), so encoder and decoder blocks have a ViT block's weight layout. Kinds that read values of
    earlier blocks (Elliptical, NeuTRENO) get them from the decoder's loop over its blocks (timm's ``Block`` as
    ``kpca.attention.vit_blocks.ValuePassingBlock``, the same parameters), apart from the encoder's: NeuTRENO's
    decoder block 1 reads decoder block 0's values, as the authors'.

    Args:
        in_dim: encoder width E.
        num_classes: number of classes K.
        dim: decoder width D (Segmenter: the encoder width).
        depth: number of blocks (Segmenter: 2).
        num_heads: heads per block (Segmenter: D // 64); None picks ``max(1, dim // 64)``.
        attention: attention of the blocks; ``rpc`` needs no queries (symmetric), as RPCAttention is.
        mlp_ratio: MLP hidden width / D.
        drop_path_rate: stochastic depth, increasing linearly over the blocks.
        dropout: dropout on the attention probabilities, after the attention projection and in the MLP (after the
            activation and after the second layer), as the authors' ``blocks_rpc.py`` and Segmenter (0.1 there).
    """

    passes_earlier_values = True  # its loop hands values on (forward)

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        dim: int,
        depth: int = 2,
        num_heads: int | None = None,
        attention: AttentionSpec = AttentionSpec(),  # noqa: B008 (frozen-like dataclass default)
        mlp_ratio: float = 4.0,
        drop_path_rate: float = 0.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if depth < 1 or dim < 1 or (num_heads is not None and num_heads < 1):
            raise OptionError(f"decoder depth, width and heads must be 1 or more, got {depth}, {dim}, {num_heads}")
        for name, rate in (("decoder_drop_path_rate", drop_path_rate), ("decoder_dropout", dropout)):
            if not 0.0 <= rate < 1.0:
                raise OptionError(f"{name}={rate} must be in [0, 1) (0 disables)")
        num_heads = num_heads or max(1, dim // 64)
        if dim % num_heads:
            raise OptionError(f"decoder width {dim} is not divisible by num_heads={num_heads}; pick a divisor")
        self.num_classes = num_classes
        self.proj_dec = nn.Linear(in_dim, dim)
        rates = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()  # numbers, on any default device
        self.blocks = nn.ModuleList(
            ValuePassingBlock(
                dim,
                num_heads,
                mlp_ratio,
                qkv_bias=True,
                proj_drop=dropout,
                attn_drop=dropout,
                drop_path=rate,
                norm_layer=nn.LayerNorm,  # eps 1e-5 as the authors' blocks (timm's Block default: 1e-6)
            )
            for rate in rates
        )
        self.cls_emb = nn.Parameter(torch.zeros(1, num_classes, dim))
        self.decoder_norm = nn.LayerNorm(dim)
        self.proj_patch = nn.Parameter(dim**-0.5 * torch.randn(dim, dim))
        self.proj_classes = nn.Parameter(dim**-0.5 * torch.randn(dim, dim))
        self.mask_norm = nn.LayerNorm(num_classes)
        trunc_normal_(self.cls_emb, std=0.02)
        self.apply(_init_weights)
        if attention.kind != "softmax":
            swap_attention(self, attention)

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Masks of (B, N, E) patch tokens on a ``grid`` = (Gh, Gw) patch grid; returns (B, K, Gh, Gw)."""
        x = self.proj_dec(tokens)  # (B, N, D)
        x = torch.cat([x, self.cls_emb.expand(x.shape[0], -1, -1)], dim=1)  # (B, N + K, D)
        first: torch.Tensor | None = None
        previous: torch.Tensor | None = None
        for block in self.blocks:
            values: list[torch.Tensor] = []  # this block's (B, H, N + K, D / H) values: a local of this call
            x = block(x, None, False, first, previous, values)  # (B, N + K, D)
            if values:  # none from timm's Attention, in blocks a spec leaves as they are
                first = values[0] if first is None else first
                previous = values[0]
        x = self.decoder_norm(x)
        patches, classes = x[:, : -self.num_classes], x[:, -self.num_classes :]  # (B, N, D), (B, K, D)
        patches = F.normalize(patches @ self.proj_patch, dim=-1)
        classes = F.normalize(classes @ self.proj_classes, dim=-1)
        masks = self.mask_norm(patches @ classes.transpose(1, 2))  # (B, N, K)
        return masks.transpose(1, 2).reshape(masks.shape[0], self.num_classes, *grid)  # (B, K, Gh, Gw)

    def no_weight_decay(self) -> set[str]:
        """The class embeddings (Segmenter's list)."""
        return {"cls_emb"}


def _init_weights(module: nn.Module) -> None:
    """Segmenter / timm ViT init: truncated-normal linear weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class Segmenter(PixelViT):
    """Segmenter on pixel-space images: DeiT / SymViT / RPC-SymViT encoder and a mask-transformer decoder.

    ``attention.kind`` chooses the encoder (``softmax`` DeiT, ``symmetric`` SymViT, ``rpc`` RPC-SymViT with PAP in
    ``attention.layers``, or another registered kind: ``twicing``, ``neutreno``, ``elliptical``),
    ``decoder_attention`` the decoder blocks (the paper: RPC with 6 iterations in encoder block 0 and decoder
    block 0). Any input size works: images are padded to a multiple of the patch size and the position
    embeddings (learnt for ``img_size``) are interpolated to the patch grid. The encoder, the normalisation and
    ``init_from`` are :class:`kpca.attention.vit.PixelViT`'s.

    Args:
        arch: ``deit_tiny`` (192 wide, 3 heads), ``deit_small`` (384, 6) or ``deit_base`` (768, 12), 12 blocks,
            patch 16, unless overridden below.
        num_classes: number of classes K (ADE20K: 150).
        attention: encoder attention, and in which blocks.
        decoder_attention: decoder attention; None uses ``attention``.
        img_size: training crop size; the position embeddings are learnt (and interpolated on load) at this size.
        patch_size: patch size P, default 16.
        embed_dim: encoder width override (for tiny test and demo models).
        depth: encoder blocks override.
        num_heads: encoder heads override.
        decoder_depth: mask-transformer blocks (Segmenter: 2).
        decoder_dim: decoder width D; None uses the encoder width (Segmenter).
        decoder_heads: decoder heads; None uses D // 64 (at least 1).
        drop_path_rate: stochastic depth of the encoder (Segmenter: 0.1).
        decoder_drop_path_rate: stochastic depth of the decoder (Segmenter: 0.0).
        decoder_dropout: dropout of the decoder blocks on attention probabilities, attention projection and MLP
            (Segmenter and the authors: 0.1, ``mask_transformer: dropout`` of their ``config.yml``).
        mean: per-channel mean used to normalise [0, 1] inputs.
        std: per-channel std used to normalise [0, 1] inputs.
        init_from: a classifier checkpoint for the encoder (ours from ``vision-cls``, timm/DeiT, or the authors'
            SymViT/RPC files); its classification head is skipped, position embeddings are interpolated to
            ``img_size`` and attention weights converted to the encoder's (see
            :func:`kpca.attention.vit.load_vit_state_dict`).
        init_strict: fail on any other mismatch with ``init_from`` (the report is raised); when False, mismatching
            tensors are skipped and the report is logged.
    """

    def __init__(
        self,
        arch: Arch = "deit_tiny",
        num_classes: int = 150,
        attention: AttentionSpec = AttentionSpec(),  # noqa: B008 (frozen-like dataclass default)
        decoder_attention: AttentionSpec | None = None,
        img_size: int = 512,
        patch_size: int = 16,
        embed_dim: int | None = None,
        depth: int | None = None,
        num_heads: int | None = None,
        decoder_depth: int = 2,
        decoder_dim: int | None = None,
        decoder_heads: int | None = None,
        drop_path_rate: float = 0.1,
        decoder_drop_path_rate: float = 0.0,
        decoder_dropout: float = 0.1,
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
            num_classes=0,
            img_size=img_size,
            patch_size=patch_size,
            drop_path_rate=drop_path_rate,
            dynamic_img_size=True,
        )
        self.decoder_attention = decoder_attention or attention
        width = self.vit.embed_dim
        self.decoder = MaskTransformerHead(
            width,
            num_classes,
            decoder_dim or width,
            depth=decoder_depth,
            num_heads=decoder_heads,
            attention=self.decoder_attention,
            drop_path_rate=decoder_drop_path_rate,
            dropout=decoder_dropout,
        )
        self.patch_size = patch_size
        if init_from is not None:
            skip = ("head.", "fc_norm.", "head_drop.")  # a classifier's head: the encoder has none
            self.init_vit(init_from, read_state_dict(init_from), strict=init_strict, skip_prefixes=skip)

    @property
    def num_classes(self) -> int:
        """Number of classes K."""
        return self.decoder.num_classes

    def forward_masks(self, images: torch.Tensor) -> torch.Tensor:
        """Patch-level class masks of (B, 3, H, W) pixel images in [0, 1] (H, W multiples of P): (B, K, Gh, Gw)."""
        grid = (images.shape[-2] // self.patch_size, images.shape[-1] // self.patch_size)
        tokens = self.vit.forward_features(self.normalise(images))  # (B, prefix + N, E)
        return self.decoder(tokens[:, self.vit.num_prefix_tokens :], grid)  # (B, K, Gh, Gw)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Per-pixel class logits of (B, 3, H, W) pixel-space images in [0, 1]: (B, K, H, W).

        The images are padded with black (0, as the training crops are) on the bottom and right to multiples of
        P, and the bilinearly upsampled masks are cropped back to H x W.
        """
        h, w = images.shape[-2:]
        ph, pw = (math.ceil(s / self.patch_size) * self.patch_size for s in (h, w))
        padded = F.pad(images, (0, pw - w, 0, ph - h), value=0.0) if (ph, pw) != (h, w) else images  # (B, 3, Hp, Wp)
        masks = self.forward_masks(padded)  # (B, K, Gh, Gw)
        logits = F.interpolate(masks, size=(ph, pw), mode="bilinear", align_corners=False)  # (B, K, Hp, Wp)
        return logits[..., :h, :w]

    def no_weight_decay(self) -> set[str]:
        """Parameter names excluded from weight decay beyond biases and norms (timm's and Segmenter's lists)."""
        return super().no_weight_decay() | {f"decoder.{name}" for name in self.decoder.no_weight_decay()}
