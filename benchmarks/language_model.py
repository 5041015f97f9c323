"""Training-step time of the symmetric and RPC language models, and Lightning's token throughput vs a plain loop.

Every case runs in a fresh Python process. Legend: B batch, N context (256), V vocabulary (8000).

1. Step time: one forward + backward + Adam step of :class:`~kpca.language_model.model.CausalTransformerLM` at
   the paper's WikiText-103 shapes (16 post-LN layers, width 128, 8 heads, FFN 2048, context 256, dropout 0.1,
   tied embeddings; vocabulary 8000) on a batch of random tokens, with symmetric attention and with RPC (2 PAP
   iterations in all layers). Two warm-up steps, then the minimum over ``--steps`` timed steps; the models run in
   turn, once per round, and the fastest round counts.
2. Lightning overhead: tokens/s of ``Trainer.fit`` on :class:`~kpca.language_model.module.LanguageModelModule`
   against a plain PyTorch loop doing the same work: the same :class:`~kpca.language_model.data.TokenBlocks` over
   a memory-mapped file of random tokens (in order, loaded in the main process), the same symmetric model with
   ``--fit-depth`` layers (otherwise the shapes above), cross-entropy, Adam at lr 2.5e-4 over the same decay /
   no-decay groups with the same per-step cosine LambdaLR, and gradient-norm clipping at 0.25. The module also
   logs its loss, perplexity, tokens/s and lr every step, as it does for users. After three warm-up steps each
   step is timed from the end of the previous step to its own end (Lightning: consecutive
   ``on_train_batch_end`` hooks), so that it covers loading the batch and every hook; the fastest step counts,
   and the table also shows the throughput over all timed steps. Plain and Lightning runs alternate (one pair per
   round) and the best run of each counts.

Run from the repository root::

    python benchmarks/language_model.py --quick      # 4 and 2 layers, fewer steps, one round
    python benchmarks/language_model.py --threads 1  # the shapes above, two rounds: ~3 min on 2 busy CPU cores
    python benchmarks/language_model.py --device cuda --check --output bench.md   # bf16 autocast; exit 1 on FAIL

On CUDA both parts run under bf16 autocast (Lightning: ``precision="bf16-mixed"``), as the paper's configs do.
Timings take the minimum over repeats because that is the one least disturbed by other load. Intra-op threads are
torch's default; on a CPU shared with other busy processes they oversubscribe the cores and every step slows down
erratically, so use ``--threads 1`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from harness import Check, check, spawn, write_report

# torch and Lightning are imported inside the worker functions: the parent only spawns workers and skips their
# ~5 s of imports.

MODELS = {  # name -> (label, AttentionSpec keywords), in table order
    "symmetric": ("symmetric", {"kind": "symmetric"}),
    "rpc2-all": ("RPC, 2 iterations in all layers", {"kind": "rpc", "n_iter": 2, "layers": "all"}),
}
LOOPS = ("plain", "lightning")
VOCAB = 8000
CONTEXT = 256
WIDTH = 128
HEADS = 8
FFN_DIM = 2048
DROPOUT = 0.1
LR = 2.5e-4
GRAD_CLIP = 0.25
STEP_WARMUP = 2  # untimed steps before the step-time measurements
FIT_WARMUP = 3  # untimed steps at the start of each fit


def build_net(depth: int, spec: dict):
    """A seeded CausalTransformerLM at the paper's shapes with ``depth`` layers and the given attention."""
    import torch

    from kpca.attention import AttentionSpec
    from kpca.language_model.model import CausalTransformerLM

    torch.manual_seed(0)
    return CausalTransformerLM(
        VOCAB, CONTEXT, WIDTH, depth, HEADS, FFN_DIM, DROPOUT, attention=AttentionSpec(**spec), norm_position="post"
    )


def autocast(device: str):
    """bf16 autocast on CUDA; a no-op context on CPU (fp32)."""
    import torch

    return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda")


def synchronize(device: str) -> None:
    """Wait for queued CUDA work so that wall-clock times cover it."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def run_step_case(case: dict) -> dict:
    """Time forward + backward + Adam steps of one model on random tokens; returns the minimum step time (ms)."""
    import torch
    import torch.nn.functional as F

    device = case["device"]
    _, spec = MODELS[case["model"]]
    net = build_net(case["depth"], spec).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    tokens = torch.randint(0, VOCAB, (case["batch"], CONTEXT + 1), device=device)  # (B, N + 1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (B, N) each

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device):
            logits = net(inputs)  # (B, N, V)
        F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).backward()
        optimizer.step()

    for _ in range(STEP_WARMUP):
        step()
    times = []
    for _ in range(case["steps"]):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {"time_ms": min(times) * 1e3, "steps": len(times)}


def fit_setup(case: dict, folder: str):
    """A loader over ``FIT_WARMUP + steps`` batches of random token blocks (file under ``folder``) and a seeded net."""
    import numpy as np
    from torch.utils.data import DataLoader

    from kpca.language_model.data import TokenArray, TokenBlocks

    length = case["batch"] * (FIT_WARMUP + case["steps"]) * CONTEXT + 1  # one block of N + 1 tokens per item
    path = os.path.join(folder, "tokens.bin")
    np.random.default_rng(0).integers(0, VOCAB, length, dtype=np.uint16).tofile(path)
    blocks = TokenBlocks(TokenArray(path, "uint16", length, words=0), CONTEXT)
    loader = DataLoader(blocks, batch_size=case["batch"], shuffle=False)  # the same batches, in the same order
    return loader, build_net(case["fit_depth"], MODELS["symmetric"][1])


def run_plain(case: dict, folder: str) -> list[float]:
    """Train with a plain PyTorch loop; returns the time at the end of each step (s)."""
    import math

    import torch
    import torch.nn.functional as F

    device = case["device"]
    loader, net = fit_setup(case, folder)
    net.to(device).train()
    skip = net.no_weight_decay()
    params = list(net.named_parameters())
    groups = [
        {"params": [p for name, p in params if p.ndim > 1 and name not in skip]},
        {"params": [p for name, p in params if p.ndim <= 1 or name in skip], "weight_decay": 0.0},
    ]  # LanguageModelModule's decay / no-decay rule
    optimizer = torch.optim.Adam(groups, lr=LR)
    total = len(loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step / total, 1.0)))
    )  # LanguageModelModule's schedule without warm-up, decaying to 0

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One optimizer step on (B, N) inputs and targets; its activations are freed on return, as in Lightning."""
        with autocast(device):
            logits = net(inputs.to(device))  # (B, N, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.to(device).flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), GRAD_CLIP)
        optimizer.step()
        scheduler.step()

    ends = []
    for inputs, targets in loader:
        step(inputs, targets)
        synchronize(device)
        ends.append(time.perf_counter())
    return ends


def run_lightning(case: dict, folder: str) -> list[float]:
    """Train with ``Trainer.fit`` on LanguageModelModule; returns the time at the end of each step (s)."""
    import lightning.pytorch as pl
    import torch

    from kpca.language_model.module import LanguageModelModule

    device = case["device"]

    class StepTimer(pl.Callback):
        """Records the time at each ``on_train_batch_end``."""

        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
            synchronize(device)
            self.ends.append(time.perf_counter())

    loader, net = fit_setup(case, folder)
    module = LanguageModelModule(net, optimizer=lambda groups: torch.optim.Adam(groups, lr=LR), warmup_steps=0)
    timer = StepTimer()
    trainer = pl.Trainer(
        accelerator=device,
        devices=1,
        max_steps=len(loader),
        precision="bf16-mixed" if device == "cuda" else "32-true",
        gradient_clip_val=GRAD_CLIP,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(module, train_dataloaders=loader)
    return timer.ends


def run_fit_case(case: dict) -> dict:
    """Train with one loop; returns tokens/s of the fastest timed step and over all timed steps."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        ends = run_plain(case, folder) if case["loop"] == "plain" else run_lightning(case, folder)
    steps = [end - previous for previous, end in zip(ends[FIT_WARMUP - 1 : -1], ends[FIT_WARMUP:], strict=True)]
    tokens = case["batch"] * CONTEXT  # per step
    return {
        "tokens_per_s": tokens / min(steps),
        "mean_tokens_per_s": tokens * len(steps) / sum(steps),
        "steps": len(steps),
    }


def run_case(case: dict) -> dict:
    """Run one case in this process; the result also names the torch version, the threads and the device."""
    import torch

    if case["threads"]:
        torch.set_num_threads(case["threads"])
    result = run_step_case(case) if case["kind"] == "step" else run_fit_case(case)
    name = torch.cuda.get_device_name() if case["device"] == "cuda" else "CPU"
    return {**result, "torch": torch.__version__, "threads": torch.get_num_threads(), "device_name": name}


def spawn_case(case: dict) -> dict:
    """Run :func:`run_case` in a fresh interpreter and return its result."""
    return spawn(__file__, ["--worker", json.dumps(case)])


def target_checks(steps: dict, fits: dict) -> list[Check]:
    """(name, value, comparison, target, passed) per target, from the best step times (ms) and tokens/s."""
    specs = [
        ("step time: rpc2-all / symmetric", steps["rpc2-all"] / steps["symmetric"], "<=", 1.25),
        ("throughput: lightning / plain (tokens/s)", fits["lightning"] / fits["plain"], ">=", 0.95),
    ]
    return [check(*spec) for spec in specs]


def render(step_runs: dict, fit_runs: dict, args: argparse.Namespace) -> tuple[str, bool]:
    """The Markdown report (settings, step times, throughputs, target checks) and whether every target passed."""
    steps = {name: min(r["time_ms"] for r in runs) for name, runs in step_runs.items()}
    fits = {loop: max(r["tokens_per_s"] for r in runs) for loop, runs in fit_runs.items()}
    checks = target_checks(steps, fits)
    worker = step_runs["symmetric"][0]
    dtype = "bf16 autocast" if args.device == "cuda" else "fp32"
    lines = [
        f"device={args.device} ({worker['device_name']}) dtype={dtype} torch={worker['torch']} "
        f"threads={worker['threads']}",
        "",
        f"Step time (forward + backward + Adam), {args.depth} layers, width {WIDTH}, {HEADS} heads, FFN {FFN_DIM}, "
        f"context {CONTEXT}, vocabulary {VOCAB}, batch {args.batch}, fastest of {args.steps} step(s), "
        f"best of {args.rounds} round(s):",
        "",
        "| attention | step (ms) | per round (ms) | / symmetric |",
        "|---|---:|---:|---:|",
    ]
    for name, (label, _) in MODELS.items():
        t, runs = steps[name], ", ".join(f"{r['time_ms']:.0f}" for r in step_runs[name])
        lines.append(f"| {label} | {t:.0f} | {runs} | {t / steps['symmetric']:.2f} |")
    lines += [
        "",
        f"Training throughput, symmetric model with {args.fit_depth} layers (otherwise as above), batch {args.batch}, "
        f"Adam + cosine LambdaLR + clipping {GRAD_CLIP}: {args.fit_steps} timed steps after {FIT_WARMUP} warm-up "
        f"steps, best of {args.rounds} run(s):",
        "",
        "| loop | tokens/s (fastest step) | per run | tokens/s (all timed steps, best run) | / plain |",
        "|---|---:|---:|---:|---:|",
    ]
    for loop in LOOPS:
        runs = ", ".join(f"{r['tokens_per_s']:.0f}" for r in fit_runs[loop])
        mean = max(r["mean_tokens_per_s"] for r in fit_runs[loop])
        lines.append(f"| {loop} | {fits[loop]:.0f} | {runs} | {mean:.0f} | {fits[loop] / fits['plain']:.2f} |")
    lines += ["", "Targets:", "", "| measurement | value | target | result |", "|---|---:|---|---|"]
    for name, value, op, target, passed in checks:
        lines.append(f"| {name} | {value:.2f} | {op} {target} | {'PASS' if passed else 'FAIL'} |")
    return "\n".join(lines) + "\n", all(check[-1] for check in checks)


def parse_args() -> argparse.Namespace:
    """Command-line options; --quick and --device change the defaults of those left unset."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--batch", type=int, default=None, help="batch of both parts (default 4 on CPU, 64 on CUDA)")
    p.add_argument("--depth", type=int, default=None, help="layers of the step-time models (default 16; --quick: 4)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per step-time case (default 3; --quick: 2)")
    p.add_argument("--fit-depth", type=int, default=None, help="layers of the fitted model (default 4; --quick: 2)")
    p.add_argument("--fit-steps", type=int, default=None, help="timed steps per fit (default 12; --quick: 6)")
    p.add_argument("--rounds", type=int, default=None, help="runs of each case, in turn (default 2; --quick: 1)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="shallower models, fewer steps, one round")
    p.add_argument("--check", action="store_true", help="exit 1 if any target fails")
    p.add_argument("--output", help="also write the Markdown report to this path")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    quick_defaults = {"depth": 4, "steps": 2, "fit_depth": 2, "fit_steps": 6, "rounds": 1}
    full_defaults = {"depth": 16, "steps": 3, "fit_depth": 4, "fit_steps": 12, "rounds": 2}
    for name, full in full_defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick_defaults[name] if args.quick else full)
    if args.batch is None:
        args.batch = 64 if args.device == "cuda" else 4
    if min(args.batch, args.depth, args.steps, args.fit_depth, args.fit_steps, args.rounds) < 1:
        p.error("--batch, --depth, --steps, --fit-depth, --fit-steps and --rounds must be at least 1")
    return args


def main() -> int:
    """Run every case in its own process, print the report, and return the exit status."""
    args = parse_args()
    if args.worker:
        print(json.dumps(run_case(json.loads(args.worker))))
        return 0
    common = {"device": args.device, "batch": args.batch, "threads": args.threads}
    step_runs = {name: [] for name in MODELS}
    for _ in range(args.rounds):
        for name in MODELS:
            case = {**common, "kind": "step", "model": name, "depth": args.depth, "steps": args.steps}
            step_runs[name].append(spawn_case(case))
    fit_runs = {loop: [] for loop in LOOPS}
    for _ in range(args.rounds):
        for loop in LOOPS:
            case = {**common, "kind": "fit", "loop": loop, "fit_depth": args.fit_depth, "steps": args.fit_steps}
            fit_runs[loop].append(spawn_case(case))
    report, passed = render(step_runs, fit_runs, args)
    print(report, end="")
    write_report(args.output, report)
    return 1 if args.check and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
