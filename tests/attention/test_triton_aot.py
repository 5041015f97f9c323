"""The kernels compiled ahead of time for sm_90 (H100 / H200), without a GPU: registers and spills per specialisation.

The ops run as they do on CUDA, on CPU tensors of real shapes, while Triton's active driver
reports an sm_90 target and every launch only compiles (``warmup``): so Triton's own binder picks
each specialisation (dtypes, the constexpr head dim and tiles, which integers are 16-divisible or 1)
exactly as its JIT would for CUDA tensors of those shapes and strides. ``ptxas -v`` then reports
registers and spill bytes per thread. The compilation runs in a subprocess without
``TRITON_INTERPRET`` (this process interprets the kernels); ``pytest -s`` prints the table.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from .helpers import require_triton

require_triton()
import triton  # noqa: E402 (after the triton check)
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402

from kpca.attention import _backend, rpc_attention  # noqa: E402
from kpca.attention._triton import kernels  # noqa: E402

pytestmark = pytest.mark.triton

# ((B, H, N), D, dtype, causal): a ViT at N = 197 at every head dim; a causal LM at N = 1024, D = 64.
SPECIALISATIONS = [((8, 12, 197), d, dtype, False) for d in (64, 72, 40, 128) for dtype in ("bfloat16", "float32")]
SPECIALISATIONS += [((1, 16, 1024), 64, "bfloat16", True)]
NO_SPILL_HEAD_DIMS = (40, 64, 72)
REPO_ROOT = Path(__file__).resolve().parents[2]


def compile_for_sm90() -> list[dict]:
    """Compile every kernel that ``rpc_attention`` forward and backward launches at each of SPECIALISATIONS.

    One row per distinct compiled kernel. Run it in a process without ``TRITON_INTERPRET``: it
    replaces Triton's active driver and lets the Triton backend take CPU tensors, for good.
    """

    class SM90Driver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    compiled = {}
    for name in kernels.__all__:
        kernel = getattr(kernels, name)
        kernel.run = _compile_only(name, kernel.run, compiled)
    driver.set_active(SM90Driver())
    _backend.TRITON_DEVICE_TYPES = ("cuda", "cpu")
    rows = []
    for (b, h, n), d, dtype_name, causal in SPECIALISATIONS:
        compiled.clear()
        k, v = (torch.randn(b, n, h, d).to(getattr(torch, dtype_name)).transpose(1, 2) for _ in range(2))
        k.requires_grad_()
        out = rpc_attention(k, v, n_iter=3, lambd=4.0, is_causal=causal, backend="triton")  # kernels: compiled only
        out.float().sum().backward()
        for variant, kernel in compiled.values():
            registers, spill_bytes = _ptxas_usage(kernel.asm["ptx"])
            rows.append(
                {"kernel": variant, "shape": f"{b}x{h}x{n}x{d}", "d": d, "dtype": dtype_name,
                 "num_warps": kernel.metadata.num_warps, "registers": registers, "spill_bytes": spill_bytes}
            )  # fmt: skip
    return rows


def _compile_only(name, run, compiled):
    """A kernel's ``run`` that compiles (``warmup=True``) instead of launching; records each distinct kernel once.

    ``compiled`` maps the kernel's id to (its name and the flags set, the kernel).
    """

    def compile_instead(*args, grid, warmup, **kwargs):
        kernel = run(*args, grid=grid, warmup=True, **kwargs)
        flags = [flag for flag, value in kwargs.items() if value is True]
        compiled.setdefault(id(kernel), (" ".join([name, *flags]), kernel))
        return kernel

    return compile_instead


def _ptxas_usage(ptx: str) -> tuple[int, int]:
    """(registers per thread, spill bytes stored + loaded) that ``ptxas -v`` reports for sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "kernel.ptx")
        source.write_text(ptx)
        command = [triton.knobs.nvidia.ptxas.path, "-v", "--gpu-name=sm_90a", str(source), "-o", str(source) + ".o"]
        log = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    return registers, sum(int(b) for b in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| kernel and flags set | B x H x N x D | dtype | num_warps | registers | spill bytes |",
        "|---|---|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['kernel']} | {r['shape']} | {r['dtype']} | {r['num_warps']} | {r['registers']} | {r['spill_bytes']} |"
        for r in rows
    ]
    return "\n".join(lines)


@pytest.mark.slow
def test_real_specialisations_compile_for_sm90_without_spills(tmp_path):
    try:
        assert Path(triton.knobs.nvidia.ptxas.path).exists()
    except RuntimeError as err:  # triton's own lookup failed
        pytest.skip(f"needs ptxas, which ships with triton's NVIDIA backend: {err}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    code = "import json, tests.attention.test_triton_aot as aot; print(json.dumps(aot.compile_for_sm90()))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(done.stdout.splitlines()[-1])
    print(markdown(rows))
    assert {r["kernel"].split()[0] for r in rows} == set(kernels.__all__)
    spills = [r for r in rows if r["d"] in NO_SPILL_HEAD_DIMS and r["spill_bytes"]]
    assert not spills, f"register spills:\n{markdown(spills)}"
