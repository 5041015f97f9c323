"""``make demo-lm``: symmetric vs RPC language models on the built-in corpus, clean and word-swapped perplexity.

Both models train through the real ``language-model`` CLI from ``configs/language_model/demo.yaml``;
each is tested from its best checkpoint (word- and token-level perplexity of valid and test, clean
and with 1.5% of non-stopwords swapped for "AAA") and continues the prompts; ``kpca-report``
(:mod:`kpca.training.compare`) puts both side by side, and the report adds the details and samples.

    python -m kpca.language_model.demo --out runs/demo-lm
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
import time
from pathlib import Path

from kpca.language_model.cli import main
from kpca.language_model.perplexity import PERPLEXITY_REPORT
from kpca.training.compare import compare
from kpca.training.files import write_atomic

logger = logging.getLogger("kpca.language_model.demo")

KINDS = ("symmetric", "rpc")
LABELS = {"symmetric": "symmetric softmax", "rpc": "RPC (2 PAP iterations, all blocks)"}


def train_test_sample(kind: str, configs: Path, out: Path, extra: list[str]) -> tuple[Path, Path, Path]:
    """Fit one model, then test and sample from its best checkpoint; return the (fit, test, predict) log dirs."""
    common = [
        "-c", str(configs / "trainer" / "cpu.yaml"),
        "-c", str(configs / "language_model" / "demo.yaml"),
        f"--trainer.logger.init_args.save_dir={out}",
        f"--trainer.logger.init_args.name={kind}",
        f"--model.net.init_args.attention.kind={kind}",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]  # fmt: skip
    fit = main(["fit", *common])
    checkpoint = fit.trainer.checkpoint_callback
    logger.info("%s: best checkpoint %s (val/ppl %.2f)", kind, checkpoint.best_model_path, checkpoint.best_model_score)
    test = main(["test", *common, f"--ckpt_path={checkpoint.best_model_path}"])
    predict = main(["predict", *common, f"--ckpt_path={checkpoint.best_model_path}"])
    return Path(fit.trainer.log_dir), Path(test.trainer.log_dir), Path(predict.trainer.log_dir)


def read_perplexities(log_dir: Path) -> dict[str, dict[str, float]]:
    """``set -> {ppl_word, ppl_token}`` from a test run's perplexity report."""
    with open(log_dir / f"{PERPLEXITY_REPORT.stem}.csv", newline="") as f:
        return {row["set"]: {k: float(row[k]) for k in ("ppl_word", "ppl_token")} for row in csv.DictReader(f)}


def read_samples(log_dir: Path) -> list[dict[str, str]]:
    """The ``{"prompt", "text"}`` rows of a predict run's ``predictions.jsonl``."""
    return [json.loads(line) for line in (log_dir / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


def markdown(
    results: dict[str, dict[str, dict[str, float]]], samples: dict[str, list[dict[str, str]]], seconds: float
) -> str:
    """A perplexity table (both models, clean and word-swapped), a verdict per set, the sampled text, the run time."""
    sym, rpc = results["symmetric"], results["rpc"]
    lines = [
        "| set | symmetric ppl (word) | RPC ppl (word) | symmetric ppl (token) | RPC ppl (token) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {name} | {sym[name]['ppl_word']:.2f} | {rpc[name]['ppl_word']:.2f} "
        f"| {sym[name]['ppl_token']:.2f} | {rpc[name]['ppl_token']:.2f} |"
        for name in sym
    ]
    lines += ["", "What the data shows (word-level perplexity, lower is better):", ""]
    for name in (n for n in sym if not n.endswith("_wordswap")):
        attacked = f"{name}_wordswap"
        for label, res in (("symmetric", sym), ("RPC", rpc)):
            if attacked in res:
                rise = res[attacked]["ppl_word"] / res[name]["ppl_word"]
                lines.append(f"- {name}, {label}: word swap multiplies perplexity by {rise:.3f}")
        winner = "RPC" if rpc[name]["ppl_word"] < sym[name]["ppl_word"] else "symmetric"
        lines.append(f"- {name}: {winner} has the lower clean perplexity")
    lines += ["", "Samples (top-k 10, temperature 0.8):", ""]
    for kind in KINDS:
        lines += [f"{LABELS[kind]}:", ""]
        lines += [f"    {row['text']}".replace("\n", "\n    ") for row in samples[kind]]
        lines.append("")
    lines.append(f"Both models trained, tested and sampled in {seconds / 60:.1f} min.")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """``--out`` and ``--configs``; anything else is passed on to the CLI (e.g. ``--trainer.max_epochs=1``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/demo-lm"), help="where runs and the report go")
    parser.add_argument("--configs", type=Path, default=Path("configs"), help="the repository's configs folder")
    return parser.parse_known_args(argv)


def run(argv: list[str] | None = None) -> Path:
    """Train, test and sample both models; return the path of the Markdown report."""
    args, extra = parse_args(argv)
    start = time.perf_counter()
    results, samples, fit_dirs = {}, {}, []
    for kind in KINDS:
        fit_dir, test_dir, predict_dir = train_test_sample(kind, args.configs, args.out, extra)
        results[kind], samples[kind] = read_perplexities(test_dir), read_samples(predict_dir)
        fit_dirs.append(fit_dir)
    text = markdown(results, samples, time.perf_counter() - start)
    comparison = compare(args.out, "language_model", args.out, only=fit_dirs)
    report = args.out / "report.md"
    title = "# Symmetric vs RPC language models on the built-in corpus"
    summary = f"## Results (`kpca-report {args.out} --task language_model`)\n\n{comparison.read_text(encoding='utf-8')}"
    page = f"{title}\n\n{summary}\n## Details\n\n{text}"
    write_atomic(report, lambda f: f.write(page), mode="w", encoding="utf-8")
    logger.info("\n%s", text)
    logger.info("report: %s | TensorBoard: tensorboard --logdir %s", report, args.out)
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    argv, sys.argv = sys.argv[1:], sys.argv[:1]  # the CLI calls get explicit args; LightningCLI warns otherwise
    run(argv)
