"""Forward + backward time and peak memory of softmax (SDPA), RPC, reference RPC and the robust family.

Each case (method, shape) runs in a fresh Python process so that one case's peak memory cannot
pollute another's. Inputs are (B, H, N, D), D = 64; the loss is ``out.sum()``, backpropagated
into the leaf tensors (q, k, v for SDPA; k, v for RPC and the reference). RPC uses n_iter = 2.
The robust family (issue 37) beside them, each a ratio to softmax and to symmetric attention: ``symmetric``
(SDPA with q = k; leaves k, v), ``twicing`` (two SDPA calls; q, k, v), ``neutreno`` (SDPA plus
lambd (v_first - v), lambd 0.6; q, k, v and v_first, which gets gradients as the first block's values do) and
``elliptical`` (SDPA on q * m, m from |v - v_prev| without gradient; q, k, v and a v_prev that needs none).
On CPU they run at every shape; on CUDA at the DeiT-tiny shape 256x3x197 only (the step's time limit in
``make test-gpu``).

Run from the repository root::

    python benchmarks/attention.py --quick               # CPU fp32, B=1 H=4, N in {256, 1024}
    python benchmarks/attention.py                       # CPU fp32, B=1 H=4, N in {256, 1024, 4096}
    python benchmarks/attention.py --device cuda         # CUDA bf16: B*H=64 at N in {1024, 4096}; B=256 H=3 N=197
    python benchmarks/attention.py --device cuda --dtype float16   # the same cases in another dtype
    python benchmarks/attention.py --device cuda --sweep # also the Triton launch-configuration sweep
    python benchmarks/attention.py --check --output bench.md   # exit 1 if a target fails; also write Markdown

The inputs' dtype is ``--dtype``: bfloat16 on CUDA and float32 on CPU by default. Methods: ``sdpa``
(softmax attention, one fused SDPA call), ``rpc`` (``backend="auto"``: Triton kernels for CUDA inputs, the
torch path otherwise), ``rpc_torch`` (CUDA only: the torch path, for comparison) and ``reference`` (the
loop-by-loop oracle that materialises N x N maps; CPU only).

"tensor peak" is the peak of live tensor bytes above the inputs during one forward + backward
after a warm-up: on CUDA ``max_memory_allocated`` minus ``memory_allocated``; on CPU the running
sum of the profiler's allocation and free events (PyTorch keeps no CPU allocator statistics). The
memory targets use it. On CPU the table also shows "RSS growth" over the first forward + backward
(peak RSS from ``getrusage`` minus RSS after the inputs exist): it adds about 9 MB of one-time
library set-up, and glibc heap fragmentation, which RPC's short-lived element-wise temporaries
inflate well beyond the live tensors. Times are the minimum over repeats (the least disturbed).
On CUDA the report ends with the fused PAP step's bandwidth against its physical floor, a
``torch.clone`` of the same bytes, at N in {197, 4096}, D in {64, 72}, bfloat16 and float32, through the
``kpca::pap_step`` custom op; with ``--sweep`` also a sweep of the Triton launch configuration (warps and tile size,
through ``kpca.attention.triton_tuning.launched_with``) that picks the backend's default
(about 40 s more: ``make test-gpu`` leaves it out).
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import sys
import time
from collections.abc import Callable

import torch
from harness import Check, check, publish, render_targets, spawn_case, work

from kpca.attention import (
    elliptical_attention,
    neutreno_attention,
    rpc_attention,
    softmax_attention,
    twicing_attention,
)
from kpca.attention.reference import rpc_attention_reference
from kpca.attention.triton_tuning import launch_configuration, launched_with

LAMBD = 4.0
DEFAULT_DTYPES = {"cuda": "bfloat16", "cpu": "float32"}  # --dtype when not given
SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}  # as the report's header names them
N_ITER = 2
NEUTRENO_LAMBD = 0.6  # the papers' vision setting
FAMILY = ("symmetric", "twicing", "neutreno", "elliptical")  # the ratios to sdpa and to symmetric, side by side
FAMILY_CUDA_SHAPES = [(256, 3, 197)]  # DeiT-tiny at batch 256: the family's CUDA cases fit the proof's time limit
HEAD_DIM = 64
TIMING_BUDGET_S = 2.0  # timed repeats per case: as many as fit in this budget, between 1 and MAX_REPEATS
MAX_REPEATS = 10
MB = 2**20
CPU_SHAPES = [(1, 4, 256), (1, 4, 1024), (1, 4, 4096)]  # (B, H, N)
CUDA_SHAPES = [(16, 4, 1024), (16, 4, 4096), (256, 3, 197)]  # B*H = 64, and DeiT-tiny at batch 256
BANDWIDTH_CASES = list(itertools.product((197, 4096), (64, 72), ("bfloat16", "float32")))  # (N, D, dtype)
BANDWIDTH_HEADS = 16
BANDWIDTH_ELEMENTS = 2**25  # elements of K per case (B = BANDWIDTH_ELEMENTS // (H N D)): about 0.8 GB moved in bf16
LAUNCH_SWEEP = [
    (4, 2048),
    (8, 2048),
    (4, 4096),
    (8, 4096),
]  # (num_warps, elements per tile) of the element-wise kernels


def rss_bytes() -> int:
    """Current resident set size of this process (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_step(case: dict):
    """Build the case's leaf inputs and return a closure running one forward + backward."""
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    shape = (*case["shape"], HEAD_DIM)  # (B, H, N, D)
    n_leaves = {"sdpa": 3, "twicing": 3, "neutreno": 4, "elliptical": 3}.get(case["method"], 2)  # q, k, v (v_first)
    leaves = [torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(n_leaves)]
    inputs = [*leaves, torch.randn(shape, device=device, dtype=dtype)] if case["method"] == "elliptical" else leaves
    attend = {
        "sdpa": lambda q, k, v: softmax_attention(q, k, v),
        "symmetric": lambda k, v: softmax_attention(k, k, v),
        "twicing": lambda q, k, v: twicing_attention(q, k, v),
        "neutreno": lambda q, k, v, v_first: neutreno_attention(q, k, v, v_first, lambd=NEUTRENO_LAMBD),
        "elliptical": lambda q, k, v, v_prev: elliptical_attention(q, k, v, v_prev),
        "rpc": lambda k, v: rpc_attention(k, v, n_iter=N_ITER, lambd=LAMBD),
        "rpc_torch": lambda k, v: rpc_attention(k, v, n_iter=N_ITER, lambd=LAMBD, backend="torch"),
        "reference": lambda k, v: rpc_attention_reference(k, v, n_iter=N_ITER, lambd=LAMBD),
    }[case["method"]]

    def step() -> None:
        attend(*inputs).sum().backward()
        for leaf in leaves:  # drop the gradients so that every pass allocates them afresh
            leaf.grad = None

    return step


def time_min(step, sync) -> float:
    """The minimum wall time of ``step`` in ms over as many repeats as fit in the budget."""
    times: list[float] = []
    while len(times) < MAX_REPEATS and (not times or sum(times) < TIMING_BUDGET_S):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def run_case(case: dict) -> dict:
    """Measure one case in this process: tensor peak (MB), RSS growth on CPU (MB) and time (ms)."""
    torch.manual_seed(0)
    step = make_step(case)
    if case["device"] == "cuda":
        step()  # warm-up (and Triton compilation)
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        memory = {"mem_mb": (torch.cuda.max_memory_allocated() - baseline) / MB}
        return {"time_ms": time_min(step, torch.cuda.synchronize), **memory}
    baseline = rss_bytes()
    step()  # the first pass also serves as the warm-up
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline) / MB  # ru_maxrss is in KiB
    memory = {"mem_mb": cpu_tensor_peak(step) / MB, "rss_mb": rss}
    return {"time_ms": time_min(step, lambda: None), **memory}


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


def pap_step_bytes_per_element(key_bytes: int) -> int:
    """Bytes one fused PAP step moves per element of K.

    It reads K, L (``key_bytes`` each), S and Z (float32), and writes Z', S' (float32), the cleaned
    keys Kt (``key_bytes``) and the int8 sign.
    """
    return 3 * key_bytes + 4 * 4 + 1


def per_call_ms(fn: Callable[[], object], sync: Callable[[], None], calls: int = 10, repeats: int = 5) -> float:
    """Time of one ``fn()`` in ms: ``calls`` back to back (launch overheads overlap), the minimum over ``repeats``."""
    fn()  # warm-up (and Triton compilation)
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - start) / calls)
    return min(times) * 1e3


def pap_step_bandwidth(case: dict) -> dict:
    """GB/s of the fused PAP step (``kpca::pap_step``, forward) and of ``torch.clone`` of the same bytes, per case.

    With ``case["sweep"]`` each case (N, D, dtype name) also times every launch configuration of LAUNCH_SWEEP.
    """
    device = case["device"]
    k = torch.randn(1, 1, 4, HEAD_DIM, device=device)
    rpc_attention(k, k, n_iter=N_ITER, lambd=LAMBD, backend="triton")  # registers the kpca:: custom ops
    sweep = LAUNCH_SWEEP if case["sweep"] else []
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = [bandwidth_case(sweep, device, sync, n, d, getattr(torch, dtype)) for n, d, dtype in BANDWIDTH_CASES]
    default = launch_configuration()
    return {"rows": rows, "default": f"{default.num_warps}/{default.block_elements}" if sweep else None}


def bandwidth_case(sweep: list, device: str, sync, n: int, d: int, dtype: torch.dtype) -> dict:
    """One row of :func:`pap_step_bandwidth`, with the launch configurations of ``sweep`` ((warps, elements) pairs).

    K and L are the modules' strided heads of (B, N, H, D).
    """
    b = max(1, BANDWIDTH_ELEMENTS // (BANDWIDTH_HEADS * n * d))
    shape = (b, BANDWIDTH_HEADS, n, d)  # (B, H, N, D)
    k, l = (torch.randn(b, n, BANDWIDTH_HEADS, d, device=device).to(dtype).transpose(1, 2) for _ in range(2))  # noqa: E741
    s, z = (torch.randn(shape, device=device) for _ in range(2))
    tau = torch.rand(b, BANDWIDTH_HEADS, 1, 1, device=device)
    step_bytes = k.numel() * pap_step_bytes_per_element(k.element_size())
    copied = torch.empty(step_bytes // 2, dtype=torch.uint8, device=device)  # clone reads and writes it

    def step_gbs() -> float:
        return step_bytes / per_call_ms(lambda: torch.ops.kpca.pap_step(k, tau, l, z, s), sync) / 1e6

    swept = {}
    for num_warps, block_elements in sweep:
        with launched_with(num_warps, block_elements):
            swept[f"{num_warps}/{block_elements}"] = step_gbs()
    return {
        "shape": shape,
        "dtype": str(dtype).removeprefix("torch."),
        "mb": step_bytes / MB,
        "clone_gbs": step_bytes / per_call_ms(copied.clone, sync) / 1e6,
        "pap_step_gbs": step_gbs(),  # the default launch configuration
        "sweep_gbs": swept,
    }


def render_bandwidth(bandwidth: dict) -> str:
    """The Markdown tables of :func:`pap_step_bandwidth`: against the clone floor, then the launch sweep if it ran."""
    rows, default = bandwidth["rows"], bandwidth["default"]
    lines = [
        "Fused PAP step (`kpca::pap_step`, forward) against `torch.clone` of the same bytes (its physical floor):",
        "it reads K, L, S, Z and writes Z', S', Kt and the int8 sign, 3 x dtype + 17 bytes per element.",
        "",
        "| B x H x N x D | dtype | MB moved | clone GB/s | pap_step GB/s | ratio to clone |",
        "|---|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {'x'.join(map(str, r['shape']))} | {r['dtype']} | {r['mb']:.0f} | {r['clone_gbs']:.0f} "
        f"| {r['pap_step_gbs']:.0f} | {r['pap_step_gbs'] / r['clone_gbs']:.2f} |"
        for r in rows
    ]
    configs = list(rows[0]["sweep_gbs"]) if rows else []
    if not configs:
        return "\n".join(lines) + "\n"
    header = [f"{c.replace('/', ' warps, ')}{' (default)' if c == default else ''}" for c in configs]
    lines += [
        "",
        "Launch sweep of the element-wise kernels, pap_step GB/s per (num_warps, elements per tile): the values",
        "of the backend's default (`kpca.attention.triton_tuning.launch_configuration()`) come from this table.",
        "",
        f"| B x H x N x D | dtype | {' | '.join(header)} |",
        f"|---|---|{'---:|' * len(configs)}",
    ]
    lines += [
        f"| {'x'.join(map(str, r['shape']))} | {r['dtype']} | "
        + " | ".join(f"{r['sweep_gbs'][c]:.0f}" for c in configs)
        + " |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def methods_for(device: str) -> tuple[str, ...]:
    """The methods compared on a device, in the report's order."""
    return ("sdpa", "rpc", "rpc_torch", *FAMILY) if device == "cuda" else ("sdpa", "rpc", "reference", *FAMILY)


def cases_for(device: str, shapes: list) -> list[tuple[str, tuple]]:
    """(method, shape) of every case on a device: the family on CUDA at FAMILY_CUDA_SHAPES only."""
    return [
        (method, tuple(shape))
        for shape in shapes
        for method in methods_for(device)
        if method not in FAMILY or device != "cuda" or tuple(shape) in FAMILY_CUDA_SHAPES
    ]


def target_checks(results: dict, device: str) -> list[Check]:
    """(name, value, comparison, target, passed) for each target whose cases ran."""
    if device == "cuda":
        specs = [
            (f"time: rpc / ({N_ITER} x sdpa), {b}x{h}x{n}", "rpc", "sdpa", (b, h, n), "time_ms", N_ITER, "<=", limit)
            for (b, h, n), limit in zip(CUDA_SHAPES, (1.10, 1.10, 1.30), strict=True)
        ]
    else:
        top = max((shape for _, shape in results), key=lambda s: s[2])
        specs = [
            (f"time: rpc / ({N_ITER} x sdpa), N={top[2]}", "rpc", "sdpa", top, "time_ms", N_ITER, "<=", 1.15),
            (f"memory: rpc / ({N_ITER} x sdpa), N={top[2]}", "rpc", "sdpa", top, "mem_mb", N_ITER, "<=", 1.25),
            (f"speed: reference / rpc, N={top[2]}", "reference", "rpc", top, "time_ms", 1, ">=", 2.0),
            (f"memory: reference / rpc, N={top[2]}", "reference", "rpc", top, "mem_mb", 1, ">=", 5.0),
        ]
    checks = []
    for name, num, den, shape, key, factor, op, target in specs:
        if (num, shape) in results and (den, shape) in results:
            value = results[num, shape][key] / max(factor * results[den, shape][key], 1e-9)
            checks.append(check(name, value, op, target))
    return checks


def render(results: dict, checks: list, device: str, dtype: str) -> str:
    """The Markdown report: settings (``dtype``, a torch dtype name), one row per case, then the target checks."""
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    lines = [
        f"{name}, {SHORT_DTYPES[dtype]}, D={HEAD_DIM}, n_iter={N_ITER}, lambd={LAMBD}, torch {torch.__version__}",
        "",
        "| B x H x N | method | time (ms) | tensor peak (MB) | RSS growth (MB) | time / sdpa | mem / sdpa "
        "| time / symmetric | mem / symmetric |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = methods_for(device)
    for (method, shape), r in sorted(results.items(), key=lambda item: (item[0][1], order.index(item[0][0]))):
        base, sym = results[("sdpa", shape)], results.get(("symmetric", shape))
        rss = f"{r['rss_mb']:.1f}" if "rss_mb" in r else "-"
        to_sym = (
            f"{r['time_ms'] / sym['time_ms']:.2f} | {r['mem_mb'] / max(sym['mem_mb'], 1e-9):.2f}" if sym else "- | -"
        )
        lines.append(
            f"| {'x'.join(map(str, shape))} | {method} | {r['time_ms']:.1f} | {r['mem_mb']:.1f} | {rss} "
            f"| {r['time_ms'] / base['time_ms']:.2f} | {r['mem_mb'] / max(base['mem_mb'], 1e-9):.2f} | {to_sym} |"
        )
    lines += render_targets(checks, digits=2)
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        help="dtype of the inputs (default: bfloat16 on CUDA, float32 on CPU)",
    )
    p.add_argument("--quick", action="store_true", help="CPU: N in {256, 1024} only")
    p.add_argument("--check", action="store_true", help="exit 1 if any target fails")
    p.add_argument("--sweep", action="store_true", help="CUDA: also sweep the Triton launch configuration")
    p.add_argument("--output", help="also write the Markdown report to this path")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> int:
    """Run every case in its own process, print the report, and return the exit status."""
    args = parse_args()
    if args.worker:
        return work(args.worker, {"time": run_case, "bandwidth": pap_step_bandwidth})
    dtype = args.dtype or DEFAULT_DTYPES[args.device]
    shapes = CUDA_SHAPES if args.device == "cuda" else CPU_SHAPES[:2] if args.quick else CPU_SHAPES
    results = {}
    for method, shape in cases_for(args.device, shapes):
        case = {"kind": "time", "method": method, "shape": shape, "device": args.device, "dtype": dtype}
        results[method, shape] = spawn_case(__file__, case)
    checks = target_checks(results, args.device)
    bandwidth = None
    if args.device == "cuda":
        bandwidth = spawn_case(__file__, {"kind": "bandwidth", "device": "cuda", "sweep": args.sweep})
    if bandwidth is not None:
        largest = max(bandwidth["rows"], key=lambda r: (r["shape"][2], r["dtype"] == "bfloat16", -r["shape"][3]))
        ratio = largest["pap_step_gbs"] / largest["clone_gbs"]
        shape = "x".join(map(str, largest["shape"]))
        checks.append(check(f"bandwidth: pap_step / clone of its bytes, {shape} {largest['dtype']}", ratio, ">=", 0.7))
    report = render(results, checks, args.device, dtype)
    if bandwidth is not None:
        report += "\n" + render_bandwidth(bandwidth)
    publish(report, args.output)
    return 1 if args.check and not all(passed for *_, passed in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
