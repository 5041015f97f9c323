"""TensorBoard callback: class-token attention maps of a fixed batch (the RPC diagnostics are kpca.training's).

Legend: B batch, H heads, N tokens (1 class token + P patches), D head dim, G = sqrt(P) patch grid.
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_only
from torch import nn

from kpca.attention import RPCAttention
from kpca.attention.capture import project_qkv, record_attention_inputs
from kpca.training.callbacks import tensorboard_writer
from kpca.training.data import require_datamodule
from kpca.training.predictions import TablePredictionWriter
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.data_checks import sample_path


def class_token_attention(attn: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Attention of the class token over the tokens, for the block input ``tokens``.

    Recomputes the attention probabilities of ``attn`` (timm ``Attention`` or ours; for RPC the
    last PAP evaluation, ``softmax(Kt Ktᵀ / sqrt(D))``) on (B, N, C) tokens.

    Returns:
        (B, H, N) probabilities of row 0 (the class token).
    """
    if isinstance(attn, RPCAttention):
        record, attn.record_state = attn.record_state, True
        attn(tokens)
        attn.record_state = record
        q = k = attn.last_state.k_clean  # (B, H, N, D)
    else:
        q, k, _, _ = project_qkv(attn, tokens)  # (B, H, N, D) each; q is k for symmetric attention
    scores = q[:, :, :1] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, 1, N)
    return scores.float().softmax(-1)[:, :, 0]  # (B, H, N)


class AttentionMaps(pl.Callback):
    """After each validation epoch, log class-token attention maps of a fixed batch to TensorBoard (rank 0).

    The batch is the first ``num_images`` validation images, taken once. For each chosen block
    the image shows the input next to the head-averaged attention of the class token over patches.

    Args:
        num_images: images in the fixed batch.
        blocks: block indices to show (negative counts from the end).
    """

    def __init__(self, num_images: int = 4, blocks: list[int] = [0, -1]) -> None:  # noqa: B006 (CLI default)
        self.num_images = num_images
        self.blocks = list(blocks)
        self._images: torch.Tensor | None = None

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self._images is None and batch_idx == 0:
            self._images = batch[0][: self.num_images].detach().cpu()

    @rank_zero_only
    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        writer = tensorboard_writer(trainer)
        if writer is None or self._images is None or trainer.sanity_checking:
            return
        vit = pl_module.net.vit
        with torch.no_grad(), record_attention_inputs(vit) as inputs:
            pl_module.net(self._images.to(pl_module.device))
        for i in self.blocks:
            block = range(len(vit.blocks))[i]  # a negative index counts from the end
            maps = self._maps(vit.blocks[block].attn, inputs[f"blocks.{block}.attn"], vit)
            writer.add_images(f"attention/block{i}", maps, global_step=trainer.global_step)

    @torch.no_grad()
    def _maps(self, attn: nn.Module, tokens: torch.Tensor, vit: nn.Module) -> torch.Tensor:
        prefix = getattr(vit, "num_prefix_tokens", 1)
        probs = class_token_attention(attn, tokens).mean(1)[:, prefix:]  # (B, P)
        grid = int(math.isqrt(probs.shape[-1]))
        heat = probs.view(-1, 1, grid, grid)  # (B, 1, G, G)
        heat = heat / heat.amax((-2, -1), keepdim=True).clamp_min(1e-12)
        images = self._images
        heat = F.interpolate(heat.cpu(), size=images.shape[-2:], mode="nearest").expand(-1, 3, -1, -1)
        return torch.cat([images, heat], dim=-1).clamp(0, 1)  # (B, 3, H, 2W)


class ClassPredictionWriter(TablePredictionWriter):
    """``vision-cls predict``: each validation image's top-5 classes and probabilities, to ``predictions.csv``.

    Columns: ``index`` (in the validation set), ``file``, ``label`` (its class folder), ``prediction`` (the top-1
    class), ``probability`` (its softmax probability) and ``top5`` (the five likeliest classes, likeliest first).
    """

    def rows(self, trainer, predictions, indices, run_folder) -> list[dict]:
        data = require_datamodule(trainer, ImageNetDataModule)
        classes = data.classes
        probabilities = torch.cat([batch.float().cpu() for batch in predictions]) if predictions else torch.empty(0, 0)
        k = min(5, len(classes))
        top = probabilities.topk(k, dim=-1) if len(indices) else None  # (N, k) values and indices
        rows = []
        for row, index in enumerate(indices):
            file = Path(sample_path(data.val_set, index))
            best = top.indices[row].tolist()
            rows.append(
                {
                    "index": index,
                    "file": str(file),
                    "label": file.parent.name,
                    "prediction": classes[best[0]],
                    "probability": f"{top.values[row, 0].item():.6f}",
                    "top5": " ".join(classes[c] for c in best),
                }
            )
        return rows
