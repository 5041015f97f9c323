"""The segmentation demo (``make demo-seg``): Segmenter vs RPC-Segmenter on the built-in synthetic ADE20K.

Both tiny models train through the real ``segmentation`` CLI from ``configs/segmentation/demo_synthetic.yaml``
(mmseg's ADE20K dataset and pipelines on a synthetic set in the ADE20K layout), are tested from their best
checkpoint on the clean and corrupted validation sets (sliding windows, mIoU over the 150 classes), and compared
by ``kpca-report`` (:mod:`kpca.training.compare`: ``comparison.{md,csv,png}``). ``report.md`` holds that table,
the mIoU of both models per evaluation set (``per_set.{md,csv}``) and a PNG of predictions.

    python -m kpca.segmentation.demo --out runs/demo-seg
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (the backend must be chosen first)
import torch  # noqa: E402

from kpca.segmentation.callbacks import overlay  # noqa: E402
from kpca.segmentation.cli import SegmentationCLI, main  # noqa: E402
from kpca.segmentation.evaluation import SEGMENTATION_REPORT  # noqa: E402
from kpca.segmentation.module import SegmentationModule  # noqa: E402
from kpca.training.compare import compare  # noqa: E402
from kpca.training.files import write_atomic  # noqa: E402
from kpca.training.reports import write_report  # noqa: E402

logger = logging.getLogger("kpca.segmentation.demo")

KINDS = ("symmetric", "rpc")
LABELS = {"symmetric": "Segmenter (symmetric)", "rpc": "RPC-Segmenter (6 PAP iterations, enc. + dec. block 0)"}
LAYERS = {"symmetric": "all", "rpc": "[0]"}  # symmetric: every block; RPC: PAP in block 0, symmetric elsewhere


def train_and_test(kind: str, configs: Path, out: Path, extra: list[str]) -> tuple[SegmentationCLI, Path, Path]:
    """Fit one model and test its best checkpoint; returns the fit CLI, the checkpoint and the test log dir.

    The fit's run folder is the checkpoint's ``parent.parent``.
    """
    common = [
        "-c", str(configs / "trainer" / "cpu.yaml"),
        "-c", str(configs / "segmentation" / "demo_synthetic.yaml"),
        f"--trainer.logger.init_args.save_dir={out}",
        f"--trainer.logger.init_args.name={kind}",
        f"--model.net.init_args.attention.kind={kind}",
        f"--model.net.init_args.attention.layers={LAYERS[kind]}",
        f"--model.net.init_args.decoder_attention.kind={kind}",
        f"--model.net.init_args.decoder_attention.layers={LAYERS[kind]}",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]  # fmt: skip
    fit = main(["fit", *common])
    best = Path(fit.trainer.checkpoint_callback.best_model_path)
    logger.info("%s: best checkpoint %s (val/mIoU %.4f)", kind, best, fit.trainer.checkpoint_callback.best_model_score)
    test = main(["test", *common, f"--ckpt_path={best}"])
    return fit, best, Path(test.trainer.log_dir)


def read_results(log_dir: Path) -> dict[str, float]:
    """``{set: mIoU %}`` from a test run's segmentation report: ``clean``, ``fog/1``, ``fog/mean``, ..."""
    with open(log_dir / f"{SEGMENTATION_REPORT.stem}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {_set_key(row): float(row["mIoU"]) for row in rows}


def _set_key(row: dict[str, str]) -> str:
    if row["severity"] == "" or row["set"] == "all corruptions":
        return row["set"]
    return f"{row['set']}/{row['severity']}"


def comparison_rows(all_results: dict[str, dict[str, float]]) -> list[dict[str, object]]:
    """One row per evaluation set: mIoU of both models and the difference (RPC - symmetric), in %."""
    sym, rpc = all_results["symmetric"], all_results["rpc"]
    return [{"set": key, "symmetric": sym[key], "rpc": rpc[key], "rpc - symmetric": rpc[key] - sym[key]} for key in sym]


def markdown(rows: list[dict[str, object]], seconds: float) -> str:
    """The comparison table and a line per headline saying which model wins."""
    lines = ["| set | Segmenter mIoU % | RPC-Segmenter mIoU % | RPC - Sym |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {r['set']} | {r['symmetric']:.2f} | {r['rpc']:.2f} | {r['rpc - symmetric']:+.2f} |" for r in rows]
    lines += ["", "What the data shows:", ""]
    by_set = {r["set"]: r for r in rows}
    for name, key in (("clean mIoU", "clean"), ("mean corrupted mIoU", "all corruptions")):
        s, r = by_set[key]["symmetric"], by_set[key]["rpc"]
        winner = "RPC-Segmenter" if r > s else "Segmenter" if s > r else "neither"
        lines.append(f"- {name}: Segmenter {s:.2f}, RPC-Segmenter {r:.2f} ({winner} higher by {abs(r - s):.2f})")
    lines.append(f"- wall time (both models, train + test): {seconds / 60:.1f} min")
    return "\n".join(lines) + "\n"


def plot_predictions(fit: SegmentationCLI, checkpoints: dict[str, Path], path: Path, num_images: int = 3) -> None:
    """Rows of [image, ground truth, each model's prediction] for clean and corrupted validation images."""
    datamodule = fit.datamodule
    corruption = datamodule.corruptions[0]
    sets = {"clean": datamodule.eval_dataset(), f"{corruption} s3": datamodule.eval_dataset(corruption, 3)}
    models = {kind: SegmentationModule.load_from_checkpoint(c, map_location="cpu") for kind, c in checkpoints.items()}
    palette = torch.tensor(datamodule.palette, dtype=torch.float32) / 255.0  # (K, 3)
    columns = ["image", "ground truth", *(LABELS[kind].split(" (")[0] for kind in models)]
    num_rows = len(sets) * num_images
    fig, axes = plt.subplots(num_rows, len(columns), figsize=(2.2 * len(columns), 2.2 * num_rows))
    row = 0
    for set_name, dataset in sets.items():
        for index in range(num_images):
            image, label, _ = dataset[index]
            image = image.float() / 255.0  # (3, H, W)
            panels = [overlay(image, torch.full_like(label, 255), palette), overlay(image, label, palette, 0.6)]
            for model in models.values():
                model.eval()
                panels.append(overlay(image, model.predict_image(image, label.shape)[1], palette, 0.6))
            for col, panel in enumerate(panels):
                axes[row, col].imshow(panel.permute(1, 2, 0).numpy())
                axes[row, col].set_xticks([])
                axes[row, col].set_yticks([])
                if row == 0:
                    axes[row, col].set_title(columns[col], fontsize=8)
            axes[row, 0].set_ylabel(set_name, fontsize=8)
            row += 1
    note = "The background is 'other' (ignored in training and metrics): predictions there are arbitrary"
    fig.suptitle(note, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """``--out`` and ``--configs``; anything else is passed on to the CLI (e.g. ``--trainer.max_epochs=2``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/demo-seg"), help="where runs and the report go")
    parser.add_argument("--configs", type=Path, default=Path("configs"), help="the repository's configs folder")
    return parser.parse_known_args(argv)


def run(argv: list[str] | None = None) -> Path:
    """Train, test and compare both models; return the path of the Markdown report."""
    args, extra = parse_args(argv)
    start = time.perf_counter()
    all_results, checkpoints, fit = {}, {}, None
    for kind in KINDS:
        fit, checkpoints[kind], log_dir = train_and_test(kind, args.configs, args.out, extra)
        all_results[kind] = read_results(log_dir)
    rows = comparison_rows(all_results)
    report, figure = args.out / "report.md", args.out / "predictions.png"
    plot_predictions(fit, checkpoints, figure)
    text = markdown(rows, time.perf_counter() - start)
    comparison = compare(args.out, "segmentation", args.out, only=[c.parent.parent for c in checkpoints.values()])
    write_report(rows, args.out, "per_set")  # per_set.md and per_set.csv
    title = "# Segmenter vs RPC-Segmenter on the built-in synthetic ADE20K (mIoU over 150 classes, %)"
    page = (
        f"{title}\n\n## Results (`kpca-report {args.out} --task segmentation`)\n\n"
        f"{comparison.read_text(encoding='utf-8')}\n## Per evaluation set\n\n{text}\n![predictions]({figure.name})\n"
    )
    write_atomic(report, lambda f: f.write(page), mode="w", encoding="utf-8")
    logger.info("\n%s", text)
    logger.info("report: %s | predictions: %s | TensorBoard: tensorboard --logdir %s", report, figure, args.out)
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    argv, sys.argv = sys.argv[1:], sys.argv[:1]  # the CLI calls get explicit args; LightningCLI warns otherwise
    run(argv)
