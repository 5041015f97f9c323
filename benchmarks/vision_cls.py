"""Training-step time of DeiT, SymViT and RPC-SymViT, eager and compiled, and Lightning's throughput vs a plain loop.

Every case runs in a fresh Python process. Without ``--real-size`` (the default on CPU) the script measures parts 1
and 2 below on the CPU; ``--real-size`` (the default with ``--device cuda``) measures part 3 instead.

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
3. Real-size training step (``--real-size``): forward + backward + AdamW step of
   :func:`kpca.attention.vit.create_vit` DeiT-tiny and DeiT-small (batch 256, 224 px, 1000 classes, no drop path) on
   random images, on ``--device``: on CUDA under bf16 autocast with fused AdamW, on CPU in fp32 with torch's default
   AdamW. Rows: softmax (DeiT), symmetric (SymViT), RPC with 4 iterations in block 0 (RPC-SymViT) and RPC with 2
   iterations in all blocks, each RPC row on the Triton and on the torch backend, eager and compiled
   (``torch.compile(model)``). Each row runs in its own process: ``--warmup`` untimed steps (the first one, compiled,
   includes the compilation and is reported), then the median of ``--steps`` timed steps, each synchronised. The
   table gives img/s, ms/step, the ratio to SymViT of the same size and mode, and the peak GPU memory
   (``max_memory_allocated``), then the targets. By default every row runs eager at both sizes, and only DeiT-tiny's
   SymViT, RPC 2-all Triton and RPC 2-all torch run compiled (``--compiled-arches``, ``--compiled-rows``), as
   ``make test-gpu`` needs. On CPU the Triton rows are skipped, with the reason, unless ``TRITON_INTERPRET=1``.
   ``--profile`` adds a torch.profiler summary of one eager DeiT-tiny RPC 2-all Triton step after the warm-up
   (torch backend on CPU without the interpreter): the top 15 kernels / ops by device time (CPU time on CPU), and
   the step's CPU time against its device time (CPU time >= device time: the step is launch-bound).

Run from the repository root::

    python benchmarks/vision_cls.py --quick     # batch 4 at 128 px, 8-step epochs, one round: ~50 s on 2 idle CPU cores
    python benchmarks/vision_cls.py             # the shapes above, two rounds: ~4 min on 2 idle CPU cores
    python benchmarks/vision_cls.py --check --output bench.md   # exit 1 if a target fails; also write Markdown
    python benchmarks/vision_cls.py --compile   # also compiled: each DeiT-tiny model compiles for 1-2 min on 2 cores
    python benchmarks/vision_cls.py --device cuda --profile --output vision_cuda.md   # part 3: make test-gpu's rows
    python benchmarks/vision_cls.py --device cuda --arches deit_tiny --compiled-rows symvit,rpc2all-triton
    python benchmarks/vision_cls.py --device cpu --real-size --arches deit_tiny --batch 2 --img-size 32 --steps 2
    python benchmarks/vision_cls.py --device cpu --real-size --modes eager --backends torch --batch 2 --img-size 32

The last two run part 3 at tiny sizes on the CPU in seconds (compiled rows: a minute or two each).

Timings take the minimum over repeats because that is the one least disturbed by other load. Intra-op threads are
torch's default; on a CPU shared with other busy processes they oversubscribe the cores and every step slows down
erratically, so use ``--threads 1`` there. The digits tree is written once under ``--cache-dir`` (default
``$KPCA_CACHE`` or ``~/.cache/kpca``).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

from harness import (
    STEP_MODES,
    Check,
    add_common_options,
    autocast,
    check,
    csv,
    decay_groups,
    publish,
    render_targets,
    run_rows,
    settings_line,
    spawn_or_error,
    spawn_rounds,
    synchronize,
    time_steps,
    work,
)

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
    from kpca.vision_cls.input import TrainData
    from kpca.vision_cls.model import ViTClassifier

    torch.manual_seed(0)
    dm = ImageNetDataModule(
        builtin="digits",
        cache_dir=cache_dir,
        batch_size=FIT_BATCH,
        num_workers=0,
        image_size=32,
        crop_pct=1.0,
        train=TrainData(auto_augment=None, re_prob=0.0, repeated_aug=1),
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
    optimizer = torch.optim.AdamW(decay_groups(net), lr=FIT_LR)
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
    lines += render_targets(checks, digits=2)
    return "\n".join(lines) + "\n", all(check[-1] for check in checks)


# Part 3: the real-size training step (--real-size).

ATTENTIONS = {  # row attention name -> MODELS key, in table order
    "softmax": "softmax",
    "symvit": "symmetric",
    "rpc4b0": "rpc4-block0",
    "rpc2all": "rpc2-all",
}
ARCHES = ("deit_tiny", "deit_small", "deit_base")
RPC_BACKENDS = ("triton", "torch")
DEFAULT_ARCHES = ("deit_tiny", "deit_small")
DEFAULT_COMPILED_ARCHES = ("deit_tiny",)
DEFAULT_COMPILED_ROWS = ("symvit", "rpc2all-triton", "rpc2all-torch")
PROFILE_TOP = 15


class Row(NamedTuple):
    """One row of the real-size table: a DeiT size, an attention, its backend (RPC rows only) and eager / compiled."""

    arch: str
    attention: str
    backend: str | None
    mode: str

    @property
    def name(self) -> str:
        """The row's name in ``--compiled-rows``: the attention, and the backend for RPC (``rpc2all-triton``)."""
        return f"{self.attention}-{self.backend}" if self.backend else self.attention

    @property
    def label(self) -> str:
        """The attention's label in the table."""
        return MODELS[ATTENTIONS[self.attention]][0]


def select_rows(
    arches: Sequence[str] = DEFAULT_ARCHES,
    attentions: Sequence[str] = tuple(ATTENTIONS),
    backends: Sequence[str] = RPC_BACKENDS,
    modes: Sequence[str] = STEP_MODES,
    compiled_arches: Sequence[str] = DEFAULT_COMPILED_ARCHES,
    compiled_rows: Sequence[str] = DEFAULT_COMPILED_ROWS,
) -> list[Row]:
    """The rows to run, in running order: every eager row, then the compiled ones.

    Eager: every arch x attention, each RPC attention once per backend. Compiled: the same, restricted to
    ``compiled_arches`` and to the rows named in ``compiled_rows``. The defaults are ``make test-gpu``'s selection.
    """
    rows = []
    for mode in (m for m in STEP_MODES if m in modes):
        for arch in arches:
            if mode == "compiled" and arch not in compiled_arches:
                continue
            for attention in (a for a in ATTENTIONS if a in attentions):
                for backend in backends if attention.startswith("rpc") else (None,):
                    row = Row(arch, attention, backend, mode)
                    if mode == "eager" or row.name in compiled_rows:
                        rows.append(row)
    return rows


def build_vit_step(case: dict):
    """The seeded ViT of ``case`` on its device, eager or ``torch.compile``-d, and a closure running one AdamW step.

    The step is forward (bf16 autocast on CUDA) + cross-entropy + backward + AdamW (fused on CUDA) on random images
    in [0, 1] and random labels of 1000 classes.
    """
    import torch
    import torch.nn.functional as F

    from kpca.attention import AttentionSpec
    from kpca.attention.vit import create_vit

    torch.manual_seed(0)
    device, size = case["device"], case["img_size"]
    spec = dict(MODELS[ATTENTIONS[case["attention"]]][1], backend=case["backend"] or "auto")
    depth = {"depth": case["depth"]} if case.get("depth") else {}
    net = create_vit(case["arch"], AttentionSpec(**spec), num_classes=1000, img_size=size, **depth).to(device)
    model = torch.compile(net) if case["mode"] == "compiled" else net
    optimizer = torch.optim.AdamW(net.parameters(), fused=device == "cuda")
    images = torch.rand(case["batch"], 3, size, size, device=device)  # (B, 3, H, W) in [0, 1]
    labels = torch.randint(0, 1000, (case["batch"],), device=device)  # (B,)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device):
            logits = model(images)  # (B, 1000)
        F.cross_entropy(logits.float(), labels).backward()
        optimizer.step()

    return step


def run_table_case(case: dict) -> dict:
    """Time one row of the real-size table (see :func:`time_steps`)."""
    return time_steps(build_vit_step(case), case["device"], case["warmup"], case["steps"])


def run_profile_case(case: dict) -> dict:
    """Profile one training step after the warm-up; returns the top ops and the step's CPU and device time (ms).

    On CUDA the top ops are the kernels by device time (user annotations left out, as torch's own totals do) and the
    device time is the sum of the step's kernel times; on CPU they are the ops by self CPU time, device time None.
    The CPU time is the host's time inside the step, up to the return of ``optimizer.step()`` (no synchronisation
    inside), the time it takes to issue the step's work.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    device = case["device"]
    step = build_vit_step(case)
    for _ in range(case["warmup"]):
        step()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        with record_function("training_step"):
            step()
        synchronize(device)
    events = prof.events()
    cpu_us = sum(e.cpu_time_total for e in events if e.name == "training_step")
    if device == "cuda":
        kernels = [e for e in events if e.device_type != torch.autograd.DeviceType.CPU]
        kernels = [e for e in kernels if not getattr(e, "is_user_annotation", False)]
        totals: dict[str, list[float]] = {}
        for e in kernels:
            calls_us = totals.setdefault(e.name, [0, 0.0])
            calls_us[0] += 1
            calls_us[1] += e.device_time_total
        ops = [(name, calls, us / 1e3) for name, (calls, us) in totals.items()]
        device_ms = sum(e.device_time_total for e in kernels) / 1e3
    else:
        averages = [e for e in prof.key_averages() if e.key != "training_step"]
        ops = [(e.key, e.count, e.self_cpu_time_total / 1e3) for e in averages]
        device_ms = None
    ops.sort(key=lambda op: -op[2])
    return {
        "ops": ops[:PROFILE_TOP],
        "cpu_ms": cpu_us / 1e3,
        "device_ms": device_ms,
        "total_ms": sum(o[2] for o in ops),
    }


def triton_skip_reason(row: Row, device: str) -> str | None:
    """Why ``row`` cannot run on ``device`` in this environment (Triton rows on CPU without the interpreter)."""
    interpret = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on", "y")
    if row.backend == "triton" and device == "cpu" and not interpret:
        return "the Triton backend needs CUDA (on CPU only under TRITON_INTERPRET=1)"
    return None


def table_case(row: Row, args: argparse.Namespace) -> dict:
    """The worker case of ``row`` with the run's sizes."""
    reason = triton_skip_reason(row, args.device)
    return {
        "kind": "table",
        **row._asdict(),
        **({"skipped": reason} if reason else {}),
        "device": args.device,
        "batch": args.batch,
        "img_size": args.img_size,
        "depth": args.depth,
        "warmup": args.warmup,
        "steps": args.steps,
        "threads": args.threads,
    }


def profile_row(device: str) -> Row:
    """The profiled row: eager DeiT-tiny RPC 2-all on Triton, on torch where Triton cannot run."""
    row = Row("deit_tiny", "rpc2all", "triton", "eager")
    return Row("deit_tiny", "rpc2all", "torch", "eager") if triton_skip_reason(row, device) else row


def row_ratio(results: dict[Row, dict], row: Row) -> float | None:
    """The step time of ``row`` over SymViT's of the same size and mode, when both were measured."""
    base = results.get(Row(row.arch, "symvit", None, row.mode), {})
    if "time_ms" not in results[row] or "time_ms" not in base:
        return None
    return results[row]["time_ms"] / base["time_ms"]


def row_order(row: Row) -> tuple:
    """Sort key of the table: size, mode, attention, backend (Triton first)."""
    backends = (None, *RPC_BACKENDS)
    return row.arch, STEP_MODES.index(row.mode), list(ATTENTIONS).index(row.attention), backends.index(row.backend)


def table_rows(results: dict[Row, dict], batch: int) -> list[str]:
    """Markdown rows of the real-size table, by size, mode and attention."""
    lines = [
        "| size | mode | attention | backend | img/s | ms/step | / SymViT | peak GPU memory (GiB) | first step (s) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(results, key=row_order):
        r, head = results[row], f"| {row.arch} | {row.mode} | {row.label} | {row.backend or '-'} |"
        if "time_ms" not in r:
            why = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r['error']}"
            lines.append(f"{head} {why} | | | | |")
            continue
        ratio = row_ratio(results, row)
        peak = "n/a" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        lines.append(
            f"{head} {batch / r['time_ms'] * 1e3:,.0f} | {r['time_ms']:.2f} | "
            f"{'-' if ratio is None else f'{ratio:.3f}'} | {peak} | {r['first_step_s']:.1f} |"
        )
    return lines


def table_targets(results: dict[Row, dict]) -> list[Check]:
    """The targets whose rows were measured: DeiT-tiny RPC 2-all Triton / SymViT, and Triton vs torch per RPC row."""
    checks = []
    for mode, limit in (("eager", 1.35), ("compiled", 1.2)):
        row = Row("deit_tiny", "rpc2all", "triton", mode)
        ratio = row_ratio(results, row) if row in results else None
        if ratio is not None:
            checks.append(check(f"deit_tiny RPC 2-all (Triton) / SymViT, {mode}", ratio, "<=", limit))
    for row in results:
        torch_row = row._replace(backend="torch")
        if row.backend == "triton" and "time_ms" in results[row] and "time_ms" in results.get(torch_row, {}):
            ratio = results[row]["time_ms"] / results[torch_row]["time_ms"]
            checks.append(check(f"{row.arch} {row.label}, {row.mode}: Triton / torch", ratio, "<=", 1.0))
    return checks


def render_profile(profile: dict, row: Row, batch: int, img_size: int) -> list[str]:
    """The Markdown section of :func:`run_profile_case`'s result (or of its failure)."""
    lines = [
        "",
        f"## Profile: one training step of {row.arch}, {row.label}, {row.backend} backend, eager",
        "",
    ]
    if "error" in profile:
        return [*lines, f"Profiling failed: {profile['error']}"]
    cuda = profile["device_ms"] is not None
    lines.append(
        f"Batch {batch}, {img_size} px, after the warm-up. "
        + (
            f"CPU time of the step: {profile['cpu_ms']:.2f} ms; device time (sum of its kernel times): "
            f"{profile['device_ms']:.2f} ms; launch-bound (CPU time >= device time): "
            f"{'yes' if profile['cpu_ms'] >= profile['device_ms'] else 'no'}."
            if cuda
            else f"CPU time of the step: {profile['cpu_ms']:.2f} ms; device time: n/a (a CPU run)."
        )
    )
    what = "kernel" if cuda else "op"
    lines += [
        "",
        f"Top {PROFILE_TOP} {what}s by {'device' if cuda else 'self CPU'} time:",
        "",
        f"| {what} | calls | {'device' if cuda else 'self CPU'} time (ms) | share |",
        "|---|---:|---:|---:|",
    ]
    for name, calls, ms in profile["ops"]:
        name = name.replace("|", "\\|")
        lines.append(f"| `{name[:100]}` | {calls} | {ms:.3f} | {ms / max(profile['total_ms'], 1e-9):.1%} |")
    return lines


def render_real_size(results: dict[Row, dict], profile: dict | None, args: argparse.Namespace) -> tuple[str, bool]:
    """The Markdown report of part 3 and whether every target passed."""
    dtype = "bf16 autocast, fused AdamW" if args.device == "cuda" else "fp32, AdamW"
    lines = [
        settings_line(results, args.device, dtype),
        "",
        f"Training step (forward + cross-entropy + backward + AdamW), batch {args.batch}, {args.img_size} px, "
        f"1000 classes, random inputs: median of {args.steps} timed steps after {args.warmup} warm-up step(s), "
        "each row in its own process; compiled: `torch.compile(model)`, its first step includes the compilation.",
        "",
        *table_rows(results, args.batch),
    ]
    checks = table_targets(results)
    lines += render_targets(checks)
    if profile is not None:
        lines += render_profile(profile, profile_row(args.device), args.batch, args.img_size)
    return "\n".join(lines) + "\n", all(c[-1] for c in checks)


def main_real_size(args: argparse.Namespace) -> int:
    """Part 3: each selected row in its own process, then the report; 1 if a row failed, or with --check a target."""
    options = (args.arches, args.attentions, args.backends, args.modes, args.compiled_arches, args.compiled_rows)
    cases = {row: table_case(row, args) for row in select_rows(*options)}
    results = run_rows(__file__, cases, lambda so_far: render_real_size(so_far, None, args)[0], args.output)
    profile = None
    if args.profile:
        profile = spawn_or_error(__file__, {**table_case(profile_row(args.device), args), "kind": "profile"})
    report, passed = render_real_size(results, profile, args)
    publish(report, args.output)
    failed = any("error" in r for r in [*results.values(), profile or {}])
    return 1 if failed or (args.check and not passed) else 0


def add_real_size_options(p: argparse.ArgumentParser) -> None:
    """The options of part 3 (the real-size training step)."""
    g = p.add_argument_group("real-size training step (part 3)")
    g.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where part 3 runs (default cpu)")
    g.add_argument(
        "--real-size",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run part 3 instead of parts 1 and 2 (default: with --device cuda)",
    )
    g.add_argument("--arches", type=csv(ARCHES), default=list(DEFAULT_ARCHES), help="default deit_tiny,deit_small")
    g.add_argument("--attentions", type=csv(tuple(ATTENTIONS)), default=list(ATTENTIONS), help="default: all")
    g.add_argument("--backends", type=csv(RPC_BACKENDS), default=list(RPC_BACKENDS), help="RPC rows' (default: both)")
    g.add_argument("--modes", type=csv(STEP_MODES), default=list(STEP_MODES), help="default eager,compiled")
    g.add_argument(
        "--compiled-arches", type=csv(ARCHES), default=list(DEFAULT_COMPILED_ARCHES), help="default deit_tiny"
    )
    rows = [row.name for row in select_rows(arches=("deit_tiny",), modes=("eager",))]
    g.add_argument(
        "--compiled-rows",
        type=csv(rows),
        default=list(DEFAULT_COMPILED_ROWS),
        help=f"rows that also run compiled (default {','.join(DEFAULT_COMPILED_ROWS)})",
    )
    g.add_argument("--depth", type=int, default=None, help="blocks of every ViT (default: the size's 12)")
    g.add_argument("--steps", type=int, default=15, help="timed steps per row (default 15)")
    g.add_argument("--warmup", type=int, default=4, help="untimed steps before them (default 4)")
    g.add_argument("--profile", action="store_true", help="also profile one DeiT-tiny RPC 2-all Triton step")


def parse_args() -> argparse.Namespace:
    """Command-line options; --quick and --real-size change the defaults of those left unset."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=None, help="step-time batch (default 16; --quick: 4; part 3: 256)")
    p.add_argument(
        "--img-size", "--image-size", type=int, default=None, help="step-time resolution (default 224; --quick: 128)"
    )
    p.add_argument("--epochs", type=int, default=None, help="epochs per fit, the first untimed (default 3; --quick: 2)")
    p.add_argument("--batches", type=int, default=None, help="steps per fit epoch (default all 22; --quick: 8)")
    p.add_argument("--rounds", type=int, default=None, help="runs of each case, in turn (default 2; --quick: 1)")
    p.add_argument("--cache-dir", default=None, help="where the digits tree is written (default $KPCA_CACHE)")
    p.add_argument("--quick", action="store_true", help="smaller step-time shapes, shorter and fewer fits")
    p.add_argument("--compile", action="store_true", help="also time each model compiled (torch.compile, Inductor)")
    p.add_argument("--check", action="store_true", help="exit 1 if any target fails")
    add_common_options(p)
    add_real_size_options(p)
    args = p.parse_args()
    if args.real_size is None:
        args.real_size = args.device == "cuda"
    if args.device == "cuda" and not args.real_size:
        p.error("parts 1 and 2 run on the CPU only; --device cuda runs part 3 (--real-size)")
    quick_defaults = {"batch": 4, "img_size": 128, "epochs": 2, "batches": 8, "rounds": 1}
    full_defaults = {"batch": 16, "img_size": 224, "epochs": 3, "batches": None, "rounds": 2}
    if args.real_size:
        full_defaults.update(batch=256, img_size=224)
    for name, full in full_defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick_defaults[name] if args.quick and not args.real_size else full)
    if args.epochs < 2:
        p.error("--epochs must be at least 2: the first epoch is a warm-up")
    if min(args.steps, args.warmup + 1, args.depth or 1) < 1:
        p.error("--steps and --depth must be at least 1, --warmup at least 0")
    return args


def main() -> int:
    """Run every case in its own process, print the report, and return the exit status."""
    args = parse_args()
    if args.worker:
        runners = {"step": run_step_case, "fit": run_fit_case, "table": run_table_case, "profile": run_profile_case}
        return work(args.worker, runners)
    if args.real_size:
        return main_real_size(args)
    variants = ("eager", "compiled") if args.compile else ("eager",)
    budget_s = 1.0 if args.quick else STEP_BUDGET_S
    step_case = {"kind": "step", "batch": args.batch, "img_size": args.img_size, "budget_s": budget_s}
    step_cases = {
        (variant, name): {**step_case, "model": name, "compiled": variant == "compiled", "threads": args.threads}
        for variant in variants
        for name in MODELS
    }
    steps = spawn_rounds(__file__, step_cases, args.rounds)
    fit_case = {"kind": "fit", "epochs": args.epochs, "batches": args.batches, "cache_dir": args.cache_dir}
    fit_cases = {loop: {**fit_case, "loop": loop, "threads": args.threads} for loop in LOOPS}
    fit_runs = spawn_rounds(__file__, fit_cases, args.rounds)
    step_runs = {variant: {name: steps[variant, name] for name in MODELS} for variant in variants}
    report, passed = render(step_runs, fit_runs, args)
    publish(report, args.output)
    return 1 if args.check and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
