"""The demo plan (``make demo``, configs/experiments/demo_vision.yaml), run end to end on a tiny budget (slow)."""

import json
from pathlib import Path

import pytest
import torch

from tests.training.test_experiment_report import PLANS, run_plan_copy

LABELS = ("SymViT", "RPC-SymViT (4 PAP iterations, block 0)")


@pytest.mark.slow
def test_demo_plan_end_to_end_on_a_tiny_budget(tmp_path: Path, digits_cache_dir: Path):
    out = tmp_path / "demo"
    text = run_plan_copy(
        PLANS / "demo_vision.yaml",
        out,
        [
            f"--data.cache_dir={digits_cache_dir}", "--model.net.init_args.embed_dim=32",
            "--model.net.init_args.depth=2", "--model.net.init_args.num_heads=2", "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2", "--trainer.log_every_n_steps=1", "--data.eval.subset=16",
            "--data.eval.corruptions=[gaussian_noise]",
            '--model.evaluator.attacks=[{"name": "fgsm", "eps": [0.0627451]}, {"name": "pgd", "eps": [0.0627451], '
            '"steps": 2}]',
        ],
    )  # fmt: skip
    assert text.startswith("# SymViT vs RPC-SymViT on the built-in digits\n") and "## Status" not in text
    comparison, _, rest = text.partition("## Each run's own evaluation")
    own, _, kernel_pca = rest.partition("## Kernel-PCA diagnostics")
    for label, kind in zip(LABELS, ("symmetric", "rpc"), strict=True):  # seed 0's report in full, every metric
        section = own.split(f"### {label}, seed 0 ([{kind}/seed0/test/robustness.md]")[1].split("### ")[0]
        assert "| clean/acc1 |" in section and "| corrupted/gaussian_noise/s1/acc1 |" in section, section
    assert "## Results (`kpca-report" in comparison and "![comparison](comparison.png)" in comparison
    rows = [line.split("|")[1:-1] for line in comparison.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in rows[0]]
    assert header[:3] == ["model", "seeds", "clean/acc1"] and "attack/pgd-pixel/eps16/acc1" in header
    table = {cells[0].strip(): [float(c) for c in cells[2:]] for cells in rows[2:]}  # after the "---" row
    assert list(table) == list(LABELS)  # the plan's labels, in the plan's order
    assert all(0.0 <= value <= 1.0 for values in table.values() for value in values), table
    assert "What the data shows:" in comparison
    for headline in ("clean accuracy", "mean corrupted accuracy", "FGSM accuracy", "PGD accuracy"):
        (line,) = [line for line in comparison.splitlines() if line.startswith(f"- {headline}")]
        assert all(label in line for label in LABELS) and "higher" in line, line
    layers = [
        line.split("|")[1:3] for line in kernel_pca.splitlines() if line.startswith("| ") and "vit.blocks" in line
    ]
    assert [(model.strip(), layer.strip()) for model, layer in layers] == [
        (label, f"vit.blocks.{block}") for label in LABELS for block in (0, 1)
    ]
    assert "(`--samples=32`) on the last checkpoint of seed 0 of each run" in kernel_pca
    for figure in ("comparison.png", "kernel_pca.png"):
        assert (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for kind in ("symmetric", "rpc"):  # both models are symmetric in every block (K, V rows only): SymViT's twin
        assert all((out / kind / "seed0" / f"{step}.done").is_file() for step in ("fit", "test", "analyze"))
        for step in ("test", "analyze"):  # the test set is the validation set: no checkpoint chosen on it
            record = json.loads((out / kind / "seed0" / f"{step}.done").read_text())
            assert Path(record["checkpoint"]).name == "last.ckpt", record
        (best,) = (out / kind / "seed0" / "fit" / "checkpoints").glob("best-*.ckpt")
        checkpoint = torch.load(best, weights_only=True)
        rows = [w.shape[0] for k, w in checkpoint["state_dict"].items() if k.endswith("attn.qkv.weight")]
        assert rows == [2 * 32, 2 * 32], (kind, rows)
        layers = checkpoint["hyper_parameters"]["net"]["init_args"]["attention"]["layers"]
        assert layers == ("all" if kind == "symmetric" else [0])
