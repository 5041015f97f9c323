"""Training-step time of DeiT, SymViT and RPC-SymViT, eager and compiled, and Lightning's throughput vs a plain loop.

Every case runs in a fresh Python process.

1. Step time: one forward + backward + AdamW step of :class:`~kpca.vision_cls.model.ViTClassifier` at DeiT-tiny
   shapes (192 wide, 12 blocks, 3 heads, patch 16, 224 px, 1000 classes, no drop path) on a batch of 16 random
   images in [0, 1], for SymViT (symmetric attention), RPC-SymViT with 4 PAP iterations in block 0, RPC with 2
   iterations in all blocks, and DeiT (softmax) for reference. Two warm-up steps, then the minimum over at least
   5 timed steps (more while the timed steps stay within a time budget); the models run in turn, once per round,
   and the fastest round counts. With ``--compile`` each model also runs compiled as the apps' ``--model.compile
   true`` compiles it (``torch.compile`` of the network's forward in place, Inductor, torch's defaults; the AdamW
   step stays eager), in its own process: its warm-up steps include the compilation, whose first step is reported,
   and the table shows both step times and both ratios to SymViT side by side.
2. Lightning overhead: images/s of ``Trainer.fit`` on :class:`~kpca.vision_cls.module.ClassificationModule`
   against a plain PyTorch loop doing the same work: the same built-in digits loader (batch 64, 32 px, no
   RandAugment, erasing or repeated augmentation, loaded in the main process), the same small symmetric ViT
   (patch 4, 96 wide, 4 blocks, 3 heads), cross-entropy with label smoothing 0.1, AdamW at lr 1e-3 over the same
   decay / no-decay groups and the same per-step cosine LambdaLR. The first epoch is a warm-up; each later epoch
   is timed from its start to its end (Lightning: the ``on_train_epoch_start`` / ``on_train_epoch_end`` hooks) and
   the fastest epoch counts. Plain and Lightning runs alternate (plain, lightning, plain, lightning, one pair per
   round) and the best run of each counts.

Run from the repository root::

    python benchmarks/vision_cls.py --quick     # batch 4 at 128 px, 8-step epochs, one round: ~50 s on 2 idle CPU cores
    python benchmarks/vision_cls.py             # the shapes above, two rounds: ~4 min on 2 idle CPU cores
    python benchmarks/vision_cls.py --check --output bench.md   # exit 1 if a target fails; also write Markdown
    python benchmarks/vision_cls.py --compile   # also compiled: each DeiT-tiny model compiles for 1-2 min on 2 cores

Timings take the minimum over repeats because that is the one least disturbed by other load. Intra-op threads are
torch's default; on a CPU shared with other busy processes they oversubscribe the cores and every step slows down
erratically, so use ``--threads 1`` there. The digits tree is written once under ``--cache-dir`` (default
``$KPCA_CACHE`` or ``~/.cache/kpca``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time

from harness import Check, check, spawn, write_report

# torch, timm and Lightning are imported inside the worker functions: the parent only spawns workers and skips
# their ~5 s of imports.

MODELS = {  # name -> (label, AttentionSpec keywords), in table order
    "softmax": ("DeiT (softmax)", {"kind": "softmax"}),
    "symmetric": ("SymViT (symmetric)", {"kind": "symmetric"}),
    "rpc4-block0": ("RPC-SymViT, 4 iterations in block 0", {"kind": "rpc", "n_iter": 4, "layers": [0]}),
    "rpc2-all": ("RPC, 2 iterations in all blocks", {"kind": "rpc", "n_iter": 2, "layers": "all"}),
}
LOOPS = ("plain", "lightning")
WARMUP_STEPS = 2
MIN_TIMED_STEPS = 5
MAX_TIMED_STEPS = 20
STEP_BUDGET_S = 8.0  # timed steps go on past MIN_TIMED_STEPS while their total stays under this (--quick: 1 s)
FIT_BATCH = 64
FIT_LR = 1e-3
LABEL_SMOOTHING = 0.1
MIN_LR = 1e-5  # ClassificationModule's default floor of the cosine schedule


def run_step_case(case: dict) -> dict:
    """Time forward + backward + AdamW steps of one DeiT-tiny model, eager or compiled.

    Returns the minimum step time (ms), the number of timed steps and the first step's time (s; compiled, it
    includes the compilation).
    """
    import torch
    import torch.nn.functional as F

    from kpca.attention import AttentionSpec
    from kpca.training.module import CompileOptions, compile_in_place
    from kpca.vision_cls.model import ViTClassifier

    torch.manual_seed(0)
    _, spec = MODELS[case["model"]]
    net = ViTClassifier(
        arch="deit_tiny",
        num_classes=1000,
        attention=AttentionSpec(**spec),
        img_size=case["img_size"],
        drop_path_rate=0.0,
    )
    if case["compiled"]:
        compile_in_place(net, ("forward",), CompileOptions())
    optimizer = torch.optim.AdamW(net.parameters())
    images = torch.rand(case["batch"], 3, case["img_size"], case["img_size"])  # (B, 3, H, W) in [0, 1]
    labels = torch.randint(0, 1000, (case["batch"],))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(net(images), labels).backward()
        optimizer.step()

    first_step_s = timed(step)
    for _ in range(WARMUP_STEPS - 1):
        step()
    times = []
    while len(times) < MIN_TIMED_STEPS or (len(times) < MAX_TIMED_STEPS and sum(times) < case["budget_s"]):
        times.append(timed(step))
    return {"time_ms": min(times) * 1e3, "steps": len(times), "first_step_s": first_step_s}


def timed(step) -> float:
    """Seconds one call of ``step`` takes."""
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def fit_setup(cache_dir: str | None):
    """The digits datamodule (data written, not yet set up) and a seeded small symmetric ViT for the fit cases."""
    import torch

    from kpca.attention import AttentionSpec
    from kpca.vision_cls.data import ImageNetDataModule
    from kpca.vision_cls.model import ViTClassifier

    torch.manual_seed(0)
    dm = ImageNetDataModule(
        builtin="digits",
        cache_dir=cache_dir,
        batch_size=FIT_BATCH,
        num_workers=0,
        image_size=32,
        crop_pct=1.0,
        auto_augment=None,
        re_prob=0.0,
        repeated_aug=1,
        pin_memory=False,
    )
    dm.prepare_data()
    net = ViTClassifier(
        num_classes=dm.num_classes,
        img_size=32,
        patch_size=4,
        embed_dim=96,
        depth=4,
        num_heads=3,
        attention=AttentionSpec(kind="symmetric"),
    )
    return dm, net


def run_plain(case: dict) -> tuple[list[float], int]:
    """Train with a plain PyTorch loop; returns each epoch's duration (s) and the steps per epoch."""
    import torch
    import torch.nn.functional as F

    dm, net = fit_setup(case["cache_dir"])
    dm.setup("fit")
    loader = dm.train_dataloader()
    skip = net.no_weight_decay()
    params = list(net.named_parameters())
    groups = [
        {"params": [p for name, p in params if p.ndim > 1 and name not in skip]},
        {"params": [p for name, p in params if p.ndim <= 1 or name in skip], "weight_decay": 0.0},
    ]  # ClassificationModule's decay / no-decay rule
    optimizer = torch.optim.AdamW(groups, lr=FIT_LR)
    steps = min(len(loader), case["batches"] or len(loader))
    total, floor = case["epochs"] * steps, MIN_LR / FIT_LR
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(step / total, 1.0)))
    )  # ClassificationModule's schedule without warm-up
    net.train()
    durations = []
    for _ in range(case["epochs"]):
        start = time.perf_counter()
        for images, labels in itertools.islice(loader, steps):
            loss = F.cross_entropy(net(images), labels, label_smoothing=LABEL_SMOOTHING)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
        durations.append(time.perf_counter() - start)
    return durations, steps


def run_lightning(case: dict) -> tuple[list[float], int]:
    """Train with ``Trainer.fit`` on ClassificationModule; returns each epoch's duration (s) and the steps per epoch."""
    import lightning.pytorch as pl
    import torch

    from kpca.vision_cls.module import ClassificationModule

    class EpochTimer(pl.Callback):
        """Records the time from each ``on_train_epoch_start`` to its ``on_train_epoch_end``."""

        def __init__(self) -> None:
            self.durations: list[float] = []
            self.start = 0.0

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self.start = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            self.durations.append(time.perf_counter() - self.start)

    dm, net = fit_setup(case["cache_dir"])
    module = ClassificationModule(
        net,
        optimizer=lambda p: torch.optim.AdamW(p, lr=FIT_LR),
        mixup_alpha=0.0,
        cutmix_alpha=0.0,
        lr_batch_reference=0,
        warmup_epochs=0,
        label_smoothing=LABEL_SMOOTHING,
        min_lr=MIN_LR,
    )
    timer = EpochTimer()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=case["epochs"],
        limit_train_batches=case["batches"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[timer],
    )
    trainer.fit(module, datamodule=dm)
    return timer.durations, trainer.num_training_batches


def run_fit_case(case: dict) -> dict:
    """Train with one loop; returns images/s of the fastest epoch after the warm-up epoch."""
    durations, steps = run_plain(case) if case["loop"] == "plain" else run_lightning(case)
    return {"images_per_s": steps * FIT_BATCH / min(durations[1:]), "epoch_s": durations, "steps": steps}


def run_case(case: dict) -> dict:
    """Run one case in this process; the result also names the torch version and the intra-op threads."""
    import torch

    if case["threads"]:
        torch.set_num_threads(case["threads"])
    result = run_step_case(case) if case["kind"] == "step" else run_fit_case(case)
    return {**result, "torch": torch.__version__, "threads": torch.get_num_threads()}


def spawn_case(case: dict) -> dict:
    """Run :func:`run_case` in a fresh interpreter and return its result."""
    return spawn(__file__, ["--worker", json.dumps(case)])


def target_checks(steps: dict, fits: dict) -> list[Check]:
    """(name, value, comparison, target, passed) per target, from the best step times (ms) and images/s."""
    specs = [
        ("step time: rpc4-block0 / symmetric", steps["rpc4-block0"] / steps["symmetric"], "<=", 1.05),
        ("step time: rpc2-all / symmetric", steps["rpc2-all"] / steps["symmetric"], "<=", 1.20),
        ("throughput: lightning / plain", fits["lightning"] / fits["plain"], ">=", 0.95),
    ]
    return [check(*spec) for spec in specs]


def best_step_times(runs: dict[str, list[dict]]) -> dict[str, float]:
    """The fastest step time (ms) of each model over its runs."""
    return {name: min(r["time_ms"] for r in model_runs) for name, model_runs in runs.items()}


def step_table(step_runs: dict[str, dict[str, list[dict]]]) -> list[str]:
    """Markdown rows of the step times and their ratios; compiled columns beside the eager ones when measured."""
    eager = best_step_times(step_runs["eager"])
    compiled = best_step_times(step_runs["compiled"]) if "compiled" in step_runs else None
    header, rule = "| model | step (ms) | per round (ms) | / SymViT | / DeiT |", "|---|---:|---:|---:|---:|"
    if compiled is not None:
        header += " compiled (ms) | compiled / eager | compiled / SymViT compiled | first compiled step (s) |"
        rule += "---:|---:|---:|---:|"
    rows = [header, rule]
    for name, (label, _) in MODELS.items():
        t, runs = eager[name], ", ".join(f"{r['time_ms']:.0f}" for r in step_runs["eager"][name])
        row = f"| {label} | {t:.0f} | {runs} | {t / eager['symmetric']:.2f} | {t / eager['softmax']:.2f} |"
        if compiled is not None:
            c, first = compiled[name], min(r["first_step_s"] for r in step_runs["compiled"][name])
            row += f" {c:.0f} | {c / t:.2f} | {c / compiled['symmetric']:.2f} | {first:.0f} |"
        rows.append(row)
    return rows


def render(step_runs: dict, fit_runs: dict, args: argparse.Namespace) -> tuple[str, bool]:
    """The Markdown report (settings, step times, throughputs, target checks) and whether every target passed."""
    steps = best_step_times(step_runs["eager"])
    fits = {loop: max(r["images_per_s"] for r in runs) for loop, runs in fit_runs.items()}
    checks = target_checks(steps, fits)
    worker = step_runs["eager"]["symmetric"][0]
    lines = [
        f"device=cpu dtype=fp32 torch={worker['torch']} threads={worker['threads']}",
        "",
        f"Step time (forward + backward + AdamW), DeiT-tiny shapes, batch {args.batch}, {args.img_size} px, "
        f"best of {args.rounds} round(s):",
        "",
        *step_table(step_runs),
    ]
    if "compiled" in step_runs:
        lines += [
            "",
            "Compiled: torch.compile of the network's forward (Inductor, torch's defaults), as the apps' "
            "`--model.compile true`; the first compiled step includes the compilation. The targets use eager times.",
        ]
    lines += [
        "",
        f"Training throughput, digits 32 px, batch {FIT_BATCH}, small symmetric ViT: fastest of "
        f"{args.epochs - 1} timed epoch(s) of {fit_runs['plain'][0]['steps']} steps after a warm-up epoch, "
        f"best of {args.rounds} run(s):",
        "",
        "| loop | images/s | per run | / plain |",
        "|---|---:|---:|---:|",
    ]
    for loop in LOOPS:
        runs = ", ".join(f"{r['images_per_s']:.0f}" for r in fit_runs[loop])
        lines.append(f"| {loop} | {fits[loop]:.0f} | {runs} | {fits[loop] / fits['plain']:.2f} |")
    lines += ["", "Targets:", ""]
    for name, value, op, target, passed in checks:
        lines.append(f"- {name}: {value:.2f} (target {op} {target}) {'PASS' if passed else 'FAIL'}")
    return "\n".join(lines) + "\n", all(check[-1] for check in checks)


def parse_args() -> argparse.Namespace:
    """Command-line options; --quick changes the defaults of those left unset."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=None, help="step-time batch (default 16; --quick: 4)")
    p.add_argument("--img-size", type=int, default=None, help="step-time resolution (default 224; --quick: 128)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per fit, the first untimed (default 3; --quick: 2)")
    p.add_argument("--batches", type=int, default=None, help="steps per fit epoch (default all 22; --quick: 8)")
    p.add_argument("--rounds", type=int, default=None, help="runs of each case, in turn (default 2; --quick: 1)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--cache-dir", default=None, help="where the digits tree is written (default $KPCA_CACHE)")
    p.add_argument("--quick", action="store_true", help="smaller step-time shapes, shorter and fewer fits")
    p.add_argument("--compile", action="store_true", help="also time each model compiled (torch.compile, Inductor)")
    p.add_argument("--check", action="store_true", help="exit 1 if any target fails")
    p.add_argument("--output", help="also write the Markdown report to this path")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    quick_defaults = {"batch": 4, "img_size": 128, "epochs": 2, "batches": 8, "rounds": 1}
    full_defaults = {"batch": 16, "img_size": 224, "epochs": 3, "batches": None, "rounds": 2}
    for name, full in full_defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick_defaults[name] if args.quick else full)
    if args.epochs < 2:
        p.error("--epochs must be at least 2: the first epoch is a warm-up")
    return args


def main() -> int:
    """Run every case in its own process, print the report, and return the exit status."""
    args = parse_args()
    if args.worker:
        print(json.dumps(run_case(json.loads(args.worker))))
        return 0
    step_case = {
        "kind": "step",
        "batch": args.batch,
        "img_size": args.img_size,
        "budget_s": 1.0 if args.quick else STEP_BUDGET_S,
        "threads": args.threads,
    }
    variants = ("eager", "compiled") if args.compile else ("eager",)
    step_runs = {variant: {name: [] for name in MODELS} for variant in variants}
    for _ in range(args.rounds):
        for variant in variants:
            for name in MODELS:
                case = {**step_case, "model": name, "compiled": variant == "compiled"}
                step_runs[variant][name].append(spawn_case(case))
    fit_case = {
        "kind": "fit",
        "epochs": args.epochs,
        "batches": args.batches,
        "cache_dir": args.cache_dir,
        "threads": args.threads,
    }
    fit_runs = {loop: [] for loop in LOOPS}
    for _ in range(args.rounds):
        for loop in LOOPS:
            fit_runs[loop].append(spawn_case({**fit_case, "loop": loop}))
    report, passed = render(step_runs, fit_runs, args)
    print(report, end="")
    write_report(args.output, report)
    return 1 if args.check and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
