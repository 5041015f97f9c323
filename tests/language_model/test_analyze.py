"""``language-model analyze``: the kernel-PCA report of a causal LM checkpoint through the CLI."""

import csv
from pathlib import Path

import pytest
import torch

from kpca.language_model.cli import LanguageModelCLI, main
from kpca.training.analysis import analyze_network
from tests.cli_support import CONFIGS, run_cli, smoke_options

SMOKE = CONFIGS / "language_model" / "smoke.yaml"


def run(*args: object) -> LanguageModelCLI:
    return run_cli(main, "language-model", *args)


def test_analyze_writes_the_report_of_every_causal_layer(tmp_path: Path, lm_cache_dir: Path):
    options = smoke_options(
        SMOKE, tmp_path, lm_cache_dir, "--trainer.limit_train_batches=3", "--trainer.log_every_n_steps=1"
    )
    fit = run("fit", *options, "--trainer.limit_val_batches=1")
    last = Path(fit.trainer.checkpoint_callback.last_model_path)
    out = tmp_path / "analysis"
    cli = run("analyze", *options, "--ckpt_path", last, "--samples", "3", "--out_dir", out)
    with (out / "kernel_pca.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    depth = len(cli.model.net.blocks)
    assert [row["layer"] for row in rows] == [f"blocks.{i}" for i in range(depth)]
    cli.datamodule.setup("validate")
    loader = cli.datamodule.val_dataloader()
    tokens = next(iter(loader[0] if isinstance(loader, list) else loader))[0][:3]
    checkpoint = torch.load(last, weights_only=True)
    for name, value in cli.model.state_dict().items():
        assert torch.equal(value, checkpoint["state_dict"][name]), name
    expected = analyze_network(cli.model.net, tokens)
    for row, layer in zip(rows, expected, strict=True):
        assert float(row["projection_loss"]) == pytest.approx(float(layer.projection_loss.mean()), rel=1e-9)
    assert torch.isfinite(torch.tensor([float(row["gamma_spread"]) for row in rows])).all()
