"""benchmarks/attention.py with the robust family (issue 37): which cases run where, each kind's step, the report."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    """benchmarks/attention.py as a module (benchmarks/ is no package; its scripts import harness)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("bench_attention_family", BENCHMARKS / "attention.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_family_runs_at_every_cpu_shape_and_at_deit_tiny_on_cuda(bench):
    cpu = bench.cases_for("cpu", bench.CPU_SHAPES)
    assert {m for m, _ in cpu} == {"sdpa", "rpc", "reference", "symmetric", "twicing", "neutreno", "elliptical"}
    assert len(cpu) == 7 * len(bench.CPU_SHAPES)
    cuda = bench.cases_for("cuda", bench.CUDA_SHAPES)  # what `make test-gpu`'s attention step runs
    assert {shape for m, shape in cuda if m in bench.FAMILY} == {(256, 3, 197)}
    assert [m for m, shape in cuda if shape == (256, 3, 197)] == list(bench.methods_for("cuda"))


@pytest.mark.parametrize("method", ["sdpa", "symmetric", "twicing", "neutreno", "elliptical"])
def test_each_kind_steps_forward_and_backward(bench, method):
    step = bench.make_step({"method": method, "shape": (1, 2, 8), "device": "cpu", "dtype": "float32"})
    step()
    step()  # the gradients are dropped between passes


def test_the_report_puts_ratios_to_softmax_and_symmetric_side_by_side(bench):
    shape = (1, 4, 256)
    times = {"sdpa": 2.0, "symmetric": 1.0, "twicing": 4.0, "neutreno": 2.5, "elliptical": 3.0}
    results = {(m, shape): {"time_ms": t, "mem_mb": t, "rss_mb": 1.0} for m, t in times.items()}
    report = bench.render(results, [], "cpu", "float32")
    assert "| time / sdpa | mem / sdpa | time / symmetric | mem / symmetric |" in report
    assert "| 1x4x256 | twicing | 4.0 | 4.0 | 1.0 | 2.00 | 2.00 | 4.00 | 4.00 |" in report
