"""Canary: the private Lightning names kpca.training depends on still exist, with the shape it relies on.

A Lightning upgrade that renames or reshapes one of them fails here, with the name and the kpca file that uses it,
instead of deep inside a fit. Each entry: (what, where kpca uses it, check).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import lightning
import pytest
from jsonargparse import ArgumentParser
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.core.mixins import hparams_mixin
from lightning.pytorch.loops import _FitLoop
from lightning.pytorch.utilities import CombinedLoader


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def _prepare_subcommand_parser() -> None:
    assert _parameters(LightningCLI._prepare_subcommand_parser)[:3] == ["self", "klass", "subcommand"]


def _run_subcommand() -> None:
    assert _parameters(LightningCLI._run_subcommand) == ["self", "subcommand"]
    assert "self._run_subcommand(self.subcommand)" in inspect.getsource(LightningCLI.__init__)


def _cli_parser() -> None:
    assert _parameters(LightningCLI._parser) == ["self", "subcommand"]


def _parse_ckpt_path() -> None:
    assert _parameters(LightningCLI._parse_ckpt_path) == ["self"]
    assert "self._parse_ckpt_path()" in inspect.getsource(LightningCLI.__init__)
    assert "_skip_validation" in inspect.getsource(ArgumentParser.parse_args)  # parse what was typed


def _warn_if_dir_not_empty() -> None:
    assert _parameters(ModelCheckpoint._ModelCheckpoint__warn_if_dir_not_empty) == ["self", "dirpath"]


def _save_topk_checkpoint() -> None:
    assert _parameters(ModelCheckpoint._save_topk_checkpoint) == ["self", "trainer", "monitor_candidates"]


def _last_global_step_saved() -> None:
    assert ModelCheckpoint()._last_global_step_saved == 0
    assert "_last_global_step_saved" in inspect.getsource(ModelCheckpoint._should_skip_saving_checkpoint)


def _val_loop_has_run() -> None:
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    assert trainer.fit_loop.epoch_loop.val_loop._has_run is False
    assert "val_loop._has_run" in inspect.getsource(ModelCheckpoint._save_topk_checkpoint)


def _accelerator_connector() -> None:
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    assert trainer._accelerator_connector.cluster_environment is not None


def _instantiator_hparam() -> None:
    with hparams_mixin._given_hyperparameters_context({"a": 1}, "some.instantiator"):
        assert hparams_mixin._given_hyperparameters.get()["_instantiator"] == "some.instantiator"


def _fit_loop_loader_states() -> None:
    loop = _FitLoop(Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False))
    assert loop._combined_loader_states_to_load == [] and loop._combined_loader is None and loop._data_fetcher is None
    assert "self._combined_loader_states_to_load" in inspect.getsource(_FitLoop._load_combined_loader_states)
    assert _parameters(CombinedLoader._load_state_dicts) == ["self", "states"]


PRIVATE_NAMES = {
    "LightningCLI._prepare_subcommand_parser": (
        "kpca/training/cli.py ProjectCLI: test's verbose default",
        _prepare_subcommand_parser,
    ),
    "LightningCLI._parser": ("kpca/training/cli.py ProjectCLI._resume_automatically: dump the fit config", _cli_parser),
    "LightningCLI._parse_ckpt_path": (
        "kpca/training/cli.py ProjectCLI: --ckpt_path keeps the model options typed (jsonargparse's _skip_validation)",
        _parse_ckpt_path,
    ),
    "LightningCLI._run_subcommand": (
        "kpca/training/cli.py ProjectCLI: check-data runs without a trainer, fit holds its run folder's lock",
        _run_subcommand,
    ),
    "ModelCheckpoint.__warn_if_dir_not_empty": (
        "kpca/training/checkpointing/callback.py Checkpoint: no warning when a run resumes in its own folder",
        _warn_if_dir_not_empty,
    ),
    "ModelCheckpoint._save_topk_checkpoint": (
        "kpca/training/checkpointing/callback.py Checkpoint: last.ckpt follows every save point",
        _save_topk_checkpoint,
    ),
    "ModelCheckpoint._last_global_step_saved": (
        "kpca/training/checkpointing/callback.py Checkpoint: the condition under which Lightning writes last.ckpt",
        _last_global_step_saved,
    ),
    "EvaluationLoop._has_run": (
        "kpca/training/checkpointing/callback.py Checkpoint: a save point before the first validation is quiet",
        _val_loop_has_run,
    ),
    "Trainer._accelerator_connector": (
        "kpca/training/callbacks.py DeferredSlurmRequeue: the SLURM environment and its requeue signal",
        _accelerator_connector,
    ),
    "FitLoop._combined_loader_states_to_load": (
        "kpca/training/checkpointing/restore.py load_pending_loader_states: loader states Lightning leaves unapplied",
        _fit_loop_loader_states,
    ),
    "hparams '_instantiator'": (
        "kpca/training/module.py NetModule and callbacks.py HParamsSummary: the key LightningCLI adds to hparams",
        _instantiator_hparam,
    ),
}


@pytest.mark.parametrize("name", sorted(PRIVATE_NAMES))
def test_private_lightning_name_is_still_there(name):
    where, check = PRIVATE_NAMES[name]
    try:
        check()
    except (AttributeError, AssertionError, TypeError) as error:
        pytest.fail(
            f"Lightning {lightning.__version__} changed the private {name} ({type(error).__name__}: {error}); "
            f"{where} depends on it: adapt that code to the new Lightning, or pin lightning in "
            "requirements/constraints.txt"
        )


SOURCE = Path(__file__).resolve().parents[2] / "packages" / "training" / "src"
USED_AS = {
    "LightningCLI._prepare_subcommand_parser": "_prepare_subcommand_parser",
    "LightningCLI._parser": "._parser(",
    "LightningCLI._parse_ckpt_path": "def _parse_ckpt_path(",
    "LightningCLI._run_subcommand": "def _run_subcommand(",
    "ModelCheckpoint.__warn_if_dir_not_empty": "_ModelCheckpoint__warn_if_dir_not_empty",
    "ModelCheckpoint._save_topk_checkpoint": "_save_topk_checkpoint",
    "ModelCheckpoint._last_global_step_saved": "_last_global_step_saved",
    "EvaluationLoop._has_run": "val_loop._has_run",
    "Trainer._accelerator_connector": "._accelerator_connector",
    "FitLoop._combined_loader_states_to_load": "._combined_loader._load_state_dicts(",
    "hparams '_instantiator'": "_instantiator",
}


@pytest.mark.parametrize("name", sorted(PRIVATE_NAMES))
def test_the_named_kpca_file_still_uses_it(name):
    """The canary list stays true: drop an entry when kpca stops using the name."""
    path = SOURCE / PRIVATE_NAMES[name][0].split(" ")[0]
    assert USED_AS[name] in path.read_text(encoding="utf-8"), f"{path} no longer uses {name}; remove it from the list"
