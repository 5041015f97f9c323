"""The main job (``make demo``): SymViT vs RPC-SymViT on the built-in digits, clean, corrupted and attacked.

Both models train through the real ``vision-cls`` CLI from ``configs/vision_cls/demo_digits.yaml``,
are tested from their best checkpoint (clean accuracy, 6 corruptions x 5 severities, FGSM and PGD
at 5 radii), compared side by side by ``kpca-report`` (:mod:`kpca.training.compare`) and analysed
as kernel PCA (:mod:`kpca.training.analysis`, on 32 validation digits); ``report.md`` holds the
comparison, the headlines and the kernel-PCA section, with ``report.png`` and ``kernel_pca.png``.

    python -m kpca.vision_cls.demo --out runs/demo
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (the backend must be chosen first)

from kpca.training.analysis import LayerAnalysis, analysis_markdown, analyze_network, write_analysis  # noqa: E402
from kpca.training.compare import compare  # noqa: E402
from kpca.training.files import write_atomic  # noqa: E402
from kpca.training.trainer import first_inputs  # noqa: E402
from kpca.vision_cls.cli import main  # noqa: E402
from kpca.vision_cls.evaluation import ROBUSTNESS_REPORT  # noqa: E402

logger = logging.getLogger("kpca.vision_cls.demo")

KINDS = ("symmetric", "rpc")
LABELS = {"symmetric": "SymViT", "rpc": "RPC-SymViT (4 PAP iterations, block 0)"}
COLORS = {"symmetric": "tab:blue", "rpc": "tab:orange"}
LAYERS = {"symmetric": "all", "rpc": "[0]"}  # SymViT: every block; RPC-SymViT: PAP in block 0, symmetric elsewhere
ANALYSED_DIGITS = 32


@dataclass
class DemoRun:
    """One model's fit folder, test folder, test results and kernel-PCA analysis."""

    fit_dir: Path
    test_dir: Path
    results: dict[str, float]
    analysis: list[LayerAnalysis]


def train_and_test(kind: str, configs: Path, out: Path, extra: list[str]) -> DemoRun:
    """Fit one model, test its best checkpoint and analyse it as kernel PCA on the first validation digits."""
    common = [
        "-c", str(configs / "trainer" / "cpu.yaml"),
        "-c", str(configs / "vision_cls" / "demo_digits.yaml"),
        f"--trainer.logger.init_args.save_dir={out}",
        f"--trainer.logger.init_args.name={kind}",
        f"--model.net.init_args.attention.kind={kind}",
        f"--model.net.init_args.attention.layers={LAYERS[kind]}",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]  # fmt: skip
    fit = main(["fit", *common])
    best = fit.trainer.checkpoint_callback.best_model_path
    logger.info("%s: best checkpoint %s (val/acc1 %.4f)", kind, best, fit.trainer.checkpoint_callback.best_model_score)
    test = main(["test", *common, f"--ckpt_path={best}"])
    digits = first_inputs(test.datamodule, "val", ANALYSED_DIGITS)
    analysis = analyze_network(test.model.net, digits)  # the tested (best) weights
    test_dir = Path(test.trainer.log_dir)
    return DemoRun(Path(fit.trainer.log_dir), test_dir, read_results(test_dir), analysis)


def read_results(log_dir: Path) -> dict[str, float]:
    """The ``metric -> value`` rows of a test run's robustness report."""
    return ROBUSTNESS_REPORT.read(log_dir / f"{ROBUSTNESS_REPORT.stem}.csv")


def severity_curve(results: dict[str, float]) -> list[float]:
    """Accuracy at severity 0 (clean) to 5, averaged over the corruptions."""
    curve = [results["clean/acc1"]]
    for severity in range(1, 6):
        values = [v for k, v in results.items() if k.startswith("corrupted/") and k.endswith(f"/s{severity}/acc1")]
        curve.append(sum(values) / len(values))
    return curve


def attack_curve(results: dict[str, float], attack: str) -> tuple[list[float], list[float]]:
    """(eps in 1/255, accuracy) for one attack, starting from the clean accuracy at eps 0."""
    points = sorted(
        (float(k.split("/")[2].removeprefix("eps")), v) for k, v in results.items() if k.startswith(f"attack/{attack}/")
    )
    return [0.0] + [p[0] for p in points], [results["clean/acc1"]] + [p[1] for p in points]


def plot(all_results: dict[str, dict[str, float]], path: Path) -> None:
    """Accuracy against corruption severity and against attack radius, both models."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for kind, results in all_results.items():
        left.plot(range(6), severity_curve(results), marker="o", color=COLORS[kind], label=LABELS[kind])
        for attack, style in (("fgsm-pixel", "--"), ("pgd-pixel", "-")):
            eps, acc = attack_curve(results, attack)
            label = f"{LABELS[kind]}, {attack.split('-')[0].upper()}"
            right.plot(eps, acc, style, marker="o", color=COLORS[kind], label=label)
    left.set(xlabel="corruption severity (0 = clean)", ylabel="top-1 accuracy", title="Corrupted digits (mean of 6)")
    right.set(xlabel="L∞ radius ε (x 1/255, pixel space)", ylabel="top-1 accuracy", title="Adversarial digits")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def headlines(all_results: dict[str, dict[str, float]]) -> str:
    """A line per headline (clean, corrupted, FGSM, PGD) saying which model wins and by how much."""
    sym, rpc = all_results["symmetric"], all_results["rpc"]
    groups = {
        "clean accuracy": ("clean/acc1",),
        "mean corrupted accuracy": ("corrupted/mean_acc1",),
        "FGSM accuracy, mean over radii": tuple(k for k in sym if k.startswith("attack/fgsm")),
        "PGD accuracy, mean over radii": tuple(k for k in sym if k.startswith("attack/pgd")),
    }
    lines = ["What the data shows:", ""]
    for name, keys in groups.items():
        s, r = (sum(res[k] for k in keys) / len(keys) for res in (sym, rpc))
        winner = "RPC-SymViT" if r > s else "SymViT" if s > r else "neither"
        lines.append(f"- {name}: SymViT {s:.4f}, RPC-SymViT {r:.4f} ({winner} higher by {abs(r - s):.4f})")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """``--out`` and ``--configs``; anything else is passed on to the CLI (e.g. ``--trainer.max_epochs=5``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="where runs and the report go")
    parser.add_argument("--configs", type=Path, default=Path("configs"), help="the repository's configs folder")
    return parser.parse_known_args(argv)


def run(argv: list[str] | None = None) -> Path:
    """Train, test, compare and analyse both models; return the path of the Markdown report."""
    args, extra = parse_args(argv)
    runs = {kind: train_and_test(kind, args.configs, args.out, extra) for kind in KINDS}
    all_results = {kind: run.results for kind, run in runs.items()}
    report, figure = args.out / "report.md", args.out / "report.png"
    plot(all_results, figure)
    comparison = compare(args.out, "vision_cls", args.out, only=[run.fit_dir for run in runs.values()])
    analyses = {LABELS[kind]: run.analysis for kind, run in runs.items()}
    write_analysis(analyses, args.out, "kernel_pca")
    text = f"{comparison.read_text(encoding='utf-8')}\n{headlines(all_results)}"
    page = (
        f"# SymViT vs RPC-SymViT on the built-in digits\n\n![accuracy]({figure.name})\n\n"
        f"## Results (`kpca-report {args.out} --task vision_cls`)\n\n{text}\n"
        f"## Kernel-PCA diagnostics ({ANALYSED_DIGITS} validation digits, best checkpoints)\n\n"
        f"![kernel PCA](kernel_pca.png)\n\n{analysis_markdown(analyses)}"
    )
    write_atomic(report, lambda f: f.write(page), mode="w", encoding="utf-8")
    logger.info("\n%s", page)
    logger.info("report: %s | plot: %s | TensorBoard: tensorboard --logdir %s", report, figure, args.out)
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    argv, sys.argv = sys.argv[1:], sys.argv[:1]  # the CLI calls get explicit args; LightningCLI warns otherwise
    run(argv)
