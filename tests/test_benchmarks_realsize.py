"""The benchmarks' shared harness, and the real-size modes of benchmarks/vision_cls.py, language_model.py and
segmentation.py: their row selection, targets and options, and each mode run at a tiny size on the CPU."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
TARGET_LINE = re.compile(
    r"^- (?P<name>.+): (?P<value>\d+\.\d+) \(target (?P<op><=|>=) (?P<target>[\d.]+)\) (PASS|FAIL)$"
)


def load(name: str):
    """benchmarks/<name>.py as a module (benchmarks/ is no package; its scripts import harness)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


harness = load("harness")
vision = load("vision_cls")
lm = load("language_model")
Row = vision.Row


def run(script: str, args: list[str], output: Path, triton_interpret: str = "0") -> str:
    """Run benchmarks/<script> with ``args`` on the CPU, check it exits 0 and return its --output report."""
    env = {**os.environ, "TRITON_INTERPRET": triton_interpret}
    cmd = [sys.executable, str(BENCHMARKS / script), *args, "--threads", "1", "--output", str(output)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = output.read_text()
    assert report == proc.stdout  # the printed report is the written one
    return report


def table_row(report: str, *cells: str) -> list[str]:
    """The cells of the one table row that starts with ``cells``."""
    prefix = "| " + " | ".join(cells) + " |"
    rows = [line for line in report.splitlines() if line.startswith(prefix)]
    assert len(rows) == 1, (prefix, report)
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def parse_args(module, monkeypatch, *args: str):
    monkeypatch.setattr(sys, "argv", ["script", *args])
    return module.parse_args()


def test_rows_default_to_the_gpu_proofs_selection_and_options_select_others():
    rpc = [(a, b) for a in ("rpc4b0", "rpc2all") for b in ("triton", "torch")]
    eager = [
        Row(arch, attention, backend, "eager")
        for arch in ("deit_tiny", "deit_small")
        for attention, backend in [("softmax", None), ("symvit", None), *rpc]
    ]
    compiled = [Row("deit_tiny", "symvit", None, "compiled")]
    compiled += [Row("deit_tiny", "rpc2all", backend, "compiled") for backend in ("triton", "torch")]
    assert vision.select_rows() == eager + compiled
    rows = vision.select_rows(arches=["deit_small"], compiled_arches=["deit_small"], compiled_rows=["symvit"])
    assert [(r.arch, r.name, r.mode) for r in rows if r.mode == "compiled"] == [("deit_small", "symvit", "compiled")]
    rows = vision.select_rows(attentions=["symvit", "rpc2all"], backends=["torch"], modes=["eager"])
    assert [r.name for r in rows] == ["symvit", "rpc2all-torch"] * 2


def test_rows_run_each_in_its_own_process_and_the_report_grows_row_by_row(tmp_path: Path):
    """A worker that fails is one failed row, a skipped row never runs, and the report is rewritten after each."""
    script = tmp_path / "bench.py"
    script.write_text(
        "import json, sys\ncase = json.loads(sys.argv[2])\n"
        "if case['fail']: sys.exit('worker: out of memory')\n"
        "print('noise'); print(json.dumps({'time_ms': 2.0, 'first_step_s': 0.5}))\n"
    )
    cases = {("a",): {"fail": False}, ("b",): {"fail": True}, ("c",): {"skipped": "needs CUDA"}}
    reports = []

    def render(results: dict) -> str:
        reports.append(dict(results))
        return f"{len(results)} rows"

    results = harness.run_rows(str(script), cases, render, str(tmp_path / "out" / "report.md"))
    assert results == {
        ("a",): {"time_ms": 2.0, "first_step_s": 0.5},
        ("b",): {"error": "worker: out of memory"},
        ("c",): {"skipped": "needs CUDA"},
    }
    assert [len(r) for r in reports] == [1, 2, 3] and (tmp_path / "out" / "report.md").read_text() == "3 rows"


def test_vision_options(monkeypatch):
    args = parse_args(vision, monkeypatch, "--device", "cuda")
    assert args.real_size and (args.batch, args.img_size, args.steps, args.warmup) == (256, 224, 15, 4)
    assert args.arches == ["deit_tiny", "deit_small"] and args.compiled_rows == list(vision.DEFAULT_COMPILED_ROWS)
    args = parse_args(vision, monkeypatch, "--quick")  # parts 1 and 2, as before
    assert not args.real_size and (args.batch, args.img_size, args.rounds) == (4, 128, 1)
    args = parse_args(vision, monkeypatch, "--real-size", "--image-size", "32", "--compiled-rows", "rpc2all-triton")
    assert args.device == "cpu" and args.img_size == 32 and args.compiled_rows == ["rpc2all-triton"]
    for bad in (["--device", "cuda", "--no-real-size"], ["--real-size", "--compiled-rows", "rpc3"]):
        with pytest.raises(SystemExit):
            parse_args(vision, monkeypatch, *bad)


def test_targets_of_the_h200_reference_numbers():
    """The H200 numbers measured once (eager, DeiT-tiny) give these target lines."""
    times = {("symvit", None): 32.03, ("rpc4b0", "triton"): 33.03, ("rpc4b0", "torch"): 36.93}
    times |= {("rpc2all", "triton"): 63.02, ("rpc2all", "torch"): 57.79}
    results = {Row("deit_tiny", a, b, "eager"): {"time_ms": t} for (a, b), t in times.items()}
    lines = harness.render_targets(vision.table_targets(results))
    assert lines[:3] == ["", "Targets:", ""]
    parsed = [TARGET_LINE.match(line) for line in lines[3:]]
    assert all(parsed), lines
    assert [(m["name"], m["value"], m.group(5)) for m in parsed] == [
        ("deit_tiny RPC 2-all (Triton) / SymViT, eager", "1.968", "FAIL"),
        ("deit_tiny RPC-SymViT, 4 iterations in block 0, eager: Triton / torch", "0.894", "PASS"),
        ("deit_tiny RPC, 2 iterations in all blocks, eager: Triton / torch", "1.091", "FAIL"),
    ]


def test_lm_options_read_the_published_configs(monkeypatch):
    args = parse_args(lm, monkeypatch, "--device", "cuda")
    assert args.paper_size and (args.batch, args.context, args.vocab, args.steps) == (96, 256, 267735, 10)
    assert args.modes == ["eager", "compiled"]
    args = parse_args(lm, monkeypatch, "--quick")  # parts 1 and 2, as before
    assert not args.paper_size and (args.batch, args.depth, args.steps) == (4, 4, 2)
    config = lm.read_paper_config("rpc")
    assert config["init_args"]["attention"] == {"kind": "rpc", "n_iter": 2, "lambd": 4.0, "layers": "all"}
    assert config["init_args"]["output"] == "adaptive" and config["grad_clip"] == 0.25
    assert lm.scaled_cutoffs([20000, 40000, 200000], 267735) == [20000, 40000, 200000]
    assert lm.scaled_cutoffs([20000, 40000, 200000], 2000) == [149, 299, 1494]


@pytest.mark.slow
def test_vision_real_size_on_cpu(tmp_path: Path):
    args = ["--real-size", "--arches", "deit_tiny", "--attentions", "symvit,rpc2all", "--modes", "eager"]
    args += ["--batch", "2", "--img-size", "32", "--depth", "2", "--steps", "2", "--warmup", "1", "--profile"]
    report = run("vision_cls.py", args, tmp_path / "vision.md")
    assert report.startswith("device=cpu (CPU) dtype=fp32, AdamW torch=")
    symvit = table_row(report, "deit_tiny", "eager", "SymViT (symmetric)", "-")
    assert symvit[6:8] == ["1.000", "n/a"] and float(symvit[5]) > 0
    rpc = table_row(report, "deit_tiny", "eager", "RPC, 2 iterations in all blocks", "torch")
    assert float(rpc[4].replace(",", "")) > 0 and float(rpc[6]) > 0
    triton = table_row(report, "deit_tiny", "eager", "RPC, 2 iterations in all blocks", "triton")
    assert triton[4].startswith("skipped: the Triton backend needs CUDA")
    assert "Targets:" not in report  # no Triton row ran, so no target applies
    profile = report.split("## Profile: one training step of deit_tiny, RPC, 2 iterations in all blocks, torch")[1]
    assert "CPU time of the step:" in profile and "device time: n/a" in profile
    ops = profile.split("| op | calls | self CPU time (ms) | share |\n|---|---:|---:|---:|\n")[1].splitlines()
    assert len(ops) == vision.PROFILE_TOP and all(
        re.match(r"\| `.+` \| \d+ \| [\d.]+ \| [\d.]+% \|$", op) for op in ops
    )


@pytest.mark.slow
def test_vision_triton_rows_under_the_interpreter(tmp_path: Path):
    args = ["--real-size", "--arches", "deit_tiny", "--attentions", "symvit,rpc2all", "--modes", "eager"]
    args += ["--batch", "2", "--img-size", "32", "--depth", "1", "--steps", "1", "--warmup", "1"]
    report = run("vision_cls.py", args, tmp_path / "vision.md", triton_interpret="1")
    assert float(table_row(report, "deit_tiny", "eager", "RPC, 2 iterations in all blocks", "triton")[5]) > 0
    lines = [line for line in report.splitlines() if line.startswith("- ")]
    names = [TARGET_LINE.match(line)["name"] for line in lines]
    assert names == [
        "deit_tiny RPC 2-all (Triton) / SymViT, eager",
        "deit_tiny RPC, 2 iterations in all blocks, eager: Triton / torch",
    ]


@pytest.mark.slow
def test_vision_compiled_rows_on_cpu(tmp_path: Path):
    args = ["--real-size", "--arches", "deit_tiny", "--attentions", "symvit,rpc2all", "--backends", "torch"]
    args += ["--modes", "compiled", "--batch", "2", "--img-size", "32", "--depth", "1", "--steps", "1", "--warmup", "1"]
    report = run("vision_cls.py", args, tmp_path / "vision.md")
    assert table_row(report, "deit_tiny", "compiled", "SymViT (symmetric)", "-")[6] == "1.000"
    assert float(table_row(report, "deit_tiny", "compiled", "RPC, 2 iterations in all blocks", "torch")[6]) > 0


@pytest.mark.slow
def test_language_model_paper_size_on_cpu(tmp_path: Path):
    args = ["--paper-size", "--vocab", "2000", "--context", "32", "--depth", "2", "--batch", "2"]
    args += ["--steps", "2", "--warmup", "1", "--modes", "eager"]
    report = run("language_model.py", args, tmp_path / "lm.md")
    assert report.startswith("device=cpu (CPU) dtype=fp32 torch=")
    assert "2 post-LN layers, width 128, 8 heads, FFN 2048, adaptive softmax over 2,000 words, context 32" in report
    assert table_row(report, "eager", "symmetric")[4:6] == ["1.000", "n/a"]
    assert float(table_row(report, "eager", "RPC, 2 iterations in all layers")[4]) > 0
    assert all(TARGET_LINE.match(line) for line in report.splitlines() if line.startswith("- "))


@pytest.mark.slow
def test_segmentation_on_cpu(tmp_path: Path):
    args = ["--image-size", "64", "--batch", "2", "--depth", "2", "--steps", "2", "--warmup", "1", "--modes", "eager"]
    report = run("segmentation.py", args, tmp_path / "seg.md")
    assert report.startswith("device=cpu (CPU) dtype=fp32 torch=")
    assert "batch 2 (the paper's global batch: 8), 64 x 64 px" in report
    assert table_row(report, "eager", "Segmenter-tiny, symmetric")[4:6] == ["1.000", "n/a"]
    rpc = table_row(report, "eager", "RPC-Segmenter-tiny, 6 iterations in encoder and decoder block 0")
    assert float(rpc[2]) > 0 and float(rpc[4]) > 0
