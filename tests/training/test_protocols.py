"""The protocol machinery: settings read from saved configs, rules, protocol.json and the HParams summary."""

import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kpca.training.callbacks import HParamsSummary
from kpca.training.results.protocol import (
    WHOLE_TEST_SET,
    ProtocolRule,
    Setting,
    config_entry,
    is_recorded,
    protocol_of,
    read_protocol_file,
    record_protocol,
)
from kpca.training.results.schema import ReportSchema

SAVED = {
    "trainer": {"precision": "bf16-mixed", "limit_test_batches": None, "fast_dev_run": False},
    "model": {
        "evaluator": {
            "class_path": "kpca.vision_cls.evaluation.RobustnessEvaluator",
            "init_args": {"attack_batches": None, "attacks": [{"name": "fgsm", "space": "pixel"}]},
        }
    },
    "data": {"stride": None, "scale": [2048, 512]},
}
"""A config as LightningCLI saves one: class-typed arguments under init_args, lists, recorded nulls."""


def test_config_entries_look_through_init_args_and_lists_and_tell_null_from_absent():
    assert config_entry(SAVED, "model.evaluator.attacks.0.space") == "pixel"
    assert config_entry(SAVED, "model.evaluator.attack_batches") is None
    assert is_recorded(config_entry(SAVED, "model.evaluator.attack_batches"))
    for absent in ("model.evaluator.attacks.1.space", "model.evaluator.attacks.0.steps", "data.crop", "trainer.x.y"):
        assert not is_recorded(config_entry(SAVED, absent)), absent


def test_a_setting_names_its_value_and_the_authors_or_says_it_is_not_recorded():
    assert Setting("data.scale", (2048, 512)).difference(SAVED) is None  # a saved list equals a declared tuple
    assert Setting("model.evaluator.attacks.0.space", "reference", name="space").difference(SAVED) == (
        "space=pixel (published: reference)"
    )
    assert Setting("data.stride", 1, default="context / 2").difference(SAVED) == "stride=context / 2 (published: 1)"
    assert Setting("data.crop", 0.875).difference(SAVED) == "crop not recorded (published: 0.875)"
    precision = Setting("trainer.precision", "32-true", matches=lambda v: v in ("32-true", "bf16-mixed"))
    assert precision.difference(SAVED) is None
    assert [setting.difference(SAVED) for setting in WHOLE_TEST_SET] == [None, None]
    shortened = SAVED | {"trainer": {"limit_test_batches": 1, "fast_dev_run": 2}}  # 1 is one batch, not 100 %
    assert [setting.difference(shortened) for setting in WHOLE_TEST_SET] == [
        "limit_test_batches=1 (published: null (every batch))",
        "fast_dev_run=2 (published: false)",
    ]


def test_a_moved_setting_reads_a_config_saved_before_the_move_at_its_old_key():
    moved = Setting("data.eval.scale", (2048, 512), old_key="data.scale")
    assert moved.difference(SAVED) is None  # SAVED records data.scale only
    assert moved.difference(SAVED | {"data": {"eval": {"scale": [1024, 512]}}}) == (
        "scale=[1024, 512] (published: [2048, 512])"
    )  # the new key wins where it is recorded
    assert moved.difference({"data": {}}) == "scale not recorded (published: [2048, 512])"


RULES = (
    ProtocolRule("clean", r"clean/.+", (Setting("data.scale", (2048, 512)),)),
    ProtocolRule("corrupted", r"corrupted/.+", (Setting("trainer.precision", "32-true"),), fixed=("a proxy",)),
    ProtocolRule("full", r"full/.+", complete_when="full/mCE", incomplete="not every set ran"),
)


def test_a_group_is_published_only_without_any_difference_and_metrics_pick_the_groups():
    protocols = protocol_of(SAVED, RULES)
    assert [(g, p.text, p.comparable_with_published) for g, p in protocols.items()] == [
        ("clean", "published", True),
        ("corrupted", "ours: precision=bf16-mixed (published: 32-true); a proxy", False),
        ("full", "published", True),
    ]
    measured = protocol_of(SAVED, RULES, ["clean/acc1", "full/mean"])
    assert list(measured) == ["clean", "full"] and measured["full"].text == "ours: not every set ran"
    assert protocol_of(SAVED, RULES, ["full/mean", "full/mCE"])["full"].text == "published"
    assert protocol_of(SAVED, lambda config: RULES[:1]) == {"clean": protocols["clean"]}  # rules of a config


def test_rules_refuse_an_empty_group_a_broken_pattern_and_an_unexplained_completeness_metric():
    with pytest.raises(ValueError, match="group is empty"):
        ProtocolRule("", r"clean/.+")
    with pytest.raises(ValueError, match=r"ProtocolRule 'clean': columns 'clean/\(' is not a regular expression"):
        ProtocolRule("clean", r"clean/(")
    with pytest.raises(ValueError, match="also say in incomplete what differs"):
        ProtocolRule("full", r"full/.+", complete_when="full/mCE")


SCHEMA = ReportSchema("report", lambda path: {}, (r"clean/.+", r"corrupted/.+"), protocols=RULES)


def test_a_test_run_records_protocol_json_and_a_markdown_section(tmp_path: Path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(SAVED))
    section = record_protocol(SCHEMA.protocols, tmp_path, ["clean/acc1", "corrupted/acc1"])
    assert json.loads((tmp_path / "protocol.json").read_text()) == {
        "clean": {"protocol": "published", "comparable_with_published": True, "differences": []},
        "corrupted": {
            "protocol": "ours: precision=bf16-mixed (published: 32-true); a proxy",
            "comparable_with_published": False,
            "differences": ["precision=bf16-mixed (published: 32-true)", "a proxy"],
        },
    }
    assert section.startswith("\n## Protocol\n\n") and section.endswith(
        "- `clean`: published\n- `corrupted`: ours: precision=bf16-mixed (published: 32-true); a proxy\n"
    )
    assert read_protocol_file(tmp_path) == {
        "clean": "published",
        "corrupted": "ours: precision=bf16-mixed (published: 32-true); a proxy",
    }
    assert read_protocol_file(tmp_path / "elsewhere") == {}


class Module(pl.LightningModule):
    """Writes ``protocol.json`` where an app's evaluation does: into the log dir, at the end of the test epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def test_step(self, batch, batch_idx):
        self.log("test/acc1", (self.net(batch[0]).argmax(1) == batch[1]).float().mean())

    def on_test_epoch_end(self) -> None:
        Path(self.trainer.log_dir, "config.yaml").write_text(yaml.safe_dump(SAVED))
        record_protocol(SCHEMA.protocols, self.trainer.log_dir, ["clean/acc1"])


def test_the_hparams_summary_of_a_test_run_carries_the_protocol_of_each_group(tmp_path: Path):
    trainer = pl.Trainer(
        logger=TensorBoardLogger(tmp_path, default_hp_metric=False), accelerator="cpu", callbacks=[HParamsSummary()],
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.test(Module(), DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4))
    events = EventAccumulator(trainer.log_dir)
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    params = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert params["protocol/clean"].string_value == "published" and "protocol/corrupted" not in params
