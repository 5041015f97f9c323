"""What a run typed against what its checkpoint was trained with: the one rule of ``--ckpt_path``.

A command given ``--ckpt_path`` runs the model options the user typed (config files and command line); the
checkpoint's training options (its saved hyper-parameters) fill in only what was not typed
(:func:`typed_over_trained`). Where the two differ the run says so (:func:`option_differences`): in the log, in its
report's protocol provenance, and ``kpca-report`` shows it in the model's label. Options the weights cannot take (a
width, a depth, another architecture) are refused before any work (:func:`check_weights_fit`), naming each option,
both values and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from kpca.attention.spec import KIND_SETTINGS, upgrade_saved_attention
from kpca.training.attention_options import is_attention_group
from kpca.training.errors import OptionError

CLASS_PATH = "class_path"
INIT_ARGS = "init_args"
"""How LightningCLI saves a class-typed option: ``{class_path: ..., init_args: {...}}``."""


class CheckpointOptionsError(OptionError):
    """Model options that the checkpoint's weights cannot take: the message names each option, both values, the fix."""


@dataclass(frozen=True)
class OptionDifference:
    """One model option whose value in this run differs from the checkpoint's training.

    Attributes:
        key: the option as a user types it, e.g. ``model.net.init_args.attention.n_iter``.
        trained: the value the checkpoint was trained with.
        used: the value this run uses.
    """

    key: str
    trained: object
    used: object

    @property
    def text(self) -> str:
        """``<key>=<used> (trained with <trained>)``."""
        return f"{self.key}={_yaml_text(self.used)} (trained with {_yaml_text(self.trained)})"

    @property
    def short(self) -> str:
        """The option's last name and the trained value, e.g. ``n_iter=2`` (for a report's model label)."""
        return f"{self.key.rpartition('.')[2]}={_yaml_text(self.trained)}"


def _yaml_text(value: object) -> str:
    """A value in YAML's spelling (``null``, ``true``, ``[0, 1]``)."""
    return json.dumps(value, default=_json_text).replace('"', "") if not isinstance(value, str) else value


def plain(value: object) -> object:
    """A config value as plain JSON types (tuples as lists, Namespaces as dicts), so that saved and parsed compare.

    A function or class is its import path (``kpca.segmentation.module.segmenter_sgd``), as a config names it and a
    checkpoint saves it.
    """
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    return json.loads(json.dumps(value, default=_json_text))


def _json_text(value: object) -> str:
    """What a config says for a value JSON has no type for: a function's or class's import path, else ``str``."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if callable(value) and isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        return f"{module}.{qualname}"
    return str(value)


def trained_model_options(ckpt_path: str | Path) -> dict:
    """The model options a checkpoint was trained with: its saved hyper-parameters, as LightningCLI reads them.

    Returns:
        The ``model`` section's options (``{}`` when the checkpoint saved none).
    """
    return _saved_options(ckpt_path, "hyper_parameters")


def trained_data_options(ckpt_path: str | Path) -> dict:
    """The data options a checkpoint's DataModule saved (``save_hyperparameters``); ``{}`` when it saved none."""
    return _saved_options(ckpt_path, "datamodule_hyper_parameters")


def _saved_options(ckpt_path: str | Path, key: str) -> dict:
    """A checkpoint's saved hyper-parameters under ``key``, as LightningCLI reads them, attention groups upgraded.

    Attention groups saved before each kind owned its settings are read as today's (see
    :func:`kpca.attention.spec.upgrade_saved_attention`).
    """
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    hparams = dict(checkpoint.get(key) or {})
    hparams.pop("_instantiator", None)
    if "_class_path" in hparams:  # a model given by class path: LightningCLI's dict_kwargs form
        hparams = {CLASS_PATH: hparams.pop("_class_path"), "dict_kwargs": hparams}
    return _upgraded(plain(hparams))


def _upgraded(value: object) -> object:
    """``value`` with each attention group in it upgraded (:func:`kpca.attention.spec.upgrade_saved_attention`)."""
    if is_attention_group(value):
        return upgrade_saved_attention(value)
    if isinstance(value, Mapping):
        return {key: _upgraded(item) for key, item in value.items()}
    return value


def typed_over_trained(trained: Mapping, typed: Mapping) -> dict:
    """The checkpoint's options with every typed one in its place: what a run with ``--ckpt_path`` uses.

    A typed class-typed option naming another ``class_path`` than the trained one replaces it whole (the other
    class's arguments do not apply); the same class merges its ``init_args`` option by option. Likewise a typed
    attention group naming another ``kind`` than the trained one: the trained kind's settings (``n_iter``,
    ``lambd``, ...) do not carry over (those not typed are None: the new kind's defaults), its ``layers`` and
    ``backend`` do unless typed.
    """
    merged = dict(trained)
    for key, value in typed.items():
        old = merged.get(key)
        same_class = isinstance(value, Mapping) and isinstance(old, Mapping)
        if same_class and CLASS_PATH in value and value[CLASS_PATH] != old.get(CLASS_PATH):
            merged[key] = dict(value)
        elif same_class and is_attention_group(old) and "kind" in value and value["kind"] != old["kind"]:
            every_kinds = {name: setting for name, setting in old.items() if name not in (*KIND_SETTINGS, "kind")}
            merged[key] = {**every_kinds, **dict.fromkeys(KIND_SETTINGS), **value}
        elif same_class:
            merged[key] = typed_over_trained(old, value)
        else:
            merged[key] = value
    return merged


def option_differences(trained: Mapping, used: Mapping, prefix: str = "model") -> list[OptionDifference]:
    """The options set in both ``trained`` and ``used`` whose values differ, depth first, keys as users type them.

    An option that only one side records (a link target the saved config leaves out, an argument the checkpoint
    does not save) is not compared.
    """
    differences = []
    for key, trained_value in trained.items():
        if key not in used:
            continue
        used_value, dotted = used[key], f"{prefix}.{key}"
        if isinstance(trained_value, Mapping) and isinstance(used_value, Mapping):
            differences += option_differences(trained_value, used_value, dotted)
        elif plain(trained_value) != plain(used_value):
            differences.append(OptionDifference(dotted, trained_value, used_value))
    return differences


def weight_mismatches(model_state: Mapping[str, torch.Tensor], ckpt_path: str | Path) -> list[str]:
    """The weights of ``model_state`` and the checkpoint's ``state_dict`` that do not match, one text each.

    A weight of one shape in the model and another in the checkpoint, a weight only the checkpoint has and one only
    the model has (both as Lightning's strict loading refuses them).
    """
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    saved = checkpoint.get("state_dict") or {}
    mismatches = [
        f"{name} (checkpoint {list(saved[name].shape)}, model {list(tensor.shape)})"
        for name, tensor in model_state.items()
        if name in saved and saved[name].shape != tensor.shape
    ]
    mismatches += [f"{name} (checkpoint only)" for name in saved if name not in model_state]
    mismatches += [f"{name} (model only)" for name in model_state if name not in saved]
    return mismatches


def check_weights_fit(
    model_state: Mapping[str, torch.Tensor], ckpt_path: str | Path, differences: list[OptionDifference]
) -> None:
    """Refuse options whose model the checkpoint's weights do not fit, naming the options, both values and the fix.

    Only differing options are refused: weights that do not fit the very options they were trained with are left to
    Lightning's loading (e.g. a class count that the data set changes).

    Raises:
        CheckpointOptionsError: when some weights do not fit and some model options differ from the training.
    """
    if not differences:
        return
    mismatches = weight_mismatches(model_state, ckpt_path)
    if not mismatches:
        return
    shown = ", ".join(mismatches[:4]) + (f" and {len(mismatches) - 4} more" if len(mismatches) > 4 else "")
    raise CheckpointOptionsError(
        f"--ckpt_path {ckpt_path} cannot run with these model options: "
        + "; ".join(difference.text for difference in differences)
        + f". Its weights do not fit the model they make: {shown}. Drop these options (or the config file that sets "
        "them) to run the checkpoint as it was trained, or give a checkpoint trained with them."
    )


def run_differences(config: Mapping) -> list[OptionDifference]:
    """The model options of a saved run config that differ from the training of the checkpoint it names.

    Empty when the config names no ``ckpt_path`` or the file is gone (nothing to compare with).
    """
    ckpt_path = config.get("ckpt_path")
    if not isinstance(ckpt_path, str) or not Path(ckpt_path).is_file():
        return []
    return option_differences(trained_model_options(ckpt_path), config.get("model") or {})
