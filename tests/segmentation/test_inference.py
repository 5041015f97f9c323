"""Sliding-window inference: window placement, equality with whole-image inference, and averaging of overlaps."""

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


def test_predictions_are_resized_to_the_original_image():
    net = nn.Conv2d(3, 5, kernel_size=1)
    logits, labels = predict_label_map(net, torch.rand(3, 32, 48), (64, 96), 5, window=32, stride=32)
    assert logits.shape == (5, 64, 96) and labels.shape == (64, 96) and labels.dtype == torch.int64
    assert resize_logits(logits[None], (64, 96)) is not None
