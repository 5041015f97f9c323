"""Training-step time of the symmetric and RPC language models, and Lightning's token throughput vs a plain loop.

Every case runs in a fresh Python process. Without ``--paper-size`` (the default on CPU) the script measures parts 1
and 2; ``--paper-size`` (the default with ``--device cuda``) measures part 3 instead. Legend: B batch, N context
(256), V vocabulary (8000; part 3: 267,735).

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
3. The paper's model at its real size (``--paper-size``): the training step of the authors' set-up as the app's
   ``configs/language_model/lm-16l128d_{symmetric,rpc}_1xb96-500k_wikitext103-256_published.yaml`` train it (the
   network's arguments, vocabulary, context, batch 96, Adam and clipping read from those files: 16 post-LN layers,
   width 128, 8 heads, FFN 2048 with ReLU, no attention biases, an adaptive softmax over 267,735 words; RPC with 2
   iterations in all layers, backend auto, i.e. Triton on CUDA and torch on CPU): ``token_nll(...).mean()``, the
   app's training loss, on random tokens drawn with Zipf (1 / rank) frequencies, so that the adaptive softmax's
   clusters see about the shares of real text; backward, clipping, Adam. Symmetric and RPC, eager and compiled (the
   trunk, ``LanguageModelModule.compiled_methods``, as ``--model.compile true`` compiles it), each in its own
   process: ``--warmup`` untimed steps (compiled, the first includes the compilation and is reported), then the
   median of ``--steps`` timed steps, each synchronised. The table gives tokens/s, ms/step, the ratio to the
   symmetric model of the same mode and the peak GPU memory. ``--vocab``, ``--context``, ``--depth`` and
   ``--batch`` shrink it for a CPU run (the adaptive cutoffs scaled to the vocabulary).

Run from the repository root::

    python benchmarks/language_model.py --quick      # 4 and 2 layers, fewer steps, one round
    python benchmarks/language_model.py --threads 1  # the shapes above, two rounds: ~3 min on 2 busy CPU cores
    python benchmarks/language_model.py --device cuda --no-paper-size --check --output bench.md   # parts 1 and 2
    python benchmarks/language_model.py --device cuda --output lm_cuda.md   # part 3: batch 96, eager and compiled
    python benchmarks/language_model.py --paper-size --vocab 2000 --context 32 --depth 2 --batch 2 --steps 2 --warmup 1

On CUDA every part runs under bf16 autocast (Lightning: ``precision="bf16-mixed"``), as the paper's configs do.
Timings take the minimum over repeats because that is the one least disturbed by other load. Intra-op threads are
torch's default; on a CPU shared with other busy processes they oversubscribe the cores and every step slows down
erratically, so use ``--threads 1`` there.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from harness import (
    STEP_MODES,
    Check,
    add_common_options,
    autocast,
    check,
    csv,
    decay_groups,
    mode_rows,
    publish,
    rate_table,
    read_config,
    render_targets,
    run_rows,
    settings_line,
    spawn_rounds,
    synchronize,
    time_steps,
    work,
)

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


def run_step_case(case: dict) -> dict:
    """Time forward + backward + Adam steps of one model on random tokens; returns the fastest step time (ms)."""
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

    timings = time_steps(step, device, STEP_WARMUP, case["steps"])
    return {"time_ms": timings["best_ms"], "steps": case["steps"]}


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
    optimizer = torch.optim.Adam(decay_groups(net), lr=LR)
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
    lines += render_targets(checks, digits=2)
    return "\n".join(lines) + "\n", all(check[-1] for check in checks)


# Part 3: the paper's model at its real size (--paper-size).

PAPER_CONFIGS = {  # attention -> (label, the app's config of the authors' set-up)
    "symmetric": ("symmetric", "configs/language_model/lm-16l128d_symmetric_1xb96-500k_wikitext103-256_published.yaml"),
    "rpc": (
        "RPC, 2 iterations in all layers",
        "configs/language_model/lm-16l128d_rpc_1xb96-500k_wikitext103-256_published.yaml",
    ),
}
PUBLISHED_VOCAB = 267735  # WikiText-103's word vocabulary, for which the configs' adaptive cutoffs are set


def read_paper_config(attention: str) -> dict:
    """What a step of the ``attention`` model needs from its published config: net arguments, sizes, Adam, clipping."""
    config = read_config(PAPER_CONFIGS[attention][1])
    return {
        "init_args": config["model"]["net"]["init_args"],
        "vocab": config["data"]["tokenizer"]["vocab_size"],
        "context": config["data"]["context"],
        "batch": config["data"]["batch_size"],
        "optimizer": config["model"]["optimizer"],
        "grad_clip": config["trainer"]["gradient_clip_val"],
    }


def scaled_cutoffs(cutoffs: list[int], vocab: int) -> list[int]:
    """The adaptive softmax's cutoffs scaled from WikiText-103's vocabulary to ``vocab`` (as the app suggests)."""
    if vocab == PUBLISHED_VOCAB:
        return cutoffs
    return sorted({min(max(round(c * vocab / PUBLISHED_VOCAB), 1), vocab - 1) for c in cutoffs})


def build_paper_step(case: dict):
    """The seeded published model of ``case`` and a closure running one training step as the app trains it.

    The step is ``token_nll(inputs, targets).mean()`` (LanguageModelModule's training loss) under bf16 autocast on
    CUDA, backward, gradient-norm clipping and the config's optimizer, on a fixed batch of random tokens drawn with
    Zipf (1 / rank) frequencies, so that the adaptive softmax's clusters see about the shares of real text. Compiled,
    the network's ``LanguageModelModule.compiled_methods`` (its trunk) are compiled in place, as ``--model.compile
    true`` does.
    """
    import torch

    from kpca.attention import AttentionSpec
    from kpca.language_model.model import CausalTransformerLM
    from kpca.language_model.module import LanguageModelModule
    from kpca.training.module import CompileOptions, compile_in_place

    config, device, vocab = case["config"], case["device"], case["vocab"]
    init = dict(config["init_args"], attention=AttentionSpec(**config["init_args"]["attention"]))
    init["adaptive_cutoffs"] = scaled_cutoffs(init["adaptive_cutoffs"], vocab)
    init["depth"] = case["depth"] or init["depth"]
    torch.manual_seed(0)
    net = CausalTransformerLM(vocab_size=vocab, context=case["context"], **init).to(device)
    if case["mode"] == "compiled":
        compile_in_place(net, LanguageModelModule.compiled_methods, CompileOptions())
    optimizer_class = getattr(torch.optim, config["optimizer"]["class_path"].rsplit(".", 1)[-1])
    optimizer = optimizer_class(net.parameters(), **config["optimizer"]["init_args"])
    zipf = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)  # (V,) word frequencies ~ 1 / rank
    tokens = torch.multinomial(zipf, case["batch"] * (case["context"] + 1), replacement=True)
    tokens = tokens.view(case["batch"], case["context"] + 1).to(device)  # (B, N + 1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (B, N) each

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device):
            loss = net.token_nll(inputs, targets).mean()  # mean over B * N
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), config["grad_clip"])
        optimizer.step()

    return step


def run_paper_case(case: dict) -> dict:
    """Time one model of the real-size table (see :func:`harness.time_steps`)."""
    return time_steps(build_paper_step(case), case["device"], case["warmup"], case["steps"])


def paper_targets(results: dict[tuple[str, str], dict]) -> list[Check]:
    """RPC / symmetric step time per mode where both ran, against the same 1.25 as parts 1 and 2."""
    checks = []
    for mode in STEP_MODES:
        rpc, sym = results.get((mode, "rpc"), {}), results.get((mode, "symmetric"), {})
        if "time_ms" in rpc and "time_ms" in sym:
            checks.append(check(f"step time: RPC / symmetric, {mode}", rpc["time_ms"] / sym["time_ms"], "<=", 1.25))
    return checks


def render_paper(results: dict[tuple[str, str], dict], args: argparse.Namespace) -> tuple[str, bool]:
    """The Markdown report of part 3 and whether every target passed."""
    dtype = "bf16 autocast" if args.device == "cuda" else "fp32"
    init = read_paper_config("symmetric")["init_args"]
    checks = paper_targets(results)
    lines = [
        settings_line(results, args.device, dtype),
        "",
        f"Training step of the paper's WikiText-103 model as the `_published` configs train it: "
        f"{args.depth or init['depth']} post-LN layers, width {init['width']}, {init['num_heads']} heads, FFN "
        f"{init['ffn_dim']}, adaptive softmax over {args.vocab:,} words, context {args.context}, batch {args.batch}, "
        "Adam, clipping; Zipf-distributed random tokens. RPC: backend auto (Triton on CUDA, torch on CPU). Median of "
        f"{args.steps} timed steps after {args.warmup} warm-up step(s), each row in its own process; compiled: the "
        "trunk, as `--model.compile true`; its first step includes the compilation.",
        "",
        *rate_table(
            results, {k: v[0] for k, v in PAPER_CONFIGS.items()}, ("attention", "tokens/s"), args.batch * args.context
        ),
    ]
    lines += render_targets(checks)
    return "\n".join(lines) + "\n", all(c[-1] for c in checks)


def main_paper_size(args: argparse.Namespace) -> int:
    """Part 3: each model and mode in its own process, then the report; 1 if one failed, or with --check a target."""
    keys = ("device", "batch", "context", "vocab", "depth", "warmup", "steps", "threads")
    sizes = {key: getattr(args, key) for key in keys}
    cases = {
        (mode, attention): {"kind": "paper", "mode": mode, "config": read_paper_config(attention), **sizes}
        for mode, attention in mode_rows(args.modes, list(PAPER_CONFIGS))
    }
    results = run_rows(__file__, cases, lambda so_far: render_paper(so_far, args)[0], args.output)
    report, passed = render_paper(results, args)
    publish(report, args.output)
    failed = any("error" in r for r in results.values())
    return 1 if failed or (args.check and not passed) else 0


def parse_args() -> argparse.Namespace:
    """Command-line options; --quick, --device and --paper-size change the defaults of those left unset."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--paper-size",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run part 3 instead of parts 1 and 2 (default: on CUDA)",
    )
    p.add_argument("--batch", type=int, default=None, help="batch (default 4 on CPU, 64 on CUDA; part 3: 96)")
    p.add_argument("--depth", type=int, default=None, help="layers of the step-time models (default 16; --quick: 4)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per case (default 3; --quick: 2; part 3: 10)")
    p.add_argument("--fit-depth", type=int, default=None, help="layers of the fitted model (default 4; --quick: 2)")
    p.add_argument("--fit-steps", type=int, default=None, help="timed steps per fit (default 12; --quick: 6)")
    p.add_argument("--rounds", type=int, default=None, help="runs of each case, in turn (default 2; --quick: 1)")
    p.add_argument("--quick", action="store_true", help="shallower models, fewer steps, one round")
    p.add_argument("--modes", type=csv(STEP_MODES), default=list(STEP_MODES), help="part 3 (default eager,compiled)")
    p.add_argument("--warmup", type=int, default=3, help="part 3: untimed steps before the timed ones (default 3)")
    p.add_argument("--context", type=int, default=None, help="part 3: context N (default: the configs' 256)")
    p.add_argument("--vocab", type=int, default=None, help="part 3: vocabulary (default: the configs' 267,735)")
    p.add_argument("--check", action="store_true", help="exit 1 if any target fails")
    add_common_options(p)
    args = p.parse_args()
    if args.paper_size is None:
        args.paper_size = args.device == "cuda"
    if args.paper_size:
        paper = read_paper_config("symmetric")
        for name, default in {"batch": paper["batch"], "steps": 10, "context": paper["context"]}.items():
            setattr(args, name, default if getattr(args, name) is None else getattr(args, name))
        args.vocab = args.vocab or paper["vocab"]
        if min(args.batch, args.steps, args.context, args.depth or 1, args.warmup + 1) < 1 or args.vocab < 2:
            p.error("--batch, --steps, --context and --depth must be at least 1, --warmup 0, --vocab 2")
        return args
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
        return work(args.worker, {"step": run_step_case, "fit": run_fit_case, "paper": run_paper_case})
    if args.paper_size:
        return main_paper_size(args)
    common = {"device": args.device, "batch": args.batch, "threads": args.threads}
    step_cases = {
        name: {**common, "kind": "step", "model": name, "depth": args.depth, "steps": args.steps} for name in MODELS
    }
    fit_cases = {
        loop: {**common, "kind": "fit", "loop": loop, "fit_depth": args.fit_depth, "steps": args.fit_steps}
        for loop in LOOPS
    }
    step_runs = spawn_rounds(__file__, step_cases, args.rounds)
    fit_runs = spawn_rounds(__file__, fit_cases, args.rounds)
    report, passed = render(step_runs, fit_runs, args)
    publish(report, args.output)
    return 1 if args.check and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
