"""The plan report (``kpca-experiment report``) from hand-made run folders: the folders, markers and CSVs that the
steps of a plan leave (fit checkpoints, test reports, analyze tables, predict samples), no training.

:func:`run_plan_copy` runs a repository plan end to end on a tiny budget (the apps' demo tests use it).
"""

import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
import yaml

from kpca.training.analysis import LayerAnalysis, write_analysis
from kpca.training.experiment.plan import Plan, PlanError, load_plan, step_folder
from kpca.training.experiment.report import HeadlineValues, headline_values, verdict, write_plan_report
from tests.cli_support import CONFIGS, run_to_the_end

PLANS = CONFIGS / "experiments"
LABELS = {"sym": "SymViT", "rpc": "RPC-SymViT"}
CLEAN = {("sym", 0): 0.90, ("sym", 1): 0.92, ("rpc", 0): 0.80, ("rpc", 1): 0.84}
"""clean/acc1 of each run and seed: SymViT 0.91 ± 0.0141, RPC-SymViT 0.82 ± 0.0283."""


def run_plan_copy(plan_file: Path, out: Path, overrides: Sequence[str]) -> str:
    """Run a copy of ``plan_file`` writing into ``out`` with seed 0 only, through ``kpca-experiment run``.

    The copy (``out``'s parent / the plan's file name) changes only ``out`` and ``seeds``; it runs from the
    repository root, which its config paths are relative to, with ``overrides`` as ``--override`` options (a tiny
    budget). Fails with the runner's stderr if a step fails; returns ``report.md``'s text.
    """
    plan = yaml.safe_load(plan_file.read_text(encoding="utf-8")) | {"out": str(out), "seeds": [0]}
    copy = out.parent / plan_file.name
    copy.write_text(yaml.safe_dump(plan, sort_keys=False), encoding="utf-8")
    runner = Path(sys.executable).with_name("kpca-experiment")  # the console script of this environment
    run_to_the_end([str(runner), "run", str(copy), *(f"--override={option}" for option in overrides)], CONFIGS.parent)
    return (out / "report.md").read_text(encoding="utf-8")


def write_plan(tmp_path: Path, *, seeds=(0, 1), steps=("fit", "test", "analyze"), report: dict | None = None) -> Plan:
    report = report or {
        "task": "vision_cls",
        "title": "Hand-made comparison",
        "headlines": {"clean accuracy": ["clean/acc1"], "attacked accuracy": ["attack/.*/acc1"]},
        "kernel_pca": True,
    }
    plan = {
        "name": "hand-made",
        "app": "vision_cls",
        "out": str(tmp_path / "out"),
        "seeds": list(seeds),
        "runs": [{"name": name, "label": label} for name, label in LABELS.items()],
        "steps": [{"name": name, **({"overrides": ["--samples=4"]} if name == "analyze" else {})} for name in steps],
        "report": report,
    }
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return load_plan(path)


def model_config(kind: str, seed: int, ckpt_path: str | None = None) -> dict:
    """A saved LightningCLI config: runs differ in the attention kind (the model) and the seed."""
    attention = {"kind": kind, "n_iter": 4, "lambd": 4.0, "layers": "all"}
    return {"seed_everything": seed, "ckpt_path": ckpt_path, "model": {"net": {"init_args": {"attention": attention}}}}


def finish_fit(plan: Plan, run, kind: str) -> Path:
    """A fit step's folder with its config and best checkpoint; the ``fit.done`` marker."""
    folder = step_folder(plan, run, "fit")
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(model_config(kind, run.seed)))
    best = folder / "checkpoints" / "best.ckpt"
    best.write_bytes(b"")
    (run.folder / "fit.done").write_text(json.dumps({"best_model_path": str(best)}))
    return best


def finish_test(plan: Plan, run, kind: str, best: Path, clean: float) -> None:
    """A test step's folder: config naming the checkpoint, ``robustness.csv`` / ``.md``; ``test.done``."""
    folder = step_folder(plan, run, "test")
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(model_config(kind, run.seed, str(best))))
    rows = [
        {"metric": "clean/acc1", "value": clean, "n": 8},
        {"metric": "attack/fgsm-pixel/eps1/acc1", "value": clean - 0.2, "n": 8},
        {"metric": "attack/pgd-pixel/eps1/acc1", "value": clean - 0.4, "n": 8},
    ]
    with (folder / "robustness.csv").open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=["metric", "value", "n"])
        writer.writeheader()
        writer.writerows(rows)
    (folder / "robustness.md").write_text(f"| metric | value |\n| clean/acc1 | {clean} |\n\n## Protocol\n")
    (run.folder / "test.done").write_text("{}")


def layer(name: str, loss: float) -> LayerAnalysis:
    heads = torch.ones(2, dtype=torch.float64)
    return LayerAnalysis(
        layer=name, symmetric=True, projection_loss=loss * heads, gamma_spread=0.1 * heads,
        gamma_spread_std=0.01 * heads, eigen_residual=0.2 * heads, gamma_scale=heads, value_alignment=0.5 * heads,
        eigenvalues=torch.ones(2, 3, dtype=torch.float64),
    )  # fmt: skip


def finish_analyze(plan: Plan, run, loss: float) -> None:
    """An analyze step's folder as ``analyze --out_dir`` leaves it (the net's class as model); ``analyze.done``."""
    write_analysis(
        {"ViTClassifier": [layer("vit.blocks.0", loss), layer("vit.blocks.1", loss)]}, step_folder(plan, run, "analyze")
    )
    (run.folder / "analyze.done").write_text("{}")


def finish_plan(plan: Plan) -> None:
    for run in plan.runs:
        kind = "symmetric" if run.name == "sym" else "rpc"
        best = finish_fit(plan, run, kind)
        finish_test(plan, run, kind, best, CLEAN[run.name, run.seed])
        finish_analyze(plan, run, loss=1.0 + run.seed if run.name == "sym" else 0.5 + run.seed)


def test_a_finished_plan_reports_the_comparison_headlines_and_merged_kernel_pca(tmp_path: Path):
    plan = write_plan(tmp_path)
    finish_plan(plan)
    path = write_plan_report(plan)
    assert path == plan.out / "report.md"
    text = path.read_text()
    assert text.startswith("# Hand-made comparison\n") and "## Status" not in text
    assert "![comparison](comparison.png)" in text and (plan.out / "comparison.png").is_file()
    table = text.split("What the data shows")[0]  # kpca-report's table: the plan's labels, in the plan's order
    assert "| SymViT | 0 1 | 0.9100 ± 0.0141 | 0.7100 ± 0.0141 | 0.5100 ± 0.0141 |" in table
    assert "| RPC-SymViT | 0 1 | 0.8200 ± 0.0283 |" in table
    assert table.index("| SymViT |") < table.index("| RPC-SymViT |") and "n_iter=4" not in table
    assert "What the data shows (mean ± std over 2 seeds):" in text
    assert "- clean accuracy: SymViT 0.9100 ± 0.0141, RPC-SymViT 0.8200 ± 0.0283 (SymViT higher by 0.0900)" in text
    assert "- attacked accuracy: SymViT 0.6100 ± 0.0141, RPC-SymViT 0.5200 ± 0.0283 (SymViT higher by 0.0900)" in text
    own = text.split("## Each run's own evaluation\n")[1].split("## Kernel-PCA")[0]
    first_seed = "### SymViT, seed 0 ([sym/seed0/test/robustness.md](sym/seed0/test/robustness.md))\n\n"
    assert f"{first_seed}| metric | value |\n| clean/acc1 | 0.9 |\n\n#### Protocol\n" in own  # headings demoted
    assert "### RPC-SymViT, seed 0 (" in own and "seed 1 (" not in own
    assert "- SymViT, seed 1: [sym/seed1/test/robustness.md](sym/seed1/test/robustness.md)" in own
    section = text.split("## Kernel-PCA diagnostics\n")[1]
    assert "The analyze step (`--samples=4`) on the best checkpoint of seed 0 of each run." in section
    merged = [line.split("|")[1:4] for line in section.splitlines() if "vit.blocks" in line]
    assert [[cell.strip() for cell in row] for row in merged] == [
        ["SymViT", "vit.blocks.0", "2"], ["SymViT", "vit.blocks.1", "2"],
        ["RPC-SymViT", "vit.blocks.0", "2"], ["RPC-SymViT", "vit.blocks.1", "2"],
    ]  # fmt: skip
    with open(plan.out / "kernel_pca.csv") as stream:  # seed 0's tables: J_proj 1.0 (SymViT) and 0.5 (RPC)
        losses = {row["model"]: float(row["projection_loss"]) for row in csv.DictReader(stream)}
    assert losses == {"SymViT": 1.0, "RPC-SymViT": 0.5}
    assert (plan.out / "kernel_pca.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "[SymViT](sym/seed0/analyze/kernel_pca.png)" in section


def test_an_unfinished_plan_reports_its_status_and_the_finished_runs(tmp_path: Path):
    plan = write_plan(tmp_path)
    for run in plan.runs[:2]:  # SymViT's two seeds are done; RPC-SymViT has not started
        best = finish_fit(plan, run, "symmetric")
        finish_test(plan, run, "symmetric", best, CLEAN[run.name, run.seed])
        finish_analyze(plan, run, loss=1.0)
    text = write_plan_report(plan).read_text()
    status = text.split("## Status: 6 of 12 steps not done\n")[1].split("## Results")[0]
    assert "| rpc/seed0 | fit | not started |" in status and "| sym/seed1 | analyze | done |" in status
    assert "- clean accuracy: SymViT 0.9100 ± 0.0141\n" in text  # no verdict with one run
    assert "Not analysed yet: rpc/seed0." in text and "| SymViT | vit.blocks.0 |" in text


def test_a_plan_nothing_has_run_for_reports_its_status_only(tmp_path: Path):
    plan = write_plan(tmp_path)
    text = write_plan_report(plan).read_text()
    assert "## Status: 12 of 12 steps not done" in text
    assert "No run has a checkpoint or an evaluation report yet." in text
    assert "- clean accuracy: no finished run has a metric matching clean/acc1" in text
    assert "Not analysed yet: sym/seed0, rpc/seed0." in text


def test_samples_of_a_predict_step_are_shown_per_run(tmp_path: Path):
    plan = write_plan(tmp_path, seeds=(3,), steps=("fit", "test", "predict"), report={"task": "vision_cls"})
    for run in plan.runs:
        folder = step_folder(plan, run, "predict")
        folder.mkdir(parents=True)
        rows = [{"prompt": "The", "text": f"The {run.name}\nend"}, {"prompt": "A", "text": "A b"}]
        (folder / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = write_plan_report(plan).read_text()
    assert text.startswith("# plan\n")  # the title defaults to the plan file's stem
    assert "## Samples (predict step, seed 3)\n\nSymViT:\n\n    The sym\n    end\n    A b\n" in text
    assert "RPC-SymViT:\n\n    The rpc\n    end\n" in text


def test_headlines_with_several_runs_name_the_highest_and_its_margin_over_the_next():
    results = [HeadlineValues("a", (0.5,)), HeadlineValues("b", (0.7, 0.9)), HeadlineValues("c", (0.6,))]
    assert verdict(results) == " (b highest, by 0.2000 over c)"
    assert verdict(results[:1]) == ""
    assert verdict([HeadlineValues("a", (0.5,)), HeadlineValues("b", (0.5,))]) == " (neither higher)"
    assert results[1].describe() == "b 0.8000 ± 0.1414"


def test_headline_values_average_the_matching_metrics_of_each_seed(tmp_path: Path):
    plan = write_plan(tmp_path)
    sym0, sym1, rpc0, _ = plan.runs
    metrics = {
        sym0: {"attack/fgsm/eps1/acc1": 0.2, "attack/pgd/eps1/acc1": 0.4, "clean/acc1": 0.9},
        sym1: {"attack/fgsm/eps1/acc1": 0.4, "attack/pgd/eps1/acc1": 0.6},
        rpc0: {"clean/acc1": 0.8},  # nothing matches: RPC-SymViT is left out
    }
    (values,) = headline_values(["attack/.*/acc1"], plan, metrics)
    assert values.label == "SymViT" and values.values == pytest.approx((0.3, 0.5))
    assert headline_values(["acc1"], plan, metrics) == []  # a full match, not a search


def test_a_plan_without_a_report_section_is_refused_with_the_fix(tmp_path: Path):
    plan = write_plan(tmp_path)
    plan = Plan(plan.path, plan.name, plan.app, plan.out, plan.runs, plan.steps, report=None)
    with pytest.raises(PlanError, match=r"report: the plan has no report section.*add one"):
        write_plan_report(plan)


def test_a_report_task_no_app_registers_is_refused_naming_the_plan_key(tmp_path: Path):
    plan = write_plan(tmp_path, report={"task": "no_such_task"})
    with pytest.raises(PlanError, match=r"plan.yaml: report.task: --task must be one of the installed report tasks"):
        write_plan_report(plan)
