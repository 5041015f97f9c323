"""timm's ViT block and VisionTransformer with a block loop that passes earlier blocks' values, per call.

Legend: B batch, N tokens, C width, H heads, D head dim.

Elliptical attention reads the previous block's values, NeuTRENO block 0's. :class:`ValuePassingViT` is timm's
``VisionTransformer`` whose forward runs its own loop over its :class:`ValuePassingBlock` blocks: each block's
attention appends its values to a list the loop made for that call, and the loop hands block 0's and the last
block's to the next block, in local variables, as x-transformers passes its ``value_residual``. Blocks and attention
modules are called as modules, so forward hooks on them run (``kpca.attention.capture`` records through them).
Nothing is stored on a module, so concurrent calls, ``nn.DataParallel`` replicas and activation checkpointing
(``set_grad_checkpointing``) each see their own values, and TorchScript, torch.fx and ``torch.compile`` see plain
tensors. Parameters, buffers and their names are timm's: a
state dict moves between this class and timm's, and the same seed draws the same weights.

Needs timm (the ``timm`` extra of kpca-attention); :mod:`kpca.attention.vit` builds every non-softmax ViT with it.
"""

from __future__ import annotations

from typing import Any

import torch
from timm.models import VisionTransformer, checkpoint
from timm.models._features import feature_take_indices  # as timm's VisionTransformer imports it: the same indices
from timm.models.vision_transformer import Block


class ValuePassingBlock(Block):
    """timm's pre-norm ``Block`` (same arguments and parameters) whose call also passes earlier blocks' values.

    ``forward(x, attn_mask, is_causal)`` is timm's; a value-passing loop adds ``first_values``, ``previous_values``
    and ``values_out`` (see :meth:`forward`). An attention module that is not ``kpca.attention``'s (timm's
    ``Attention``, left in blocks a spec does not select) gets timm's call and appends no values.
    """

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        first_values: torch.Tensor | None = None,
        previous_values: torch.Tensor | None = None,
        values_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """(B, N, C) tokens -> (B, N, C) tokens.

        Args:
            x: (B, N, C) tokens.
            attn_mask, is_causal: timm's, for the attention.
            first_values, previous_values: (B, H, N, D) values of block 0 and of the block before in this forward
                (None in block 0), for the attention (``kpca.attention.modules``).
            values_out: a list of the caller's that the attention appends its (B, H, N, D) values to.
        """
        if hasattr(self.attn, "block_index"):  # kpca.attention's modules (resolved when scripted, too)
            out = self.attn(self.norm1(x), attn_mask, is_causal, None, first_values, previous_values, values_out)
        else:
            out = self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)
        x = x + self.drop_path1(self.ls1(out))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class ValuePassingViT(VisionTransformer):
    """timm's ``VisionTransformer`` built with :class:`ValuePassingBlock` blocks, running them in its own loop.

    Takes ``VisionTransformer``'s arguments (``block_fn`` must be :class:`ValuePassingBlock` or a subclass, the
    default). :meth:`forward_features` and :meth:`forward_intermediates` (hence ``get_intermediate_layers`` and
    timm's ``features_only`` models) pass each block the values of block 0 and of the block before, and honour
    ``set_grad_checkpointing``, ``attn_mask`` and ``is_causal`` as timm's do. ``swap_attention`` puts kinds that
    read earlier values only into models that pass them (``passes_earlier_values``).
    """

    passes_earlier_values = True

    def __init__(self, **kwargs: Any) -> None:
        block_fn = kwargs.setdefault("block_fn", ValuePassingBlock)
        if not (isinstance(block_fn, type) and issubclass(block_fn, ValuePassingBlock)):
            raise ValueError(
                f"ValuePassingViT runs ValuePassingBlock blocks, got block_fn={block_fn!r}; leave block_fn out or "
                "pass a subclass of kpca.attention.vit_blocks.ValuePassingBlock"
            )
        super().__init__(**kwargs)

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) images -> (B, prefix + N, C) tokens entering block 0, as timm's ViT."""
        x = self.patch_embed(x)
        x = self._pos_embed(x)
        x = self.patch_drop(x)
        return self.norm_pre(x)

    def forward_features(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        """(B, 3, H, W) images -> (B, prefix + N, C) normalised tokens after every block."""
        x = self._embed(x)
        first: torch.Tensor | None = None
        previous: torch.Tensor | None = None
        for blk in self.blocks:
            values: list[torch.Tensor] = []  # this block's values: a local of this call
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x, attn_mask, is_causal, first, previous, values)
            else:
                x = blk(x, attn_mask, is_causal, first, previous, values)
            if len(values) > 0:
                first = values[0] if first is None else first
                previous = values[0]
        return self.norm(x)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        output_dict: bool = False,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]] | dict[str, Any]:
        """Intermediate block outputs as timm's ``VisionTransformer.forward_intermediates`` gives them, values passed.

        Args:
            x: (B, 3, H, W) images.
            indices: the last n blocks if an int, all if None, else the listed block indices.
            return_prefix_tokens: also return each intermediate's prefix (class) tokens.
            norm: apply the final norm to every intermediate.
            stop_early: run no block after the last one taken.
            output_fmt: ``NCHW`` (B, C, Gh, Gw) or ``NLC`` (B, N, C) intermediates.
            intermediates_only: return the intermediates only.
            output_dict: return ``{"image_intermediates": ..., "image_features": ...}`` (and the prefixes).
            attn_mask, is_causal: as :meth:`forward_features`.

        Returns:
            As timm's: the final (B, prefix + N, C) tokens and the intermediates, the intermediates only, or a dict.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        batch, _, height, width = x.shape
        x = self._embed(x)
        blocks = self.blocks if torch.jit.is_scripting() or not stop_early else self.blocks[: max_index + 1]
        intermediates = []
        first: torch.Tensor | None = None
        previous: torch.Tensor | None = None
        for i, blk in enumerate(blocks):
            values: list[torch.Tensor] = []
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x, attn_mask, is_causal, first, previous, values)
            else:
                x = blk(x, attn_mask, is_causal, first, previous, values)
            if values:
                first = values[0] if first is None else first
                previous = values[0]
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)  # (B, prefix + N, C)
        prefix_tokens = [y[:, : self.num_prefix_tokens] for y in intermediates] if self.num_prefix_tokens else None
        intermediates = [y[:, self.num_prefix_tokens :] for y in intermediates]  # (B, N, C) each
        if output_fmt == "NCHW":
            grid_h, grid_w = self.patch_embed.dynamic_feat_size((height, width))
            intermediates = [
                y.reshape(batch, grid_h, grid_w, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates
            ]  # (B, C, Gh, Gw) each
        if output_dict:
            result: dict[str, Any] = {"image_intermediates": intermediates}
            if prefix_tokens is not None and return_prefix_tokens:
                result["image_intermediates_prefix"] = prefix_tokens
            if not intermediates_only:
                result["image_features"] = self.norm(x)
            return result
        if return_prefix_tokens and prefix_tokens is not None:
            intermediates = list(zip(intermediates, prefix_tokens, strict=True))
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates
