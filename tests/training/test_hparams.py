"""The HParams summary: each run's hyper-parameters with its real final metrics, read back from TensorBoard."""

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kpca.training.callbacks import HParamsSummary

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class Module(pl.LightningModule):
    def __init__(self, width: int = 4, kind: str = "rpc") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(width, 2)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", nn.functional.cross_entropy(self.net(batch[0]), batch[1]))

    def test_step(self, batch, batch_idx):
        self.log("test/acc1", (self.net(batch[0]).argmax(1) == batch[1]).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4)


def _hparams(run_dir: str) -> tuple[dict, list[str], EventAccumulator]:
    events = EventAccumulator(run_dir)
    events.Reload()
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    params = {k: v.string_value or v.number_value for k, v in start.session_start_info.hparams.items()}
    return params, [m.name.tag for m in experiment.experiment.metric_infos], events


def _trainer(root: Path) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=2, logger=TensorBoardLogger(root, default_hp_metric=False), accelerator="cpu",
        callbacks=[HParamsSummary(), ModelCheckpoint(monitor="val/loss")], enable_progress_bar=False,
        enable_model_summary=False, log_every_n_steps=1,
    )  # fmt: skip


def test_fit_and_test_runs_write_their_hyperparameters_with_their_final_metrics(tmp_path: Path):
    pl.seed_everything(7)
    trainer = _trainer(tmp_path)
    trainer.fit(Module(), _loader(), _loader())
    params, metrics, events = _hparams(trainer.log_dir)
    assert params["width"] == 4 and params["kind"] == "rpc" and params["seed"] == "7"
    assert sorted(metrics) == ["hparams/best/val/loss", "hparams/val/loss"]
    assert "hp_metric" not in events.Tags()["scalars"]  # no placeholder
    final = events.Scalars("hparams/val/loss")
    assert len(final) == 1 and final[0].step == trainer.global_step == 4
    assert final[0].value == pytest.approx(float(trainer.callback_metrics["val/loss"]))
    best = events.Scalars("hparams/best/val/loss")[0].value
    assert best == pytest.approx(float(trainer.checkpoint_callback.best_model_score))

    tester = _trainer(tmp_path)
    tester.test(Module(), _loader())
    params, metrics, events = _hparams(tester.log_dir)
    assert metrics == ["hparams/test/acc1"] and params["kind"] == "rpc"
    assert events.Scalars("hparams/test/acc1")[0].value == pytest.approx(float(tester.callback_metrics["test/acc1"]))


@pytest.mark.parametrize("trainer_file", sorted((CONFIGS / "trainer").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_trainer_file_turns_off_the_placeholder_hp_metric(trainer_file: Path):
    logger = yaml.safe_load(trainer_file.read_text())["trainer"]["logger"]
    assert logger["init_args"]["default_hp_metric"] is False
