"""Checkpoints name the app that wrote them, and another app's command refuses them with that app's command."""

from pathlib import Path

import pytest
import torch

from kpca.language_model.cli import main as language_model_main
from kpca.training.checkpointing.origin import (
    ORIGIN_KEY,
    app_command,
    app_of,
    app_version,
    check_origin,
    written_by,
)
from kpca.training.module import NetModule
from kpca.vision_cls.cli import main as vision_main
from kpca.vision_cls.module import ClassificationModule
from tests.cli_support import CONFIGS, run_cli, smoke_options

VISION_SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
LM_SMOKE = CONFIGS / "language_model" / "smoke.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict", "analyze")
# The vision module keeps its EMA copy of the network in eval mode on purpose; Lightning warns about it at fit start.
pytestmark = pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")


def checkpoint_of_a_tiny_fit(main, prog: str, smoke: Path, root: Path) -> Path:
    """A real run of the app's smoke config (one step), saved by Lightning's ``Trainer.save_checkpoint``."""
    cli = run_cli(main, prog, "fit", *smoke_options(smoke, root, root / "cache", "--trainer.fast_dev_run=1"))
    path = root / f"{prog}.ckpt"
    cli.trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory) -> Path:
    return checkpoint_of_a_tiny_fit(language_model_main, "language-model", LM_SMOKE, tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def vision_checkpoint(tmp_path_factory) -> Path:
    return checkpoint_of_a_tiny_fit(vision_main, "vision-cls", VISION_SMOKE, tmp_path_factory.mktemp("vision"))


def without_the_record(path: Path, out: Path) -> Path:
    """The checkpoint as written before checkpoints recorded their app."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    del checkpoint[ORIGIN_KEY]
    torch.save(checkpoint, out)
    return out


def vision_options(tmp_path: Path) -> list[object]:
    return smoke_options(VISION_SMOKE, tmp_path, tmp_path / "cache")


def test_the_app_is_the_package_of_the_module_class():
    assert app_of(ClassificationModule) == "vision_cls"
    assert app_of(NetModule) is None  # kpca.training is shared, not an app
    assert app_of(torch.nn.Linear) is None
    assert app_command("vision_cls") == "vision-cls" and app_command("language_model") == "language-model"
    assert app_command("no_such_app") == "python -m kpca.no_such_app"
    assert app_version("vision_cls") and app_version("no_such_app") is None


def test_checkpoints_record_the_app_and_its_version(lm_checkpoint: Path, vision_checkpoint: Path):
    lm = torch.load(lm_checkpoint, map_location="cpu", weights_only=True)
    assert lm[ORIGIN_KEY] == {"app": "language_model", "version": app_version("language_model")}
    assert written_by(lm_checkpoint) == "language_model"
    assert written_by(vision_checkpoint) == "vision_cls"


@pytest.mark.parametrize("subcommand", SUBCOMMANDS)
def test_the_vision_command_refuses_a_language_model_checkpoint_naming_its_command(
    subcommand: str, lm_checkpoint: Path, tmp_path: Path, capsys
):
    with pytest.raises(ValueError, match="checkpoint of the language_model app") as error:
        run_cli(vision_main, "vision-cls", subcommand, *vision_options(tmp_path), "--ckpt_path", lm_checkpoint)
    message = str(error.value)
    assert str(lm_checkpoint) in message
    assert f"Run `language-model {subcommand} -c <the configs it was trained with> --ckpt_path" in message
    assert "Parsing of ckpt_path hyperparameters failed" not in capsys.readouterr().err  # before LightningCLI's dump


def test_the_language_model_command_refuses_a_vision_checkpoint(vision_checkpoint: Path, tmp_path: Path):
    options = smoke_options(LM_SMOKE, tmp_path, tmp_path / "cache")
    with pytest.raises(ValueError, match="checkpoint of the vision_cls app") as error:
        run_cli(language_model_main, "language-model", "test", *options, "--ckpt_path", vision_checkpoint)
    assert "Run `vision-cls test" in str(error.value)


def test_an_old_checkpoint_is_recognised_by_its_network_class_path(lm_checkpoint: Path, tmp_path: Path):
    old = without_the_record(lm_checkpoint, tmp_path / "old.ckpt")
    assert written_by(old) == "language_model"
    with pytest.raises(ValueError, match="Run `language-model test"):
        run_cli(vision_main, "vision-cls", "test", *vision_options(tmp_path), "--ckpt_path", old)


def test_a_checkpoint_of_unknown_origin_passes(tmp_path: Path):
    bare = tmp_path / "bare.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "hyper_parameters": {"lr": 0.1}}, bare)
    assert written_by(bare) is None
    check_origin(bare, "vision_cls", "test")
    half = tmp_path / "half.ckpt"
    half.write_bytes(bare.read_bytes()[:20])
    assert written_by(half) is None  # damaged: whatever reads it next says so


def test_the_own_app_checkpoint_passes(vision_checkpoint: Path, lm_checkpoint: Path):
    check_origin(vision_checkpoint, "vision_cls", "test")
    check_origin(lm_checkpoint, "language_model", "predict")
    check_origin(lm_checkpoint, None, "test")  # a command of no app checks nothing
