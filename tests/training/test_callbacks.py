"""Shared callbacks in short CPU fits: per-RPC-layer diagnostics and throughput, read back from TensorBoard."""

import logging
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kpca.attention import RPCAttention
from kpca.training.callbacks import (
    NonFiniteLoss,
    RPCDiagnostics,
    Throughput,
    layer_tag,
    rpc_layers,
    tensorboard_writer,
)
from kpca.training.checkpointing.callback import Checkpoint
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


def test_layer_tag_drops_the_trailing_attn():
    assert layer_tag("vit.blocks.0.attn") == "vit.blocks.0"
    assert layer_tag("decoder.blocks.1.attn") == "decoder.blocks.1"
    assert layer_tag("attn_pool.proj") == "attn_pool.proj"


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


# NonFiniteLoss: a tiny regression whose loss is NaN at one step


class Regression(pl.LightningModule):
    """A Linear fit by MSE; the loss of step ``nan_step`` is NaN (its gradients too)."""

    def __init__(self, optimizer: str = "sgd", nan_step: int = 2) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.optimizer = optimizer
        self.nan_step = nan_step

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        return loss * float("nan") if self.global_step == self.nan_step else loss

    def configure_optimizers(self):
        if self.optimizer == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=0.1)
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Snapshots(pl.Callback):
    """The module's weights before and after each training batch, by global step at the batch's start."""

    def __init__(self) -> None:
        self.before: dict[int, dict[str, torch.Tensor]] = {}
        self.after: dict[int, dict[str, torch.Tensor]] = {}
        self._step = 0

    @staticmethod
    def _weights(pl_module) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in pl_module.named_parameters()}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step
        self.before[self._step] = self._weights(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.after[self._step] = self._weights(pl_module)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def finite(weights: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(w).all()) for w in weights.values())


def fit_regression(module: Regression, callbacks: list[pl.Callback], max_steps: int = 5) -> pl.Trainer:
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=max_steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(module, DataLoader(data, batch_size=4))
    return trainer


def test_nonfinite_loss_rejects_an_unknown_action():
    with pytest.raises(ValueError, match="action='bogus' is not one of 'stop', 'skip'"):
        NonFiniteLoss("bogus")


def test_nonfinite_loss_stop_raises_before_the_bad_step():
    module, snapshots = Regression(), Snapshots()
    with pytest.raises(FloatingPointError, match="step 2") as error:
        fit_regression(module, [NonFiniteLoss("stop"), snapshots])
    assert "nonfinite_loss.action=skip" in str(error.value)
    assert "loss nan" in str(error.value)
    assert sorted(snapshots.after) == [0, 1]  # step 2 never completed
    weights = {name: p.detach() for name, p in module.named_parameters()}
    assert finite(weights)
    assert same(weights, snapshots.after[1])  # the weights of the last good step
    assert not same(snapshots.after[1], snapshots.before[1])  # steps 0 and 1 did train


def test_nonfinite_loss_stop_leaves_finite_runs_alone():
    trainer = fit_regression(Regression(nan_step=-1), [NonFiniteLoss("stop")])
    assert trainer.global_step == 5


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_nonfinite_loss_skip_drops_the_bad_step(optimizer, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("kpca"), "propagate", True)  # in case console_logging() turned it off
    module, snapshots = Regression(optimizer), Snapshots()
    with caplog.at_level(logging.WARNING, logger="kpca.training.callbacks"):
        trainer = fit_regression(module, [NonFiniteLoss("skip"), snapshots])
    assert trainer.global_step == 5
    assert sorted(snapshots.after) == [0, 1, 2, 3, 4]
    assert all(finite(weights) for weights in snapshots.after.values())
    assert same(snapshots.after[2], snapshots.before[2])  # the skipped step left the weights alone
    for step in (0, 1, 3, 4):  # the others trained
        assert not same(snapshots.after[step], snapshots.before[step])
    warnings = [r for r in caplog.records if r.name == "kpca.training.callbacks" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "step 2" in warnings[0].getMessage()
    if optimizer == "adamw":
        state = trainer.optimizers[0].state
        for p in module.parameters():
            assert int(state[p]["step"]) == 4  # five optimizer steps, the skipped one did not count


# Checkpoint: last.ckpt follows every save point


class WorseningModule(pl.LightningModule):
    """A Linear whose logged ``val/loss`` is the epoch number: it gets worse each epoch, so epoch 0 stays best."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_three_epochs(checkpoint: ModelCheckpoint, **trainer_options: object) -> pl.Trainer:
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)  # 2 steps an epoch
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[checkpoint], **trainer_options,
    )  # fmt: skip
    trainer.fit(WorseningModule(), data, data)
    return trainer


def saved_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


def checkpoint_settings(dirpath: Path) -> dict:
    return {
        "dirpath": dirpath, "filename": "best-{epoch:03d}", "auto_insert_metric_name": False,
        "monitor": "val/loss", "mode": "min", "save_top_k": 1, "save_last": True,
    }  # fmt: skip


def test_checkpoint_rewrites_last_at_every_epoch(tmp_path):
    trainer = fit_three_epochs(Checkpoint(**checkpoint_settings(tmp_path)))
    assert trainer.global_step == 6
    assert saved_step(tmp_path / "last.ckpt") == 6
    assert sorted(p.name for p in tmp_path.glob("best-*")) == ["best-000.ckpt"]
    assert saved_step(tmp_path / "best-000.ckpt") == 2


def test_model_checkpoint_leaves_last_at_the_best_step(tmp_path):
    """Why Checkpoint exists: Lightning's own last.ckpt stays at the last improvement (epoch 0 here)."""
    trainer = fit_three_epochs(ModelCheckpoint(**checkpoint_settings(tmp_path)))
    assert trainer.global_step == 6
    assert saved_step(tmp_path / "last.ckpt") == 2
    assert sorted(p.name for p in tmp_path.glob("best-*")) == ["best-000.ckpt"]


def test_a_fast_dev_run_saves_no_checkpoint(tmp_path):
    fit_three_epochs(Checkpoint(**checkpoint_settings(tmp_path / "ours")), fast_dev_run=True)
    assert not (tmp_path / "ours").exists()
    fit_three_epochs(ModelCheckpoint(**checkpoint_settings(tmp_path / "lightning")), fast_dev_run=True)
    assert [p.name for p in (tmp_path / "lightning").iterdir()] == ["last.ckpt"]  # why on_train_end is overridden
