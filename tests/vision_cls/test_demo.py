"""The demo's report: curves, the comparison table and the plot, from hand-made results; (slow) a whole tiny run."""

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from kpca.vision_cls import demo


def results(clean: float, corrupted: float, attacked: float) -> dict[str, float]:
    out = {"clean/acc1": clean, "clean/acc5": 1.0, "corrupted/mean_acc1": corrupted}
    for name in ("gaussian_noise", "contrast"):
        for severity in range(1, 6):
            out[f"corrupted/{name}/s{severity}/acc1"] = corrupted - 0.01 * severity
    for attack in ("fgsm-pixel", "pgd-pixel"):
        for level in (1, 2, 4):
            out[f"attack/{attack}/eps{level}/acc1"] = attacked / level
    return out


def test_curves_start_from_clean_accuracy():
    r = results(0.9, 0.7, 0.4)
    assert demo.severity_curve(r) == pytest.approx([0.9, 0.69, 0.68, 0.67, 0.66, 0.65])
    eps, acc = demo.attack_curve(r, "pgd-pixel")
    assert eps == [0.0, 1.0, 2.0, 4.0] and acc == [0.9, 0.4, 0.2, 0.1]


def test_headlines_name_the_winner_of_each():
    text = demo.headlines({"symmetric": results(0.9, 0.7, 0.4), "rpc": results(0.8, 0.75, 0.4)})
    assert "- clean accuracy: SymViT 0.9000, RPC-SymViT 0.8000 (SymViT higher by 0.1000)" in text
    assert "- mean corrupted accuracy: SymViT 0.7000, RPC-SymViT 0.7500 (RPC-SymViT higher by 0.0500)" in text
    assert "FGSM accuracy, mean over radii: SymViT 0.2333, RPC-SymViT 0.2333 (neither higher" in text


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "report.png"
    demo.plot({"symmetric": results(0.9, 0.7, 0.4), "rpc": results(0.8, 0.75, 0.3)}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The dirpath has changed from")  # the test run logs into a new version folder
def test_demo_end_to_end_on_a_tiny_budget(tmp_path: Path, digits_cache_dir: Path):
    configs = Path(__file__).resolve().parents[2] / "configs"
    with mock.patch.object(sys, "argv", ["demo"]):  # as `python -m kpca.vision_cls.demo` leaves it
        report = demo.run(
            [
                f"--out={tmp_path}", f"--configs={configs}", f"--data.cache_dir={digits_cache_dir}",
                "--model.net.init_args.embed_dim=32", "--model.net.init_args.depth=2",
                "--model.net.init_args.num_heads=2", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
                "--trainer.log_every_n_steps=1", "--data.eval_subset=16", "--data.corruptions=[gaussian_noise]",
                '--model.evaluator.attacks=[{"name": "fgsm", "eps": [0.0627451]},'
                ' {"name": "pgd", "eps": [0.0627451], "steps": 2}]',
            ]
        )  # fmt: skip
    assert report == tmp_path / "report.md"
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = report.read_text()
    comparison, _, kernel_pca = text.partition("## Kernel-PCA diagnostics")
    rows = [line.split("|")[1:-1] for line in comparison.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in rows[0]]
    assert header[:3] == ["model", "seeds", "clean/acc1"] and "attack/pgd-pixel/eps16/acc1" in header
    table = {cells[0].strip(): [float(c) for c in cells[2:]] for cells in rows[2:]}  # after the "---" row
    assert sorted(table) == ["rpc n_iter=4 lambd=4.0 layers=[0]", "symmetric"]
    assert all(0.0 <= value <= 1.0 for values in table.values() for value in values), table
    assert "What the data shows:" in comparison
    layers = [
        line.split("|")[1:3] for line in kernel_pca.splitlines() if line.startswith("| ") and "vit.blocks" in line
    ]
    assert [(m.strip(), layer.strip()) for m, layer in layers] == [
        ("SymViT", "vit.blocks.0"),
        ("SymViT", "vit.blocks.1"),
        ("RPC-SymViT (4 PAP iterations, block 0)", "vit.blocks.0"),
        ("RPC-SymViT (4 PAP iterations, block 0)", "vit.blocks.1"),
    ]
    assert (tmp_path / "kernel_pca.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list(tmp_path.glob("*/version_*/checkpoints/best-*.ckpt"))) == 2
    for kind in ("symmetric", "rpc"):  # both models are symmetric in every block (K, V rows only): SymViT's twin
        (best,) = tmp_path.glob(f"{kind}/version_*/checkpoints/best-*.ckpt")
        checkpoint = torch.load(best, weights_only=True)
        rows = [w.shape[0] for k, w in checkpoint["state_dict"].items() if k.endswith("attn.qkv.weight")]
        assert rows == [2 * 32, 2 * 32], (kind, rows)
        layers = checkpoint["hyper_parameters"]["net"]["init_args"]["attention"]["layers"]
        assert layers == ("all" if kind == "symmetric" else [0])
