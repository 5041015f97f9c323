"""Host overhead of one attention call, forward + backward, with the Triton launches stubbed out.

The Triton path is launch-bound at ViT sizes: what it costs beyond the kernels is host time, Python and
the dispatcher, per call. This measures that time on any machine, GPU or not: every jit kernel of the
Triton backend is replaced by a stub that records its launch and returns
(``kpca.attention.triton_tuning.stubbed_kernels``), so the Triton backend runs on CPU tensors with nothing
computed (its outputs are garbage, only the time and the launch count matter). The inputs are tiny
(B, H, N, D) = (1, 3, 16, 64) CPU tensors on one thread, so that SDPA and the torch path's element-wise ops
cost little more than their dispatch; on a GPU each launch adds Triton's own launcher (argument binding, a cache
lookup), which the stub leaves out.

Methods, each ``out = f(k, v)`` then ``torch.autograd.grad(out, inputs, grad)``:

* ``sdpa``: one ``F.scaled_dot_product_attention(q, k, v)`` call (q, k, v leaves);
* ``rpc torch``: ``rpc_attention(k, v, n_iter, backend="torch")``: n_iter SDPA calls and the torch path;
* ``rpc triton``: the same with ``backend="triton"`` and the launches stubbed.

Run from the repository root::

    python benchmarks/dispatch.py                 # n_iter = 2
    python benchmarks/dispatch.py --n-iter 4 --output host.md

Times are the minimum, over repeats, of the mean over a batch of back-to-back calls (the least disturbed).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from harness import publish

from kpca.attention import rpc_attention
from kpca.attention.triton_tuning import stubbed_kernels

SHAPE = (1, 3, 16, 64)  # (B, H, N, D)
LAMBD = 4.0
CALLS = 50  # back-to-back calls per timed batch
REPEATS = 40  # batches; the minimum of their means is reported


def forward_backward(method: str, n_iter: int) -> tuple[Callable[[], object], Callable[[], object]]:
    """(forward, forward + backward) closures of one method on fresh leaf inputs of SHAPE."""
    leaves = [torch.randn(SHAPE, requires_grad=True) for _ in range(3 if method == "sdpa" else 2)]
    grad = torch.randn(SHAPE)
    attend = {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "rpc torch": lambda k, v: rpc_attention(k, v, n_iter=n_iter, lambd=LAMBD, backend="torch"),
        "rpc triton": lambda k, v: rpc_attention(k, v, n_iter=n_iter, lambd=LAMBD, backend="triton"),
    }[method]

    def forward() -> object:
        return attend(*leaves)

    def step() -> object:
        return torch.autograd.grad(attend(*leaves), leaves, grad)

    return forward, step


def host_us(fn: Callable[[], object], calls: int = CALLS, repeats: int = REPEATS) -> float:
    """Microseconds per ``fn()``: the minimum over ``repeats`` of the mean over ``calls`` back-to-back calls."""
    for _ in range(calls):  # warm-up
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def measure(n_iter: int) -> list[dict]:
    """One row per method: host µs forward and forward + backward, and the Triton launches of each direction."""
    rows = []
    with stubbed_kernels() as launches:
        for method in ("sdpa", "rpc torch", "rpc triton"):
            forward, step = forward_backward(method, n_iter)
            launches.clear()
            out = forward()
            launches_forward = sum(launches.values())
            del out
            launches.clear()
            step()
            launches_backward = sum(launches.values()) - launches_forward
            rows.append(
                {
                    "method": method,
                    "forward_us": host_us(forward),
                    "step_us": host_us(step),
                    "launches": (launches_forward, launches_backward),
                }
            )
    return rows


def render(rows: list[dict], n_iter: int) -> str:
    """The Markdown table of :func:`measure`, with each time over the SDPA call's."""
    sdpa = next(r for r in rows if r["method"] == "sdpa")
    lines = [
        f"Host time per call, Triton launches stubbed: (B, H, N, D) = {SHAPE} on CPU, {torch.get_num_threads()} "
        f"thread(s), n_iter={n_iter}, torch {torch.__version__}",
        "",
        "| method | forward (µs) | forward + backward (µs) | / sdpa | Triton launches forward / backward |",
        "|---|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r['method']} | {r['forward_us']:.0f} | {r['step_us']:.0f} | {r['step_us'] / sdpa['step_us']:.2f} "
        f"| {r['launches'][0]} / {r['launches'][1]} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-iter", type=int, default=2, help="PAP iterations of rpc_attention (default 2)")
    p.add_argument("--output", help="also write the Markdown table to this path")
    return p.parse_args()


def main() -> int:
    """Measure on one thread, print the table and write it where asked."""
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    publish(render(measure(args.n_iter), args.n_iter), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
