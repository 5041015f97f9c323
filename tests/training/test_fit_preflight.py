"""A fit whose training loader yields no batch is refused before its first step (``NetModule.on_fit_start``)."""

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kpca.training.errors import OptionError
from kpca.training.module import NetModule

# Lightning's own warning about the empty loader, which the refusal then explains.
ZERO_LENGTH = pytest.mark.filterwarnings("ignore:Total length of `.*` across ranks is zero")
FEW_WORKERS = pytest.mark.filterwarnings("ignore:The '.*dataloader' does not have many workers")


def sgd(params) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=0.1)


class Module(NetModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return self.optimizer_factory(self.parameters())


def samples(n: int) -> TensorDataset:
    """``n`` samples of (3 features, 1 target)."""
    return TensorDataset(torch.randn(n, 3), torch.randn(n, 1))


def fit(root: Path, loader: DataLoader, **trainer_options: object) -> pl.Trainer:
    """Fit a linear module on ``loader`` for at most 2 steps, checkpointing under ``root``."""
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=2, logger=False, default_root_dir=root, enable_progress_bar=False,
        enable_model_summary=False, **trainer_options,
    )  # fmt: skip
    trainer.fit(Module(nn.Linear(3, 1), sgd), loader)
    return trainer


@ZERO_LENGTH
@FEW_WORKERS
def test_a_training_set_smaller_than_one_batch_is_refused_with_its_numbers(tmp_path: Path):
    with pytest.raises(OptionError) as refused:
        fit(tmp_path, DataLoader(samples(3), batch_size=4, drop_last=True))
    message = str(refused.value)
    for part in ("has 3 samples", "gets 3 per epoch", "its batch of 4", "data.batch_size=4 over 1 device(s)"):
        assert part in message
    assert "drop_last=True" in message and "set data.batch_size to at most 3" in message
    assert not list(tmp_path.rglob("*.ckpt"))


@ZERO_LENGTH
@FEW_WORKERS
def test_an_empty_training_set_is_refused(tmp_path: Path):
    with pytest.raises(OptionError, match="has 0 samples.*To train, train on more data") as refused:
        fit(tmp_path, DataLoader(samples(0), batch_size=4))
    assert "drop_last" not in str(refused.value) and "at most" not in str(refused.value)


@FEW_WORKERS
def test_a_kept_partial_batch_trains(tmp_path: Path):
    trainer = fit(tmp_path, DataLoader(samples(3), batch_size=4, drop_last=False))
    assert trainer.global_step == 2


@FEW_WORKERS
def test_no_training_asked_for_is_not_refused(tmp_path: Path):
    trainer = fit(tmp_path, DataLoader(samples(3), batch_size=4, drop_last=True), limit_train_batches=0)
    assert trainer.state.finished and trainer.global_step == 0
