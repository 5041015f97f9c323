"""Sliding-window inference: window placement, equality with whole-image inference, averaging of overlaps, and the
bilinear resize back to the original image against a float64 half-pixel reference."""

import pytest
import torch
from torch import nn

from kpca.segmentation.inference import predict_label_map, resize_logits, slide_inference, window_origins
from kpca.segmentation.model import Segmenter

pytestmark = pytest.mark.mmseg


def test_window_origins_cover_the_side_and_end_flush():
    assert window_origins(512, 512, 512) == [0]
    assert window_origins(300, 512, 512) == [0]
    assert window_origins(683, 512, 512) == [0, 171]  # mmseg: 2 windows, the last one moved back to fit
    assert window_origins(683, 512, 341) == [0, 171]
    assert window_origins(100, 40, 30) == [0, 30, 60]


@pytest.mark.parametrize("size", [(64, 64), (48, 56)])
def test_one_window_covering_the_image_equals_whole_image_inference(size: tuple[int, int]):
    net = Segmenter(num_classes=6, img_size=64, patch_size=8, embed_dim=32, depth=2, num_heads=2).eval()
    images = torch.rand(2, 3, *size)  # (B, C, H, W)
    with torch.no_grad():
        whole = net(images)
    torch.testing.assert_close(slide_inference(net, images, 6, window=64, stride=32), whole, rtol=0, atol=0)


def test_overlapping_windows_average_a_pixelwise_net_exactly():
    net = nn.Conv2d(3, 4, kernel_size=1)  # pixelwise: every window gives the same logits where windows overlap
    images = torch.rand(2, 3, 50, 70)
    with torch.no_grad():
        expected = net(images)
    torch.testing.assert_close(slide_inference(net, images, 4, window=32, stride=16, max_batch=1), expected)


def test_stride_must_be_positive_and_at_most_the_window():
    with pytest.raises(ValueError, match="stride"):
        slide_inference(nn.Identity(), torch.rand(1, 3, 8, 8), 3, window=4, stride=5)


def half_pixel_bilinear(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of (K, H, W) to ``size`` with pixel centres aligned (``align_corners=False``, mmseg's), float64.

    Output pixel i samples the input at (i + 0.5) * in / out - 0.5, clamped at 0, between its two neighbours.
    """

    def along(values: torch.Tensor, axis: int, out: int) -> torch.Tensor:
        size_in = values.shape[axis]
        src = ((torch.arange(out, dtype=torch.float64) + 0.5) * size_in / out - 0.5).clamp_min(0)
        low = src.floor().long().clamp_max(size_in - 1)
        high = (low + 1).clamp_max(size_in - 1)
        weight = (src - low).view([-1 if d == axis else 1 for d in range(values.dim())])
        return values.index_select(axis, low) * (1 - weight) + values.index_select(axis, high) * weight

    return along(along(x.double(), 1, size[0]), 2, size[1])


def test_predictions_are_bilinearly_resized_to_the_original_image_and_labelled_by_argmax():
    torch.manual_seed(0)
    net = nn.Conv2d(3, 5, kernel_size=1)  # pixelwise: the windows' logits are the whole image's
    image = torch.rand(3, 32, 48)  # (C, H, W) at the test scale
    with torch.no_grad():
        expected = half_pixel_bilinear(net(image[None])[0], (70, 100))  # (K, H0, W0), an up-scale by 2.19 x 2.08
    logits, labels = predict_label_map(net, image, (70, 100), 5, window=32, stride=32)
    assert logits.shape == (5, 70, 100) and labels.shape == (70, 100) and labels.dtype == torch.int64
    torch.testing.assert_close(logits.double(), expected, rtol=0, atol=1e-5)  # float32 sampling positions
    assert torch.equal(labels, logits.argmax(0)) and torch.equal(labels, expected.argmax(0))
    small = torch.randn(2, 5, 9, 7)  # (B, K, H, W): a down-scale too
    reference = torch.stack([half_pixel_bilinear(x, (4, 5)) for x in small])  # (B, K, 4, 5)
    torch.testing.assert_close(resize_logits(small, (4, 5)).double(), reference, rtol=0, atol=1e-5)
    assert resize_logits(small, (9, 7)) is small  # already at the original size
