"""TensorBoard callback: predictions of a fixed set of validation images, overlaid on the images.

Legend: C channels (3), H0 x W0 original image, K classes.
"""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_only
from PIL import Image

from kpca.segmentation.data import SegmentationData
from kpca.segmentation.metrics import IGNORE_INDEX
from kpca.training.callbacks import tensorboard_writer
from kpca.training.data import require_datamodule
from kpca.training.errors import OptionError
from kpca.training.files import write_atomic
from kpca.training.predictions import TablePredictionWriter


def overlay(image: torch.Tensor, labels: torch.Tensor, palette: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """Blend class colours into an image; ignored pixels (255) keep the image.

    Args:
        image: (3, H, W) float image in [0, 1] (resized to the labels' size if it differs).
        labels: (H0, W0) int labels in [0, K) or 255.
        palette: (K, 3) float colours in [0, 1].
        alpha: weight of the colours.

    Returns:
        (3, H0, W0) float image in [0, 1].
    """
    if image.shape[-2:] != labels.shape:
        image = F.interpolate(image[None], size=labels.shape, mode="bilinear", align_corners=False)[0]
    labelled = labels != IGNORE_INDEX  # (H0, W0)
    colours = palette[labels.clamp(max=palette.shape[0] - 1)].permute(2, 0, 1)  # (3, H0, W0)
    blended = torch.where(labelled, (1 - alpha) * image + alpha * colours, image)
    return blended.clamp(0, 1)


class SegmentationOverlays(pl.Callback):
    """After each validation epoch, log [image | ground truth | prediction] overlays to TensorBoard (rank 0).

    The images are the first ``num_images`` of the first validation batches, taken once; the predictions use the
    module's sliding-window inference at the original size. Tags: ``predictions/<image name>``.

    Args:
        num_images: images shown.
        alpha: weight of the class colours in the overlay.
    """

    def __init__(self, num_images: int = 4, alpha: float = 0.5) -> None:
        if num_images < 0 or not 0.0 <= alpha <= 1.0:
            raise OptionError(
                f"overlays.num_images={num_images} must be 0 (no overlays) or more and overlays.alpha={alpha} in [0, 1]"
            )
        self.num_images = num_images
        self.alpha = alpha
        self._samples: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        for name, image, label in zip(batch["names"], batch["images"], batch["labels"], strict=True):
            if len(self._samples) < self.num_images:
                self._samples.append((name, image.detach().cpu(), label.detach().cpu()))

    @rank_zero_only
    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        writer = tensorboard_writer(trainer)
        if writer is None or not self._samples or trainer.sanity_checking:
            return
        palette = require_datamodule(trainer, SegmentationData).palette
        palette = torch.tensor(palette, dtype=torch.float32) / 255.0  # (K, 3)
        for name, image, label in self._samples:
            pred = pl_module.predict_image(image.to(pl_module.device), label.shape)[1].cpu()  # (H0, W0)
            plain = overlay(image, torch.full_like(label, IGNORE_INDEX), palette)
            panels = [plain, overlay(image, label, palette, self.alpha), overlay(image, pred, palette, self.alpha)]
            writer.add_image(f"predictions/{name}", torch.cat(panels, dim=-1), global_step=trainer.global_step)


class LabelMapWriter(TablePredictionWriter):
    """``segmentation predict``: each validation image's label map as a PNG, listed in ``predictions.csv``.

    The maps go to ``<run folder>/predictions/<image name>.png``, written by the process that predicted them: 8-bit
    grayscale at the image's original size, each pixel its class index (0-149 for ADE20K, the ground truth's
    numbering after ``reduce_zero_label``). ``predictions.csv`` lists ``index`` (in the validation set), ``name``,
    ``label_map`` (the PNG's path in the run folder), ``height`` and ``width``.
    """

    def rows(self, trainer, predictions, indices, run_folder) -> list[dict]:
        folder = run_folder / "predictions"
        folder.mkdir(parents=True, exist_ok=True)
        maps = [pair for batch in predictions for pair in zip(batch["names"], batch["preds"], strict=True)]
        rows = []
        for index, (name, pred) in zip(indices, maps, strict=True):
            path = folder / f"{name}.png"
            image = Image.fromarray(pred.cpu().numpy().astype(np.uint8))  # (H0, W0) class indices
            write_atomic(path, lambda stream, image=image: image.save(stream, format="PNG"))
            height, width = pred.shape
            rows.append({"index": index, "name": name, "label_map": f"predictions/{path.name}", "height": height,
                         "width": width})  # fmt: skip
        return rows
