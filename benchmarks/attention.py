"""Forward + backward time and peak memory of softmax (SDPA), RPC and reference RPC attention.

Each (method, N) case runs in a fresh Python process so that one case's peak memory cannot
pollute another's. Inputs are (B, H, N, D); the loss is ``out.sum()``, backpropagated into the
leaf tensors (q, k, v for SDPA; k, v for RPC and the reference).

Run from the repository root::

    python benchmarks/attention.py --quick                # N in {256, 1024}: about 20 s on 2 CPU cores
    python benchmarks/attention.py                        # N in {256, 1024, 4096}: about 40 s on 2 CPU cores
    python benchmarks/attention.py --device cuda          # bf16 on CUDA
    python benchmarks/attention.py --check --output bench.md   # exit 1 if a target fails; also write Markdown

Memory on CPU is the growth of the resident set during the first forward + backward (peak RSS
from ``getrusage`` minus the RSS after the inputs exist), so it also counts one-time library
set-up and what the C allocator keeps after frees; on CUDA it is ``max_memory_allocated`` minus
``memory_allocated`` around one forward + backward after a warm-up. The targets are checked at
the largest N where both of their methods ran (N = 1024 with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from kpca.attention import rpc_attention, softmax_attention
from kpca.attention.reference import rpc_attention_reference

METHODS = ("sdpa", "rpc", "reference")
LAMBD = 4.0
TIMING_BUDGET_S = 2.0  # timed repeats per case: as many as fit in this budget, between 1 and MAX_REPEATS
MAX_REPEATS = 5
MB = 2**20


def rss_bytes() -> int:
    """Current resident set size of this process (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_step(case: dict):
    """Build the case's leaf inputs and return a closure running one forward + backward."""
    device = torch.device(case["device"])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = (case["batch"], case["heads"], case["n"], case["head_dim"])
    n_leaves = 3 if case["method"] == "sdpa" else 2  # q, k, v or k, v
    leaves = [torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(n_leaves)]
    n_iter = case["n_iter"]
    attend = {
        "sdpa": lambda q, k, v: softmax_attention(q, k, v),
        "rpc": lambda k, v: rpc_attention(k, v, n_iter=n_iter, lambd=LAMBD),
        "reference": lambda k, v: rpc_attention_reference(k, v, n_iter=n_iter, lambd=LAMBD),
    }[case["method"]]

    def step() -> None:
        attend(*leaves).sum().backward()
        for leaf in leaves:  # drop the gradients so that every pass allocates them afresh
            leaf.grad = None

    return step


def run_case(case: dict) -> dict:
    """Measure one (method, N) case in this process: peak memory (MB) and the minimum time over repeats (ms)."""
    torch.manual_seed(0)
    cuda = case["device"] == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    step = make_step(case)
    result = {}
    if cuda:
        step()  # warm-up; CUDA peak statistics can be reset, so the measured pass is a clean one
        sync()
        baseline = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        sync()
        result["mem_mb"] = (torch.cuda.max_memory_allocated() - baseline) / MB
    else:
        baseline = rss_bytes()
        step()  # the first pass also serves as the warm-up
        result["rss_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline) / MB  # KiB
        result["mem_mb"] = cpu_tensor_peak(step) / MB
    times = []
    while len(times) < MAX_REPEATS and (not times or sum(times) < TIMING_BUDGET_S):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return {"time_ms": min(times) * 1e3, **result}  # the minimum: least disturbed by other load


def cpu_tensor_peak(step) -> int:
    """Peak bytes of CPU tensors allocated and not yet freed during one ``step()``, from profiler events."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = prof.profiler.kineto_results.events()
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in deltas:
        live += nbytes
        peak = max(peak, live)
    return peak


def spawn_case(case: dict) -> dict:
    """Run :func:`run_case` in a fresh interpreter and return its result."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(case)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"case {case} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def skip_reference(n: int, args: argparse.Namespace) -> bool:
    """The reference is skipped above N = 1024 with --quick, and at N = 4096 and above on CUDA."""
    return (args.quick and n > 1024) or (args.device == "cuda" and n >= 4096)


def target_checks(results: dict, n_iter: int) -> list[tuple[str, int, float, str, float, bool]]:
    """(name, N, value, comparison, target, passed) per target, at the largest N where its methods ran."""
    specs = [
        ("time: rpc / (n x sdpa)", "rpc", "sdpa", "time_ms", n_iter, "<=", 1.15),
        ("memory: rpc / (n x sdpa)", "rpc", "sdpa", "mem_mb", n_iter, "<=", 1.25),
        ("speed vs reference: reference / rpc", "reference", "rpc", "time_ms", 1, ">=", 2.0),
        ("memory vs reference: reference / rpc", "reference", "rpc", "mem_mb", 1, ">=", 5.0),
    ]
    checks = []
    for name, num, den, key, factor, op, target in specs:
        ns = [n for (method, n) in results if method == num and (den, n) in results]
        if ns:
            n = max(ns)
            value = results[num, n][key] / max(factor * results[den, n][key], 1e-9)
            checks.append((name, n, value, op, target, value <= target if op == "<=" else value >= target))
    return checks


def render(results: dict, checks: list, args: argparse.Namespace) -> str:
    """The Markdown report: settings, one row per case, then the target checks."""
    dtype = "bf16" if args.device == "cuda" else "fp32"
    lines = [
        f"device={args.device} dtype={dtype} B={args.batch} H={args.heads} D={args.head_dim} "
        f"n_iter={args.n_iter} lambd={LAMBD} torch={torch.__version__} threads={torch.get_num_threads()}",
        "",
        "| N | method | time (ms) | tensor peak (MB) | RSS growth (MB) | time / sdpa | mem / sdpa |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for (method, n), r in sorted(results.items(), key=lambda item: (item[0][1], METHODS.index(item[0][0]))):
        base = results.get(("sdpa", n))
        t_ratio = f"{r['time_ms'] / base['time_ms']:.2f}" if base else "-"
        m_ratio = f"{r['mem_mb'] / base['mem_mb']:.2f}" if base and base["mem_mb"] > 0 else "-"
        rss = f"{r['rss_mb']:.1f}" if "rss_mb" in r else "-"
        lines.append(f"| {n} | {method} | {r['time_ms']:.1f} | {r['mem_mb']:.1f} | {rss} | {t_ratio} | {m_ratio} |")
    lines += ["", f"Targets (n = {args.n_iter}):", ""]
    for name, n, value, op, target, passed in checks:
        lines.append(f"- {name} at N={n}: {value:.2f} (target {op} {target}) {'PASS' if passed else 'FAIL'}")
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--seq-lens", type=int, nargs="+", default=None, help="default 256 1024 4096 (--quick: 256 1024)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--n-iter", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="N in {256, 1024}; no reference above N = 1024")
    p.add_argument("--check", action="store_true", help="exit 1 if any target fails")
    p.add_argument("--output", help="also write the Markdown report to this path")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> int:
    """Run every case in its own process, print the report, and return the exit status."""
    args = parse_args()
    if args.worker:
        print(json.dumps(run_case(json.loads(args.worker))))
        return 0
    seq_lens = args.seq_lens or ([256, 1024] if args.quick else [256, 1024, 4096])
    common = {"device": args.device, "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim}
    results = {}
    for n in seq_lens:
        for method in METHODS:
            if method == "reference" and skip_reference(n, args):
                continue
            results[method, n] = spawn_case({"method": method, "n": n, "n_iter": args.n_iter, **common})
    checks = target_checks(results, args.n_iter)
    report = render(results, checks, args)
    print(report, end="")
    if args.output:
        with open(args.output, "w") as f:
            f.write(report)
    return 1 if args.check and not all(check[-1] for check in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
