"""Canary: the private Lightning and jsonargparse names kpca.training uses still exist, with the shape it relies on.

An upgrade that renames or reshapes one of them fails here, with the name and the kpca file that uses it, instead of
deep inside a fit or a refused command. Each entry: (what, where kpca uses it, check).
"""

from __future__ import annotations

import inspect
from argparse import ArgumentError
from pathlib import Path
from typing import Literal

import jsonargparse
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


def _typehint() -> None:
    parser = ArgumentParser()
    parser.add_argument("--x.kind", type=Literal["a", "b"] | None)
    assert parser._option_string_actions["--x.kind"]._typehint == Literal["a", "b"] | None


def _subcommand_parsers() -> None:
    parser, fit = ArgumentParser(), ArgumentParser()
    parser.add_subcommands().add_subcommand("fit", fit)
    assert parser._subcommands_action._name_parser_map["fit"] is fit
    assert fit.parent_parser is parser and fit.subcommand == "fit"


def _parsed_args() -> None:
    parser = ArgumentParser()
    parser.add_argument("--n", type=int)
    parser.parse_args(["--n=1"])
    assert parser.args == ["--n=1"]


def _error_of_a_subcommand() -> None:
    assert _parameters(ArgumentParser.error) == ["self", "message", "ex"]
    parser, fit = ArgumentParser(exit_on_error=False), ArgumentParser(exit_on_error=False)
    fit.add_argument("--n", type=int)
    parser.add_subcommands().add_subcommand("fit", fit)
    try:
        parser.parse_string("fit:\n  m: 1\n")
    except ArgumentError as error:  # error() raises it from the exception it was given (its ``ex``)
        assert error.__cause__.subcommand_parser is fit
    else:
        raise AssertionError("an unknown key of a subcommand was accepted")


PRIVATE_JSONARGPARSE_NAMES = {
    "ActionTypeHint._typehint": ("kpca/training/parser.py reshape: what a bad value should have been", _typehint),
    "ArgumentParser._subcommands_action, parent_parser, subcommand": (
        "kpca/training/parser.py ProjectArgumentParser.error: the subcommand whose options a refusal lists",
        _subcommand_parsers,
    ),
    "ArgumentParser.args": (
        "kpca/training/parser.py ProjectArgumentParser.error: the command line parsed",
        _parsed_args,
    ),
    "error(message, ex) and ex.subcommand_parser": (
        "kpca/training/parser.py ProjectArgumentParser.error: the subcommand parser that refused a config key",
        _error_of_a_subcommand,
    ),
}


JSONARGPARSE_USED_AS = {
    "ActionTypeHint._typehint": '"_typehint"',
    "ArgumentParser._subcommands_action, parent_parser, subcommand": "_name_parser_map",
    "ArgumentParser.args": "root.args",
    "error(message, ex) and ex.subcommand_parser": '"subcommand_parser"',
}


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


PRIVATE = {
    **{name: ("Lightning", *entry) for name, entry in PRIVATE_NAMES.items()},
    **{name: ("jsonargparse", *entry) for name, entry in PRIVATE_JSONARGPARSE_NAMES.items()},
}
"""Every canary: (library, where kpca uses the name, check)."""

PINS = {
    "Lightning": (lightning.__version__, "pin lightning in requirements/constraints.txt"),
    "jsonargparse": (
        jsonargparse.__version__,
        "pin jsonargparse in requirements/constraints.txt and the packages' pyproject.toml",
    ),
}


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_private_name_is_still_there(name):
    library, where, check = PRIVATE[name]
    version, pin = PINS[library]
    try:
        check()
    except (AttributeError, AssertionError, TypeError, KeyError) as error:
        pytest.fail(
            f"{library} {version} changed the private {name} ({type(error).__name__}: {error}); {where} depends on "
            f"it: adapt that code to the new {library}, or {pin}"
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


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_the_named_kpca_file_still_uses_it(name):
    """The canary list stays true: drop an entry when kpca stops using the name."""
    path = SOURCE / PRIVATE[name][1].split(" ")[0]
    used_as = {**USED_AS, **JSONARGPARSE_USED_AS}[name]
    assert used_as in path.read_text(encoding="utf-8"), f"{path} no longer uses {name}; remove it from the list"
