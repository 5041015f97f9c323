"""Training-step time of Segmenter-tiny with symmetric and with RPC attention at the paper's ADE20K size.

Each row (attention x eager / compiled) runs in a fresh Python process: one training step of
:class:`~kpca.segmentation.model.Segmenter` as the app trains it, built from the app's configs of the paper's
set-up (``configs/segmentation/segmenter-tiny_{symmetric,rpc}_8xb1-64e_ade20k-512.yaml``: DeiT-tiny encoder, 2-block
mask transformer, 150 classes, 512 x 512 crops, drop path 0.1, decoder dropout 0.1; RPC: 6 PAP iterations in encoder
block 0 and decoder block 0, backend auto, i.e. Triton on CUDA and torch on CPU). The step is
:func:`~kpca.segmentation.module.segmentation_loss` of the forward (bf16 autocast on CUDA, fp32 on CPU) on random
images in [0, 1] and random labels, backward, and the configs' SGD (lr 1e-3, momentum 0.9). Compiled, the network's
``SegmentationModule.compiled_methods`` are compiled in place, as ``--model.compile true`` does. ``--warmup``
untimed steps (the first one, compiled, includes the compilation and is reported), then the median of ``--steps``
timed steps, each synchronised. The table gives img/s, ms/step, the ratio to the symmetric model of the same mode and
the peak GPU memory (``max_memory_allocated``).

The batch is 8 by default: the paper's global batch (8 GPUs x 1 image), here on one device.

Run from the repository root::

    python benchmarks/segmentation.py --device cuda --output segmentation_cuda.md   # batch 8, 512 px, both modes
    python benchmarks/segmentation.py --device cpu --image-size 64 --batch 2 --steps 2 --warmup 1 --modes eager
"""

from __future__ import annotations

import argparse
import sys

from harness import (
    STEP_MODES,
    add_common_options,
    autocast,
    csv,
    mode_rows,
    publish,
    rate_table,
    read_config,
    run_rows,
    settings_line,
    time_steps,
    work,
)

CONFIGS = {  # attention -> (label, the app's config of the paper's ADE20K set-up)
    "symmetric": (
        "Segmenter-tiny, symmetric",
        "configs/segmentation/segmenter-tiny_symmetric_8xb1-64e_ade20k-512.yaml",
    ),
    "rpc": (
        "RPC-Segmenter-tiny, 6 iterations in encoder and decoder block 0",
        "configs/segmentation/segmenter-tiny_rpc_8xb1-64e_ade20k-512.yaml",
    ),
}
PAPER_BATCH = 8  # the configs' global batch: 8 GPUs x 1 image


def read_model_config(attention: str) -> dict:
    """What a step of the ``attention`` model needs from its config: the net's arguments and the optimizer."""
    config = read_config(CONFIGS[attention][1])
    return {"init_args": config["model"]["net"]["init_args"], "optimizer": config["model"]["optimizer"]}


def build_step(case: dict):
    """The seeded Segmenter of ``case`` on its device, eager or compiled, and a closure running one SGD step."""
    import torch

    from kpca.attention import AttentionSpec
    from kpca.segmentation.model import Segmenter
    from kpca.segmentation.module import SegmentationModule, segmentation_loss
    from kpca.training.module import CompileOptions, compile_in_place

    config, device, size = case["config"], case["device"], case["image_size"]
    init = dict(config["init_args"], img_size=size, init_from=None)
    for key in ("attention", "decoder_attention"):
        init[key] = AttentionSpec(**init[key])
    if case["depth"]:
        init["depth"] = case["depth"]
    torch.manual_seed(0)
    net = Segmenter(**init).to(device)
    if case["mode"] == "compiled":
        compile_in_place(net, SegmentationModule.compiled_methods, CompileOptions())
    optimizer_class = getattr(torch.optim, config["optimizer"]["class_path"].rsplit(".", 1)[-1])
    optimizer = optimizer_class(net.parameters(), **config["optimizer"]["init_args"])
    images = torch.rand(case["batch"], 3, size, size, device=device)  # (B, 3, H, W) in [0, 1]
    labels = torch.randint(0, net.num_classes, (case["batch"], size, size), device=device)  # (B, H, W)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device):
            logits = net(images)  # (B, K, H, W)
        segmentation_loss(logits, labels).backward()
        optimizer.step()

    return step


def run_case(case: dict) -> dict:
    """Time one row in this process (see :func:`harness.time_steps`)."""
    return time_steps(build_step(case), case["device"], case["warmup"], case["steps"])


def render(results: dict[tuple[str, str], dict], args: argparse.Namespace) -> str:
    """The Markdown report: settings, then one row per model and mode."""
    dtype = "bf16 autocast" if args.device == "cuda" else "fp32"
    depth = f", encoder depth {args.depth}" if args.depth else ""
    lines = [
        settings_line(results, args.device, dtype),
        "",
        f"Training step of Segmenter-tiny (the app's ADE20K configs{depth}: 150 classes, SGD, drop path 0.1), batch "
        f"{args.batch} (the paper's global batch: {PAPER_BATCH}), {args.image_size} x {args.image_size} px, random "
        f"images and labels: median of {args.steps} timed steps after {args.warmup} warm-up step(s), each row in its "
        "own process; compiled: the network's forward, as `--model.compile true`; its first step includes the "
        "compilation.",
        "",
        *rate_table(results, {k: v[0] for k, v in CONFIGS.items()}, ("model", "img/s"), args.batch),
    ]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--batch", type=int, default=PAPER_BATCH, help=f"images per step (default {PAPER_BATCH})")
    p.add_argument("--image-size", "--img-size", type=int, default=512, help="square crop, px (default 512)")
    p.add_argument("--depth", type=int, default=None, help="encoder blocks (default: DeiT-tiny's 12)")
    p.add_argument("--modes", type=csv(STEP_MODES), default=list(STEP_MODES), help="default eager,compiled")
    p.add_argument("--steps", type=int, default=10, help="timed steps per row (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before them (default 3)")
    add_common_options(p)
    args = p.parse_args()
    if min(args.batch, args.image_size, args.steps, args.depth or 1, args.warmup + 1) < 1:
        p.error("--batch, --image-size, --steps and --depth must be at least 1, --warmup at least 0")
    return args


def main() -> int:
    """Run every row in its own process, print the report; 1 if a row failed."""
    args = parse_args()
    if args.worker:
        return work(args.worker, {"step": run_case})
    sizes = {
        key: getattr(args, key) for key in ("device", "batch", "image_size", "depth", "warmup", "steps", "threads")
    }
    cases = {
        (mode, attention): {"kind": "step", "mode": mode, "config": read_model_config(attention), **sizes}
        for mode, attention in mode_rows(args.modes, list(CONFIGS))
    }
    results = run_rows(__file__, cases, lambda so_far: render(so_far, args), args.output)
    publish(render(results, args), args.output)
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
