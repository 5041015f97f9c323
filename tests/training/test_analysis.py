"""Kernel-PCA analysis of a network and its monitor in a real Lightning fit, read back from TensorBoard."""

import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kpca.attention import RPCAttention, SoftmaxAttention
from kpca.attention.kernel_pca import kernel_pca_diagnostics
from kpca.training.analysis import (
    SUMMARY_METRICS,
    KernelPCAMonitor,
    analysis_markdown,
    analyze_network,
    network_inputs,
    read_analysis,
    write_analysis,
)

WIDTH, HEADS, TOKENS = 8, 2, 5


class Net(nn.Module):
    """Two attention layers: a causal asymmetric one and an RPC one, around a token embedding."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Linear(3, WIDTH)
        self.first = SoftmaxAttention(WIDTH, HEADS, is_causal=True, attn_drop=dropout)
        self.second = nn.Sequential(nn.Dropout(dropout), RPCAttention(WIDTH, HEADS, n_iter=2))
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = h + self.first(h)
        return self.head((h + self.second(h)).mean(1))


def _heads(layer, x):
    """(q, k, v) as (B, H, N, D), written out: q = k for a symmetric projection (K, V rows only)."""
    parts = layer.qkv(x).view(*x.shape[:2], -1, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
    return parts if len(parts) == 3 else (parts[0], *parts)


def test_analysis_is_the_diagnostics_of_each_layers_own_queries_keys_and_values():
    net = Net()
    x = torch.randn(4, TOKENS, 3)
    results = analyze_network(net, x)
    assert [(r.layer, r.symmetric) for r in results] == [("first", False), ("second.1", True)]
    h = net.embed(x)
    first = kernel_pca_diagnostics(*_heads(net.first, h), is_causal=True)  # the layer is causal
    h = h + net.first(h)
    second = kernel_pca_diagnostics(*_heads(net.second[1], h))
    for result, expected in zip(results, (first, second), strict=True):
        assert result.projection_loss.shape == (HEADS,) and result.eigenvalues.shape == (HEADS, TOKENS)
        torch.testing.assert_close(result.projection_loss, expected.projection_loss.mean(0))
        torch.testing.assert_close(result.gamma_spread, expected.eigenvector.spread_mean.mean((0, 2)))
        torch.testing.assert_close(result.eigen_residual, expected.eigenvector.residual.mean((0, 2)))
        assert list(result.summary()) == list(SUMMARY_METRICS)
        assert result.summary()["eigen_residual"] == pytest.approx(float(expected.eigenvector.residual.detach().mean()))
        torch.testing.assert_close(result.value_alignment, expected.value_alignment.mean(0))
        torch.testing.assert_close(result.eigenvalues, expected.eigenvalues.mean(0))


def test_analysis_runs_without_dropout_and_restores_the_mode():
    net = Net(dropout=0.5).train()
    x = torch.randn(4, TOKENS, 3)
    first, second = analyze_network(net, x), analyze_network(net, x)
    assert net.training
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a.projection_loss, b.projection_loss)


def test_analysis_refuses_a_network_without_attention():
    with pytest.raises(ValueError, match="Linear has no attention layer"):
        analyze_network(nn.Linear(3, 3), torch.randn(2, 3))


def test_network_inputs_of_each_batch_layout():
    x = torch.randn(2, 3)
    assert network_inputs((x, torch.zeros(2))) is x
    assert network_inputs({"images": x, "labels": None}) is x
    with pytest.raises(TypeError, match="got list.*--split train"):
        network_inputs({"images": [x, x]})


def test_write_analysis_writes_one_row_per_model_and_layer_and_a_png(tmp_path: Path):
    x = torch.randn(3, TOKENS, 3)
    results = {"a": analyze_network(Net(), x), "b": analyze_network(Net(), x)}
    md, csv, png = write_analysis(results, tmp_path)
    lines = csv.read_text().splitlines()
    assert lines[0] == (
        "model,layer,heads,symmetric,projection_loss,gamma_spread,gamma_spread_std,eigen_residual,gamma_scale,"
        "value_alignment"
    )
    assert [line.split(",")[:2] for line in lines[1:]] == [["a", "first"], ["a", "second.1"]] + [
        ["b", "first"],
        ["b", "second.1"],
    ]
    assert md.read_text().count("\n") == 2 + 4 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class Module(pl.LightningModule):
    flops_per_batch = None

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", nn.functional.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


class Data(pl.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.train = TensorDataset(torch.randn(8, TOKENS, 3), torch.randint(0, 2, (8,)))
        self.val = TensorDataset(torch.randn(6, TOKENS, 3), torch.randint(0, 2, (6,)))

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=4)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=4)


def test_monitor_logs_scalars_and_a_figure_every_n_epochs_on_a_fixed_batch(tmp_path: Path):
    monitor = KernelPCAMonitor(every_n_epochs=2, samples=3)
    module, data = Module(), Data()
    trainer = pl.Trainer(
        max_epochs=4, callbacks=[monitor], logger=TensorBoardLogger(tmp_path), accelerator="cpu",
        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(module, data)
    torch.testing.assert_close(monitor._inputs, data.val.tensors[0][:3])  # the first validation inputs
    events = EventAccumulator(str(next(Path(trainer.log_dir).glob("events.*"))), size_guidance={"images": 0})
    events.Reload()
    steps = [e.step for e in events.Scalars("kpca/first/projection_loss")]
    assert steps == [4, 8]  # the ends of epochs 2 and 4 (2 steps per epoch)
    for metric in SUMMARY_METRICS:
        assert len(events.Scalars(f"kpca/second.1/{metric}")) == 2
    residual = analyze_network(module.net, data.val.tensors[0][:3])[1].eigen_residual.mean()
    assert 0 < events.Scalars("kpca/second.1/eigen_residual")[-1].value <= 1
    assert math.isclose(events.Scalars("kpca/second.1/eigen_residual")[-1].value, float(residual), rel_tol=1e-6)
    assert [e.step for e in events.Images("kpca/analysis")] == [4, 8]
    expected = analyze_network(module.net, data.val.tensors[0][:3])[0].projection_loss.mean()  # the final weights
    assert math.isclose(events.Scalars("kpca/first/projection_loss")[-1].value, float(expected), rel_tol=1e-6)


def test_monitor_is_off_by_default_and_checks_its_arguments():
    assert KernelPCAMonitor().every_n_epochs == 0
    with pytest.raises(ValueError, match="every_n_epochs must be an int >= 0"):
        KernelPCAMonitor(every_n_epochs=-1)
    with pytest.raises(ValueError, match="samples must be a positive int"):
        KernelPCAMonitor(samples=0)


def test_write_analysis_takes_layers_of_different_lengths(tmp_path: Path):
    # an encoder and a decoder see different numbers of tokens (segmentation: patches vs patches + classes)
    layers = analyze_network(Net(), torch.randn(2, TOKENS, 3)) + analyze_network(Net(), torch.randn(2, 2 * TOKENS, 3))
    _, csv, png = write_analysis({"net": layers}, tmp_path)
    assert len(csv.read_text().splitlines()) == 1 + 4 and png.stat().st_size > 0


def test_read_analysis_reads_back_what_write_analysis_wrote(tmp_path: Path):
    layers = analyze_network(Net(), torch.randn(3, TOKENS, 3))
    _, csv, _ = write_analysis({"net": layers, "other": layers[:1]}, tmp_path)
    read = read_analysis(csv, model="net")
    assert [(r.layer, r.symmetric, len(r.projection_loss)) for r in read] == [
        ("first", False, 2),
        ("second.1", True, 2),
    ]
    for original, back in zip(layers, read, strict=True):
        assert back.summary() == pytest.approx(original.summary(), rel=1e-15, abs=0)
        assert back.eigenvalues.shape == (HEADS, 0)  # the CSV has no spectrum
    assert analysis_markdown({"net": read}) == analysis_markdown({"net": layers})
    _, again, png = write_analysis({"net": read}, tmp_path / "again")  # the figure takes layers read back
    for back, twice in zip(read, read_analysis(again), strict=True):
        assert twice.summary() == pytest.approx(back.summary(), rel=1e-15, abs=0)
    assert png.stat().st_size > 0


def test_read_analysis_names_what_is_wrong(tmp_path: Path):
    _, csv, _ = write_analysis({"a": analyze_network(Net(), torch.randn(2, TOKENS, 3))}, tmp_path)
    with pytest.raises(ValueError, match=r"model 'b' is not in .*kernel_pca.csv, which holds \['a'\]"):
        read_analysis(csv, model="b")
    two = tmp_path / "two.csv"
    two.write_text(csv.read_text() + csv.read_text().splitlines()[1].replace("a,", "c,", 1) + "\n")
    with pytest.raises(ValueError, match=r"holds the models \['a', 'c'\]; pass model="):
        read_analysis(two)
    old = tmp_path / "old.csv"
    old.write_text("model,layer,heads,projection_loss\na,first,2,0.5\n")
    with pytest.raises(
        ValueError, match=r"lacks the kernel-PCA column\(s\) \['symmetric', 'gamma_spread'.*run analyze again"
    ):
        read_analysis(old)
    bad = tmp_path / "bad.csv"
    bad.write_text(csv.read_text().replace(",2,False,", ",two,False,", 1))
    with pytest.raises(ValueError, match="layer 'first': a cell is not a number"):
        read_analysis(bad)
