"""NetModule's hyper-parameter rule and report folder; atomic checkpoint writes."""

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kpca.training.checkpointing.io import AtomicCheckpointIO
from kpca.training.module import NetModule


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


class Module(NetModule):
    unsaved_hparams = ("evaluator",)

    def __init__(self, net: nn.Module, optimizer=sgd, lr_scale: float = 2.0, evaluator: object = None) -> None:
        super().__init__(net, optimizer)
        self.lr_scale = lr_scale
        self.evaluator = evaluator

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return self.optimizer_factory(self.parameters())


def test_hparams_hold_own_arguments_but_not_net_nor_unsaved():
    net = nn.Linear(3, 1)
    module = Module(net, lr_scale=0.5, evaluator="kept out")
    assert module.hparams["lr_scale"] == 0.5 and module.hparams["optimizer"] is sgd
    assert "net" not in module.hparams and "evaluator" not in module.hparams
    assert module.net is net and module.optimizer_factory is sgd


def test_report_dir_is_the_logger_folder(tmp_path: Path):
    module = Module(nn.Linear(3, 1))
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=1, logger=TensorBoardLogger(tmp_path / "logs", name="run"),
        default_root_dir=tmp_path / "root", enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(module, DataLoader(TensorDataset(torch.randn(4, 3), torch.randn(4, 1)), batch_size=4))
    assert Path(module.report_dir()) == tmp_path / "logs" / "run" / "version_0"


def test_report_dir_without_a_logger_is_the_root(tmp_path: Path):
    module = Module(nn.Linear(3, 1))
    module.trainer = pl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path / "root")
    assert Path(module.report_dir()) == tmp_path / "root"


def test_atomic_checkpoint_io_saves_a_loadable_file(tmp_path: Path):
    checkpoint = {"state_dict": {"w": torch.arange(3.0)}, "global_step": 7}
    path = tmp_path / "sub" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["global_step"] == 7 and torch.equal(loaded["state_dict"]["w"], torch.arange(3.0))
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temporary left behind


def test_atomic_checkpoint_io_rejects_storage_options(tmp_path: Path):
    with pytest.raises(TypeError, match="takes no storage_options"):
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "last.ckpt", storage_options={"x": 1})
    assert not (tmp_path / "last.ckpt").exists()
