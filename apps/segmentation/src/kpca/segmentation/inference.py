"""Single-scale sliding-window inference (mmseg's ``slide_inference``) and resizing back to the original image.

Legend: B batch, C channels (3), H x W image, h x w window, K classes, Wn windows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kpca.training.errors import OptionError


def window_origins(size: int, window: int, stride: int) -> list[int]:
    """Start offsets of the windows along one side of ``size`` pixels, the last one flush with the end.

    As mmseg: ``max(size - window + stride - 1, 0) // stride + 1`` windows, shifted back to fit; one window at 0
    when ``size <= window`` (the window is then the whole side).
    """
    count = max(size - window + stride - 1, 0) // stride + 1
    return sorted({max(min(i * stride, size - window), 0) for i in range(count)})


@torch.no_grad()
def slide_inference(
    net: nn.Module, images: torch.Tensor, num_classes: int, window: int = 512, stride: int = 512, max_batch: int = 8
) -> torch.Tensor:
    """Average the logits of overlapping ``window`` x ``window`` crops over (B, 3, H, W) pixel images.

    Each crop is ``min(window, H)`` x ``min(window, W)``, so an image no larger than the window is one crop: the
    whole image. Crops run through ``net`` in chunks of ``max_batch``.

    Args:
        net: (b, 3, h, w) images -> (b, K, h, w) logits (``Segmenter``).
        images: (B, 3, H, W) float images.
        num_classes: K.
        window: window side in pixels.
        stride: step between windows (``stride == window``: no overlap, the paper's setting).
        max_batch: crops per forward pass.

    Returns:
        (B, K, H, W) float32 logits.
    """
    if not 0 < stride <= window:
        raise OptionError(f"need 0 < stride <= window, got stride={stride}, window={window}")
    b, _, h, w = images.shape
    boxes = [(y, x) for y in window_origins(h, window, stride) for x in window_origins(w, window, stride)]
    hw, ww = min(window, h), min(window, w)
    crops = torch.cat([images[..., y : y + hw, x : x + ww] for y, x in boxes])  # (Wn * B, 3, h, w)
    logits = torch.cat([net(chunk).float() for chunk in crops.split(max_batch * b)])  # (Wn * B, K, h, w)
    total = images.new_zeros(b, num_classes, h, w, dtype=torch.float32)  # (B, K, H, W)
    count = images.new_zeros(1, 1, h, w, dtype=torch.float32)  # (1, 1, H, W)
    for (y, x), window_logits in zip(boxes, logits.split(b), strict=True):
        total[..., y : y + hw, x : x + ww] += window_logits
        count[..., y : y + hw, x : x + ww] += 1
    return total / count


def resize_logits(logits: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinearly resize (B, K, H, W) logits to ``size`` = (H0, W0), the original image (mmseg's postprocess)."""
    if tuple(logits.shape[-2:]) == tuple(size):
        return logits
    return F.interpolate(logits, size=size, mode="bilinear", align_corners=False)  # (B, K, H0, W0)


def predict_label_map(
    net: nn.Module, image: torch.Tensor, size: tuple[int, int], num_classes: int, window: int, stride: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and predicted labels of one (3, H, W) image at its original ``size``: ((K, H0, W0), (H0, W0))."""
    logits = resize_logits(slide_inference(net, image[None], num_classes, window, stride), size)[0]  # (K, H0, W0)
    return logits, logits.argmax(0)
