"""CPU cost of each app's training input pipeline per core, and how many cores one GPU needs to stay fed.

All timings are single-threaded (torch, OpenCV) in one process, on real photographs: scikit-learn's two sample
images re-encoded as JPEG (quality 90) at ImageNet's typical 500x375 and 375x500, written to a temporary folder.

1. Vision (DeiT recipe, :class:`~kpca.vision_cls.data.ImageNetDataModule`): per stage in ms per image on one core,
   for the reference path (timm's PIL transform, ``input="timm"``, with ``augment_on="workers"``: ToTensor and
   random erasing per image in the workers), the device path (``augment_on="device"``: the workers stop at a uint8
   tensor; the float conversion and random erasing run batched on the device) and the default turbo path
   (``input="turbo"``, ``augment_on="device"``: libjpeg-turbo decode, crop, resize and flip on uint8 tensors,
   :mod:`kpca.vision_cls.input.workers.turbo`), and the turbo path with RandAugment moved to the device
   (``augment_on="device_randaugment"``: the workers stop after the flip). The paths run interleaved, image by
   image, in one loop, so background load hits all alike. The device tail is timed on the CPU on a batch of 64 as
   an upper bound (a GPU runs it in microseconds); the batched RandAugment of ``device_randaugment`` on a batch of
   256 at 224 px on ``--device`` (one CPU thread here, CUDA in ``make test-gpu``). Neither is part of the worker
   cost. Targets: the ``device_randaugment`` path at least 1.6x the default turbo path's images/s per core, and
   (on CUDA) its RandAugment under 5 % of a DeiT-tiny bf16 training step on an H200 (33.51 ms measured).
2. Cores one GPU needs: the GPU's training rate divided by the images/s one core delivers. Rates: one eager bf16
   training step at batch 256 measured by this project on an H200 with torch 2.11 (deit_tiny 7,639, deit_small
   5,577 images/s; DeiT-base was not measured), and RTX 3090 AMP training rates from timm's table
   (``results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv`` in huggingface/pytorch-image-models: deit_tiny
   2290.53, deit_small 1053.64, deit_base 390.88 images/s).
3. Segmentation: mmseg's ADE20K training pipeline at 512 crop (:func:`kpca.segmentation.data.train_pipeline`) on a
   synthetic ADE20K-like folder (the photos at 683x512 and blocky 150-class label PNGs), per image.
4. Language model: :class:`~kpca.language_model.data.TokenBlocks` batches (96 x 256 tokens, the paper's) over the
   built-in corpus (``data_dir: builtin``, the demo's 2000-piece tokenizer; tokenised once into the cache), in
   tokens/s per core.

5. With ``--dali cpu`` or ``--dali gpu``, the DALI path (``data.train.input: dali``,
   :class:`~kpca.vision_cls.input.dali.loader.DaliTrainLoader`, the DeiT recipe at 224 px) beside the vision paths,
   instead of sections 3-4: its CPU time per image, summed over all threads of the process (``time.process_time``),
   and its wall images/s. ``cpu`` runs DALI's CPU operators in one thread (ms·core per image, comparable with the
   table); ``gpu`` decodes with nvJPEG (``mixed``) and augments on CUDA device 0 with 4 CPU threads, so its CPU time
   is what the GPU path still asks of the host.

Run from the repository root (about a minute on 2 busy cores)::

    python benchmarks/input_pipeline.py                # Markdown on stdout
    python benchmarks/input_pipeline.py --images 600 --output bench.md
    python benchmarks/input_pipeline.py --dali gpu --output dali_gpu.md
    python benchmarks/input_pipeline.py --device cuda  # the batched RandAugment timed on the GPU (make test-gpu)
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image
from sklearn.datasets import load_sample_images

RTX3090_AMP_RATES = {"deit_tiny": 2290.53, "deit_small": 1053.64, "deit_base": 390.88}  # timm's table, images/s
H200_BF16_RATES = {"deit_tiny": 7639, "deit_small": 5577}
"""images/s of one eager bf16 training step (batch 256, 224 px, fused AdamW, softmax attention) measured on one H200
with torch 2.11 (``benchmarks/vision_cls.py --device cuda``'s rows); DeiT-base was not measured there."""
H200_DEIT_TINY_STEP_MS = 33.51
"""The DeiT-tiny step of :data:`H200_BF16_RATES` in ms: the device-side augment's budget is 5 % of it."""
DEVICE_RANDAUGMENT_PATH = "`input: turbo`, `augment_on: device_randaugment`"
DEVICE_RANDAUGMENT_BATCH = 256
MIN_SPEEDUP = 1.6  # images/s per core of the device_randaugment path over the default turbo path
IMAGENET_SIZES = ((500, 375), (375, 500))  # (width, height): ImageNet's most common shapes
ADE20K_SIZE = (683, 512)
DEVICE_BATCH = 64
Stage = tuple[str, Callable]


def write_photos(folder: Path, sizes: tuple[tuple[int, int], ...], quality: int = 90) -> list[Path]:
    """Scikit-learn's sample photos resized to each of ``sizes`` and saved as JPEG in ``folder``."""
    paths = []
    for index, photo in enumerate(load_sample_images().images):
        for width, height in sizes:
            path = folder / f"photo{index}_{width}x{height}.jpg"
            Image.fromarray(photo).resize((width, height), Image.BICUBIC).save(path, quality=quality)
            paths.append(path)
    return paths


def decode(path: Path) -> Image.Image:
    """ImageFolder's loader: open and decode to RGB."""
    with open(path, "rb") as f:
        return Image.open(f).convert("RGB")


def turbo_decode(path: Path) -> torch.Tensor:
    """The turbo path's loader and first stage: read the file's bytes, decode with libjpeg-turbo (or PIL)."""
    from kpca.vision_cls.input.workers.turbo import DecodeRGB, read_image_bytes

    return DecodeRGB()(read_image_bytes(str(path)))


def stage_name(stage: Callable) -> str:
    """The column of a transform stage in the table."""
    names = {
        "RandomResizedCropAndInterpolation": "crop",
        "TensorRandomResizedCrop": "crop",
        "RandomHorizontalFlip": "flip",
        "TensorHorizontalFlip": "flip",
        "hwc_to_pil": "to PIL",
        "pil_to_chw": "PILToTensor",
        "RandAugment": "randaug",
        "PixelSpaceRandomErasing": "erasing",
    }
    name = getattr(stage, "__name__", type(stage).__name__)
    return names.get(name, name)


def vision_paths(root: Path) -> dict[str, list[Stage]]:
    """The stages of each vision path: decode, then the training transform's stages one by one."""
    from kpca.vision_cls.data import ImageNetDataModule
    from kpca.vision_cls.input import TrainData

    paths = {}
    for label, path, augment_on in (
        ("reference: `input: timm`, `augment_on: workers`", "timm", "workers"),
        ("`input: timm`, `augment_on: device`", "timm", "device"),
        ("`input: turbo`, `augment_on: device` (the default)", "turbo", "device"),
        (DEVICE_RANDAUGMENT_PATH, "turbo", "device_randaugment"),
    ):
        data = ImageNetDataModule(root=str(root), train=TrainData(input=path, augment_on=augment_on))
        transform = data.train_input.transform()
        stages = transform.transforms
        if path == "turbo":
            stages = stages[1:]  # its DecodeRGB stage runs inside turbo_decode, timed as "decode"
        paths[label] = [("decode", decode if path == "timm" else turbo_decode)]
        paths[label] += [(stage_name(stage), stage) for stage in stages]
    return paths


def time_stages(stages: list[Stage], item: object, totals: dict[str, float]) -> None:
    """Run ``stages`` on ``item`` in turn, adding each stage's seconds to ``totals``."""
    for name, stage in stages:
        start = time.perf_counter()
        item = stage(item)
        totals[name] = totals.get(name, 0.0) + time.perf_counter() - start


def seed_generators(seed: int) -> None:
    """Seed every generator the training transforms draw from (Python, numpy, torch)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def bench_vision(photos: list[Path], root: Path, images: int) -> dict[str, dict[str, float]]:
    """Mean ms per image of every stage of every vision path, the paths interleaved image by image.

    The generators are seeded with the image's index before each path runs it, so every path draws the same crop
    box, flip and RandAugment ops for it: the paths differ only in how they compute the pixels.
    """
    paths = vision_paths(root)
    totals: dict[str, dict[str, float]] = {label: {} for label in paths}
    for warmup in photos * 10:  # also compiles the turbo path's RandAugment kernel (numba) before timing
        for stages in paths.values():
            time_stages(stages, warmup, {})
    for i in range(images):
        for label, stages in paths.items():
            seed_generators(i)
            time_stages(stages, photos[i % len(photos)], totals[label])
    return {label: {k: 1e3 * v / images for k, v in stage.items()} for label, stage in totals.items()}


def bench_device_tail(root: Path, repeats: int = 5) -> float:
    """Milliseconds per image of the device tail (uint8 -> float, batched erasing) on the CPU, batch of 64."""
    from kpca.vision_cls.data import ImageNetDataModule

    tail = ImageNetDataModule(root=str(root)).train_input.device_tail
    batch = torch.randint(0, 256, (DEVICE_BATCH, 3, 224, 224), dtype=torch.uint8)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        tail(batch)
        times.append(time.perf_counter() - start)
    return 1e3 * min(times) / DEVICE_BATCH


def bench_device_rand_augment(root: Path, device: str, repeats: int = 3) -> float:
    """Milliseconds per batch of 256 uint8 224 px images of ``augment_on: device_randaugment``'s RandAugment.

    The median of ``repeats`` batches after one warm-up batch, synchronised on CUDA; on the CPU with one thread.
    """
    from kpca.vision_cls.data import ImageNetDataModule
    from kpca.vision_cls.input import TrainData

    data = ImageNetDataModule(root=str(root), train=TrainData(augment_on="device_randaugment"))
    rand_augment = data.train_input.device_tail.rand_augment
    batch = torch.randint(0, 256, (DEVICE_RANDAUGMENT_BATCH, 3, 224, 224), dtype=torch.uint8, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rand_augment(batch)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        rand_augment(batch)
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def device_rand_augment_lines(vision: dict[str, dict[str, float]], rand_augment_ms: float, device: str) -> list[str]:
    """Markdown: the device-side RandAugment's cost per batch, and the target lines."""
    per_core = {label: 1e3 / sum(stage.values()) for label, stage in vision.items()}
    where = "on CUDA device 0" if device == "cuda" else "on this CPU, one thread (a GPU runs it after transfer)"
    return [
        "",
        f"RandAugment of `augment_on: device_randaugment`, batched, {where}: {rand_augment_ms:.1f} ms per batch of "
        f"{DEVICE_RANDAUGMENT_BATCH} uint8 images at 224 px ({rand_augment_ms / DEVICE_RANDAUGMENT_BATCH:.2f} ms per "
        "image); not part of the workers' cost.",
        "",
        "Targets:",
        "",
        *targets(per_core, rand_augment_ms, device),
    ]


def targets(per_core: dict[str, float], rand_augment_ms: float, device: str) -> list[str]:
    """The target lines (``- name: value (target ...) PASS|FAIL``): worker speed-up, and the device cost on CUDA."""
    speedup = per_core[DEVICE_RANDAUGMENT_PATH] / per_core["`input: turbo`, `augment_on: device` (the default)"]
    lines = [
        f"- images/s per core, `augment_on: device_randaugment` / the default turbo path: {speedup:.2f} "
        f"(target >= {MIN_SPEEDUP}) {'PASS' if speedup >= MIN_SPEEDUP else 'FAIL'}"
    ]
    if device == "cuda":
        share = rand_augment_ms / H200_DEIT_TINY_STEP_MS
        lines.append(
            f"- device RandAugment per batch of {DEVICE_RANDAUGMENT_BATCH} / a DeiT-tiny bf16 step on an H200 "
            f"({H200_DEIT_TINY_STEP_MS} ms): {share:.3f} (target <= 0.05) {'PASS' if share <= 0.05 else 'FAIL'}"
        )
    return lines


def write_imagenet_tree(folder: Path, photos: list[Path]) -> Path:
    """A one-class ImageFolder tree (train and val) so that the datamodule can be built; returns its root."""
    for split in ("train", "val"):
        (folder / split / "n00000000").mkdir(parents=True)
        (folder / split / "n00000000" / photos[0].name).write_bytes(photos[0].read_bytes())
    return folder


def write_ade20k_like(folder: Path, photos: list[Path]) -> Path:
    """An ADE20K-layout training folder: the photos at 683x512 and blocky label PNGs with values 0-150."""
    images, labels = folder / "images" / "training", folder / "annotations" / "training"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for path in photos:
        Image.open(path).resize(ADE20K_SIZE, Image.BICUBIC).save(images / path.name, quality=90)
        blocks = rng.integers(0, 151, size=(8, 11), dtype=np.uint8)  # (8, 11) regions of 64 px
        label = np.kron(blocks, np.ones((64, 64), dtype=np.uint8))[: ADE20K_SIZE[1], : ADE20K_SIZE[0]]
        Image.fromarray(label).save(labels / f"{path.stem}.png")
    return folder


def bench_segmentation(photos: list[Path], folder: Path, images: int) -> float:
    """Milliseconds per image of mmseg's ADE20K training pipeline at 512 crop."""
    from kpca.segmentation.data import MMSegDataset, build_transforms, train_pipeline

    dataset = MMSegDataset(write_ade20k_like(folder, photos), "train", build_transforms(train_pipeline()))
    dataset[0]
    start = time.perf_counter()
    for i in range(images):
        dataset[i % len(dataset)]
    return 1e3 * (time.perf_counter() - start) / images


def bench_tokens(batches: int, batch_size: int = 96) -> float:
    """Tokens per second of the language model's training loader (main process) over the built-in corpus.

    The loader is iterated in whole epochs until at least ``batches`` full batches' worth of tokens have passed.
    """
    from kpca.language_model.data import WikiTextDataModule
    from kpca.language_model.tokenizer import TokenizerConfig

    tokenizer = TokenizerConfig(vocab_size=2000)  # the demo's; the built-in corpus is too small for 32000 pieces
    data = WikiTextDataModule(
        data_dir="builtin", tokenizer=tokenizer, batch_size=batch_size, num_workers=0, word_swap=None
    )
    data.prepare_data()
    data.setup("fit")
    loader = data.train_dataloader()
    start = time.perf_counter()
    tokens = 0
    while tokens < batches * batch_size * data.context:  # the built-in corpus is small: several epochs
        for inputs, _ in loader:
            tokens += inputs.numel()
    return tokens / (time.perf_counter() - start)


def vision_table(results: dict[str, dict[str, float]], device_tail_ms: float) -> list[str]:
    """Markdown: ms per image per stage, images/s per core, and the speed-up over the reference path."""
    stages = list(dict.fromkeys(name for stage in results.values() for name in stage))
    reference = sum(next(iter(results.values())).values())
    lines = [
        "| path | " + " | ".join(stages) + " | total ms·core | images/s per core | speed-up |",
        "|---" * (len(stages) + 4) + "|",
    ]
    for label, stage in results.items():
        total = sum(stage.values())
        cells = " | ".join(f"{stage[s]:.2f}" if s in stage else "-" for s in stages)
        lines.append(f"| {label} | {cells} | {total:.2f} | {1e3 / total:.0f} | {reference / total:.2f}x |")
    lines.append("")
    lines.append(
        f"Device tail of `augment_on: device` (uint8 -> float, batched random erasing), timed on this CPU on a batch "
        f"of {DEVICE_BATCH}: {device_tail_ms:.2f} ms per image (on the GPU it runs after transfer, not in the workers)."
    )
    return lines


def cores_table(per_core: dict[str, float]) -> list[str]:
    """Markdown: cores one GPU needs for each DeiT size, per vision path (measured GPU rates only)."""
    columns = [(f"{m} H200", r) for m, r in H200_BF16_RATES.items()]
    columns += [(f"{m} RTX 3090", r) for m, r in RTX3090_AMP_RATES.items()]
    lines = ["| path | " + " | ".join(name for name, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for label, rate in per_core.items():
        lines.append(f"| {label} | " + " | ".join(f"{r / rate:.1f}" for _, r in columns) + " |")
    lines.append("")
    lines.append(
        "GPU rates, images/s: H200, one eager bf16 training step at batch 256 measured by this project with torch 2.11 "
        f"({', '.join(f'{m} {r:,}' for m, r in H200_BF16_RATES.items())}; DeiT-base not measured); RTX 3090, AMP "
        "training from timm's `benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv` "
        f"({', '.join(f'{m} {r}' for m, r in RTX3090_AMP_RATES.items())}). Cores count the workers' transform only: "
        "the training process and the device-side augment need their own."
    )
    return lines


DALI_SETTINGS = {"cpu": (1, 32, 10), "gpu": (4, 256, 40)}  # threads, batch, timed batches


def bench_dali(photos: list[Path], device: str) -> dict[str, float]:
    """CPU ms per image (all threads of the process) and wall images/s of the DALI loader, DeiT recipe at 224.

    One epoch warms up (pipeline build, nvJPEG start); in the next, the clocks start after its first batch (the
    epoch's pipeline build) and stop when the last batch is on the device.
    """
    from timm.data import IMAGENET_DEFAULT_MEAN
    from torch.utils.data import DistributedSampler

    from kpca.vision_cls.input.dali.loader import DaliTrainLoader
    from kpca.vision_cls.input.dali.recipe import DaliTrainRecipe

    threads, batch, batches = DALI_SETTINGS[device]
    samples = [(str(photos[i % len(photos)]), 0) for i in range(batch * (batches + 1))]
    sampler = DistributedSampler(samples, num_replicas=1, rank=0, shuffle=True, seed=0)
    recipe = DaliTrainRecipe.from_timm(224, (0.08, 1.0), 0.5, "rand-m9-mstd0.5-inc1", "bicubic", IMAGENET_DEFAULT_MEAN)
    target = torch.device("cuda", 0) if device == "gpu" else torch.device("cpu")
    loader = DaliTrainLoader(samples, sampler, recipe, batch, target, num_threads=threads, seed=0)
    for _ in loader:  # warm-up epoch
        pass
    sampler.set_epoch(1)
    epoch = iter(loader)
    next(epoch)
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    for _ in epoch:
        pass
    if device == "gpu":
        torch.cuda.synchronize()
    cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    return {"threads": threads, "batch": batch, "images": batch * batches, "cpu_ms": 1e3 * cpu / (batch * batches),
            "images_per_s": batch * batches / wall}  # fmt: skip


def dali_table(dali: dict[str, float], device: str, reference_ms: float) -> list[str]:
    """Markdown: the DALI path's CPU time per image and wall rate, and its CPU time against the reference's."""
    operators = "nvJPEG (`mixed`) + CUDA" if device == "gpu" else "CPU"
    name = torch.cuda.get_device_name(0) if device == "gpu" else "this CPU"
    return [
        "| path | operators | threads | batch | images | CPU ms per image (all threads) | wall images/s "
        "| CPU per image / reference's |",
        "|---|---|---|---|---|---|---|---|",
        f"| DALI (`data.input: dali`) | {operators} | {dali['threads']} | {dali['batch']} | {dali['images']} | "
        f"{dali['cpu_ms']:.2f} | {dali['images_per_s']:.0f} | {dali['cpu_ms'] / reference_ms:.2f}x |",
        "",
        f"Measured on {name}; the reference is the first row of the table above ({reference_ms:.2f} ms·core).",
    ]


def main() -> None:
    """Run every benchmark and print one Markdown report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300, help="vision images per path")
    parser.add_argument("--seg-images", type=int, default=40, help="segmentation images")
    parser.add_argument("--token-batches", type=int, default=200, help="language-model batches")
    parser.add_argument("--output", type=Path, default=None, help="also write the Markdown here")
    parser.add_argument(
        "--dali", choices=("cpu", "gpu"), default=None, help="time the DALI path too (vision sections only)"
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the device-side RandAugment is timed"
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA device.")
    if args.dali == "gpu" and not torch.cuda.is_available():
        parser.error("--dali gpu needs a CUDA device; --dali cpu times DALI's CPU operators.")
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    random.seed(0)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "photos").mkdir()
        photos = write_photos(folder / "photos", IMAGENET_SIZES)
        root = write_imagenet_tree(folder / "imagenet", photos)
        vision = bench_vision(photos, root, args.images)
        device_tail_ms = bench_device_tail(root)
        rand_augment_ms = bench_device_rand_augment(root, args.device)
        if args.dali:
            dali = bench_dali(photos, args.dali)
            lines = ["## Vision: DeiT training transform, ms·core per image per stage", ""]
            lines += vision_table(vision, device_tail_ms)
            lines += device_rand_augment_lines(vision, rand_augment_ms, args.device)
            lines += ["", f"## Vision: the DALI path, {args.dali}", ""]
            lines += dali_table(dali, args.dali, sum(next(iter(vision.values())).values()))
            report = "\n".join(lines) + "\n"
            print(report)
            if args.output:
                args.output.write_text(report)
            return
        seg_ms = bench_segmentation(photos, folder / "ade20k", args.seg_images)
    tokens_per_s = bench_tokens(args.token_batches)
    per_core = {label: 1e3 / sum(stage.values()) for label, stage in vision.items()}
    lines = ["## Vision: DeiT training transform, ms·core per image per stage", ""]
    lines += vision_table(vision, device_tail_ms)
    lines += device_rand_augment_lines(vision, rand_augment_ms, args.device)
    lines += ["", "## Cores one GPU needs (vision)", ""]
    lines += cores_table(per_core)
    lines += ["", "## All apps, one core", ""]
    lines += ["| app | pipeline | ms·core per item | per core |", "|---|---|---|---|"]
    for label, rate in per_core.items():
        lines.append(f"| vision_cls | {label} | {1e3 / rate:.2f} | {rate:.0f} images/s |")
    lines.append(f"| segmentation | mmseg ADE20K train, 512 crop | {seg_ms:.2f} | {1e3 / seg_ms:.1f} images/s |")
    lines.append(
        f"| language_model | TokenBlocks 96x256 | {1e3 * 96 * 256 / tokens_per_s:.3f} per batch | "
        f"{tokens_per_s / 1e6:.1f} M tokens/s |"
    )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        args.output.write_text(report)


if __name__ == "__main__":
    main()
