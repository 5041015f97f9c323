"""Which app wrote a checkpoint: every checkpoint records it, and an app refuses another app's checkpoint by name.

An app is a package ``kpca.<app>`` with a LightningModule (``kpca.vision_cls``, ``kpca.language_model``,
``kpca.segmentation``); its command is the console script that runs ``kpca.<app>.cli`` (``vision-cls``), or
``python -m kpca.<app>`` without one. Checkpoints written before the record existed are recognised by the
``class_path`` of the network in their hyper-parameters (``kpca.language_model.model.CausalTransformerLM``).
"""

from __future__ import annotations

import functools
import pickle
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import torch

from kpca.training.checkpointing.resume import checkpoint_problem
from kpca.training.errors import OptionError

ORIGIN_KEY = "kpca"
"""Checkpoint key holding ``{"app": <app>, "version": <its distribution's version>}``."""
SHARED_PACKAGES = ("training", "attention")
"""The ``kpca`` packages that are not apps (every app uses them)."""


def app_of(module_class: type) -> str | None:
    """The app a LightningModule class belongs to (``vision_cls`` for ``kpca.vision_cls.module...``), else None."""
    parts = module_class.__module__.split(".")
    if len(parts) < 3 or parts[0] != "kpca" or parts[1] in SHARED_PACKAGES:
        return None
    return parts[1]


@functools.cache
def _console_script(app: str) -> EntryPoint | None:
    """The installed console script that runs ``kpca.<app>.cli``, or None."""
    for script in entry_points(group="console_scripts"):
        if script.value.split(":")[0] == f"kpca.{app}.cli":
            return script
    return None


def app_command(app: str) -> str:
    """The shell command of ``app``: its console script (``vision-cls``), or ``python -m kpca.<app>`` without one."""
    script = _console_script(app)
    return script.name if script is not None else f"python -m kpca.{app}"


def app_version(app: str) -> str | None:
    """The installed version of the distribution that provides ``app``'s command, or None when unknown."""
    script = _console_script(app)
    return script.dist.version if script is not None and script.dist is not None else None


def record_origin(checkpoint: dict, module_class: type) -> None:
    """Store the app of ``module_class`` and its version in ``checkpoint`` (nothing for a module of no app)."""
    app = app_of(module_class)
    if app is not None:
        checkpoint[ORIGIN_KEY] = {"app": app, "version": app_version(app)}


def _app_in_hparams(value: Any) -> str | None:
    """The first ``kpca.<app>`` named by a ``class_path`` in saved hyper-parameters (nested dicts and lists)."""
    if isinstance(value, dict):
        for key in ("class_path", "_class_path"):
            path = value.get(key)
            if isinstance(path, str) and path.startswith("kpca.") and path.count(".") >= 2:
                app = path.split(".")[1]
                if app not in SHARED_PACKAGES:
                    return app
        children = value.values()
    elif isinstance(value, (list, tuple)):
        children = value
    else:
        return None
    for child in children:
        app = _app_in_hparams(child)
        if app is not None:
            return app
    return None


def written_by(path: str | Path) -> str | None:
    """The app that wrote the checkpoint at ``path``: its record, else the app its hyper-parameters name, else None.

    None also for a file that is not a complete checkpoint or holds pickled classes (whatever reads it next says so).
    Memory-mapped: the tensors are not read.
    """
    if checkpoint_problem(path) is not None:
        return None
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        return None
    if not isinstance(checkpoint, dict):
        return None
    origin = checkpoint.get(ORIGIN_KEY)
    if isinstance(origin, dict) and isinstance(origin.get("app"), str):
        return origin["app"]
    return _app_in_hparams(checkpoint.get("hyper_parameters"))


def check_origin(path: str | Path, app: str | None, subcommand: str) -> None:
    """Raise ValueError when the checkpoint at ``path`` was written by another app than ``app``, naming both commands.

    Checkpoints of unknown origin pass (older files without the record and hyper-parameters, other tools' files).

    Args:
        path: the ``--ckpt_path`` of a command.
        app: the app running the command (None: no check).
        subcommand: the command's subcommand, repeated in the advice (``test``).
    """
    writer = written_by(path)
    if app is None or writer is None or writer == app:
        return
    theirs, ours = app_command(writer), app_command(app)
    raise OptionError(
        f"ckpt_path={str(path)!r} is a checkpoint of the {writer} app ({theirs}), not of {app}: `{ours} {subcommand}` "
        f"cannot load it. Run `{theirs} {subcommand} -c <the configs it was trained with> --ckpt_path {path}`, or pass "
        f"a checkpoint written by {ours}."
    )
