"""DeiT's RandAugment (``rand-m9-mstd0.5-inc1``): batched on a device against timm's per-image Pillow path.

Side by side in one run, on crops of scikit-learn's two sample photographs at 224 px:

* :class:`~kpca.vision_cls.input.device.rand_augment.BatchRandAugment` on a uint8 batch of 256: ms per batch (median of
  ``--repeats`` after two warm-ups; CUDA synchronised) and the same per image;
* timm's RandAugment on Pillow images, one at a time: ms of CPU per image (``time.process_time``), plain and with
  the compiled kernels of :mod:`kpca.vision_cls.input.workers.compiled_rand_augment` (what the workers run today).

Run from the repository root::

    python benchmarks/batch_rand_augment.py                  # CPU tensors, torch's default threads
    python benchmarks/batch_rand_augment.py --threads 1
    python benchmarks/batch_rand_augment.py --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from PIL import Image
from sklearn.datasets import load_sample_images
from timm.data.auto_augment import rand_augment_transform

from kpca.vision_cls.input.device.rand_augment import BatchRandAugment
from kpca.vision_cls.input.policy import timm_train_hparams
from kpca.vision_cls.input.workers.compiled_rand_augment import with_compiled_ops

CONFIG = "rand-m9-mstd0.5-inc1"


def crops(count: int, size: int, seed: int = 0) -> np.ndarray:
    """(count, size, size, 3) uint8 random crops of the two sample photographs."""
    rng = np.random.default_rng(seed)
    photos = load_sample_images().images  # two (427, 640, 3)
    out = np.empty((count, size, size, 3), dtype=np.uint8)
    for index in range(count):
        photo = photos[index % len(photos)]
        top, left = rng.integers(0, photo.shape[0] - size), rng.integers(0, photo.shape[1] - size)
        out[index] = photo[top : top + size, left : left + size]
    return out


def time_batch(augment: BatchRandAugment, batch: torch.Tensor, repeats: int) -> float:
    """Median ms per call of ``augment`` on ``batch``, after two warm-up calls."""
    generator = torch.Generator(batch.device).manual_seed(0)
    times = []
    for index in range(repeats + 2):
        if batch.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        augment(batch, generator)
        if batch.is_cuda:
            torch.cuda.synchronize()
        if index >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def time_pillow(augment, images: list[Image.Image]) -> float:
    """CPU time per image (ms) of timm's per-image ``augment``."""
    augment(images[0])  # warm-up (numba's compiled kernels load here)
    start = time.process_time()
    for image in images:
        augment(image)
    return (time.process_time() - start) * 1e3 / len(images)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="device of the batch: cpu or cuda")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=5, help="timed batches (median)")
    parser.add_argument("--pillow-images", type=int, default=256, help="images for the per-image Pillow timings")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pixels = crops(args.batch, args.size)
    batch = torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous().to(args.device)  # (B, C, H, W) uint8
    batched = time_batch(BatchRandAugment(CONFIG), batch, args.repeats)

    timm_augment = rand_augment_transform(CONFIG, timm_train_hparams())
    images = [Image.fromarray(image) for image in pixels[: args.pillow_images]]
    plain, compiled = time_pillow(timm_augment, images), time_pillow(with_compiled_ops(timm_augment), images)

    device = torch.cuda.get_device_name() if batch.is_cuda else f"CPU, {torch.get_num_threads()} torch threads"
    print(f"{CONFIG} at {args.size} px")
    per_image = batched / args.batch
    print(f"BatchRandAugment, batch {args.batch} on {device}: {batched:.1f} ms/batch, {per_image:.3f} ms/img")
    print(f"timm RandAugment on Pillow, 1 CPU thread:        {plain:.3f} ms CPU/img")
    print(f"timm RandAugment + compiled kernels (workers):   {compiled:.3f} ms CPU/img")


if __name__ == "__main__":
    main()
