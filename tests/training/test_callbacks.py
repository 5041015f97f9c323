"""Shared callbacks in short CPU fits: per-RPC-layer diagnostics and throughput, read back from TensorBoard."""

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kpca.attention import RPCAttention
from kpca.training.callbacks import RPCDiagnostics, Throughput, rpc_layers, rpc_tag, tensorboard_writer
from kpca.training.cli import batch_size


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = RPCAttention(8, num_heads=2, n_iter=2, lambd=4.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(1))


class Module(pl.LightningModule):
    flops_per_batch = None  # as NetModule: ThroughputMonitor warns without the attribute

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss_seen", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(tmp_path: Path, callback: pl.Callback, max_steps: int) -> dict[str, list[int]]:
    """Fit the tiny module on random (4, 5, 8) token batches; return each TensorBoard scalar tag's steps."""
    data = TensorDataset(torch.randn(4 * max_steps, 5, 8), torch.randint(0, 2, (4 * max_steps,)))
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=max_steps, logger=TensorBoardLogger(tmp_path), log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(Module(), DataLoader(data, batch_size=4))
    events = EventAccumulator(trainer.log_dir)
    events.Reload()
    return {tag: [event.step for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_rpc_tag_drops_the_trailing_attn():
    assert rpc_tag("vit.blocks.0.attn") == "vit.blocks.0"
    assert rpc_tag("decoder.blocks.1.attn") == "decoder.blocks.1"
    assert rpc_tag("attn_pool.proj") == "attn_pool.proj"


def test_rpc_layers_finds_the_rpc_modules_by_path():
    net = Net()
    assert rpc_layers(net) == {"encoder.attn": net.encoder.attn}


def test_rpc_diagnostics_rejects_a_zero_period():
    with pytest.raises(ValueError, match="every_n_steps must be >= 1"):
        RPCDiagnostics(every_n_steps=0)


def test_rpc_diagnostics_logs_every_layer_each_step(tmp_path):
    steps = fit(tmp_path, RPCDiagnostics(every_n_steps=1), max_steps=3)
    for key in ("nonzero_S", "residual", "residual_first"):
        assert steps[f"train/rpc/encoder/{key}"] == [0, 1, 2]
    assert not any(tag.startswith("train/rpc/net.") for tag in steps)


def test_rpc_diagnostics_logs_only_on_its_steps(tmp_path):
    """Steps 1 and 3 record nothing, so nothing may be logged there (not the value of the step before)."""
    steps = fit(tmp_path, RPCDiagnostics(every_n_steps=2), max_steps=4)
    assert steps["train/loss_seen"] == [0, 1, 2, 3]  # the logger writes every step
    for key in ("nonzero_S", "residual", "residual_first"):
        assert steps[f"train/rpc/encoder/{key}"] == [0, 2]


def test_throughput_needs_two_batches():
    with pytest.raises(ValueError, match="window_size must be >= 2"):
        Throughput(batch_size, window_size=1)


def test_throughput_logs_samples_per_second(tmp_path):
    steps = fit(tmp_path, Throughput(batch_size, window_size=2), max_steps=4)
    assert steps["train/device/samples_per_sec"]


def test_tensorboard_writer():
    assert tensorboard_writer(pl.Trainer(logger=False, accelerator="cpu")) is None
