"""Which checkpoint a resumed ``fit`` continues: the newest readable checkpoint of this experiment.

``fit --ckpt_path auto`` (or ``last``) is resolved here (:func:`resolve_auto_resume`); what a checkpoint restores
beyond Lightning's own state (RNG states, the loaders' positions) is :mod:`kpca.training.checkpointing.restore`.

An experiment is a run folder ``<save_dir>/<name>/version_<k>`` of the TensorBoard (or CSV) logger whose
saved ``config.yaml`` equals the current command's configuration (but for ``ckpt_path`` and the logger's
``version`` / ``purge_step``, which resuming sets). Its candidates are the ``*.ckpt`` files of its
``checkpoints/`` folder and Lightning's SLURM ``hpc_ckpt_<n>.ckpt`` files in ``default_root_dir`` that
name it as their run folder (every checkpoint records it, see :func:`record_run_folder`). The newest
candidate that reads as a complete ``torch.save`` file wins; damaged ones are skipped and named.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from kpca.training.attention_options import comparable_attention
from kpca.training.errors import OptionError
from kpca.training.moved_options import move_options
from kpca.training.run_config import without_keys

logger = logging.getLogger(__name__)

RUN_LOGGERS = ("TensorBoardLogger", "CSVLogger")
"""The loggers whose run folders (``<save_dir>/<name>/version_<k>``) automatic resume searches."""
RESUME_IGNORED_KEYS = (
    "ckpt_path", "config", "trainer.logger.init_args.version", "trainer.logger.init_args.purge_step", "model.compile",
)  # fmt: skip
"""Config keys that resuming itself sets, and ``model.compile`` (it changes how the network runs, not what it is): a
saved run whose config differs only in these is this experiment."""
RUN_FOLDER_KEY = "kpca_run_folder"
"""Checkpoint key holding the run folder (the logger's ``log_dir``) that wrote the checkpoint."""


def checkpoint_problem(path: str | Path) -> str | None:
    """None when ``path`` is a complete ``torch.save`` file, else why not (missing, empty, truncated, ...).

    ``torch.save`` writes a zip archive whose directory sits at the end of the file, so a truncated or
    half-copied file is recognised without reading its tensors.
    """
    path = Path(path)
    if path.is_dir():
        return "it is a folder, not a checkpoint file"
    if not path.is_file():
        return "it does not exist"
    if path.stat().st_size == 0:
        return "it is empty (0 bytes)"
    try:
        with zipfile.ZipFile(path) as archive:
            if not any(name.endswith("data.pkl") for name in archive.namelist()):
                return "it is a zip file but not a torch.save checkpoint"
    except (zipfile.BadZipFile, OSError) as error:
        return f"it is truncated or not a checkpoint ({error})"
    return None


def check_checkpoint(path: str | Path, subcommand: str = "fit") -> None:
    """Raise ValueError naming ``path``, what is wrong with it and what to do, unless it is a complete checkpoint.

    Args:
        path: the ``--ckpt_path`` given.
        subcommand: the command it was given to: ``fit`` resumes from it, the others read its weights.
    """
    problem = checkpoint_problem(path)
    if problem is None:
        return
    if subcommand == "fit":
        raise OptionError(
            f"ckpt_path={str(path)!r} cannot be resumed from: {problem}. A node that died while copying it "
            "leaves such a file. Pass another checkpoint, or --ckpt_path auto to resume from the newest readable "
            "checkpoint of this experiment (damaged ones are skipped); move the damaged file away to keep it."
        )
    raise OptionError(
        f"{subcommand} cannot read ckpt_path={str(path)!r}: {problem}. Pass a checkpoint file that fit wrote "
        "(a .ckpt in its run folder's checkpoints/, e.g. runs/lightning_logs/version_0/checkpoints/last.ckpt)."
    )


def read_step(path: str | Path) -> tuple[int, str | None]:
    """``(global_step, run folder or None)`` of a checkpoint, memory-mapped (the tensors are not read)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return int(checkpoint["global_step"]), checkpoint.get(RUN_FOLDER_KEY)


def record_run_folder(checkpoint: dict, run_folder: str | None) -> None:
    """Store the run folder that writes ``checkpoint``, so that automatic resume can tell its experiment."""
    if run_folder is not None:
        checkpoint[RUN_FOLDER_KEY] = str(Path(run_folder).resolve())


@dataclass
class Resume:
    """The outcome of :func:`find_resume`.

    Attributes:
        checkpoint: the checkpoint to resume from, or None to start fresh.
        run_folder: its run folder (``.../version_<k>``), where logs and checkpoints continue.
        step: its global step (TensorBoard events from this step on are purged from the old event files).
        skipped: ``(path, reason)`` of newer candidates that were passed over (damaged, another experiment).
    """

    checkpoint: Path | None = None
    run_folder: Path | None = None
    step: int = 0
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def find_resume(
    experiment_dir: Path, hpc_dir: Path, same_config: Callable[[Path], bool], versions: str = "version_*"
) -> Resume:
    """The newest readable checkpoint of this experiment under ``experiment_dir`` (``<save_dir>/<name>``).

    Args:
        experiment_dir: the folder holding the logger's ``version_<k>`` run folders.
        hpc_dir: the trainer's ``default_root_dir``, where Lightning writes SLURM ``hpc_ckpt_<n>.ckpt`` files.
        same_config: whether a run folder's saved ``config.yaml`` is this command's configuration.
        versions: glob of the run folders to consider (one folder when the logger's version is fixed).
    """
    folders = [folder for folder in experiment_dir.glob(versions) if folder.is_dir()]
    matching = {folder.resolve() for folder in folders if same_config(folder)}
    candidates = [p for folder in matching for p in (folder / "checkpoints").glob("*.ckpt")]
    candidates += list(hpc_dir.glob("hpc_ckpt_*.ckpt"))
    # newest first; at equal times last.ckpt, which ModelCheckpoint writes after the best-k file
    candidates.sort(key=lambda p: (p.stat().st_mtime_ns, p.name == "last.ckpt"), reverse=True)
    resume = Resume()
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is not None:
            resume.skipped.append((path, problem))
            continue
        step, recorded = read_step(path)
        run_folder = path.parent.parent.resolve() if path.parent.name == "checkpoints" else None
        if run_folder is None:
            run_folder = Path(recorded).resolve() if recorded else None
            if run_folder not in matching:
                resume.skipped.append((path, "written by another experiment or run folder"))
                continue
        resume.checkpoint, resume.run_folder, resume.step = path, run_folder, step
        break
    return resume


@dataclass
class AutoResume:
    """What ``fit --ckpt_path auto`` resolved to.

    Attributes:
        resume: the checkpoint found (its run folder and step), or none: start fresh.
        experiment_dir: the logger's ``<save_dir>/<name>`` folder that was searched.
        lock: the experiment's lock file (its configuration's digest), which the fit holds so that an identical
            command refuses even before the first checkpoint.
    """

    resume: Resume
    experiment_dir: Path
    lock: Path


def comparable(config: dict) -> dict:
    """A configuration without the keys that resuming itself sets (:data:`RESUME_IGNORED_KEYS`).

    Its attention groups are in the one form that a config saved before each kind owned its settings shares with one
    saved now (:func:`kpca.training.attention_options.comparable_attention`), so a run started before resumes.
    """
    return comparable_attention(without_keys(config, RESUME_IGNORED_KEYS))


def saved_config_is(path: Path, current: dict, moved: Mapping[str, str] | None = None) -> bool:
    """Whether the ``config.yaml`` a run saved at ``path`` is ``current`` (a :func:`comparable` config).

    Data options saved under a spelling that has since moved (``moved``, the datamodule's ``moved_options``) are
    compared at their new place, so a run saved before the move resumes.
    """
    if not path.is_file():
        return False
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return False
    if not isinstance(saved, dict):
        return False
    if moved and isinstance(saved.get("data"), Mapping):
        saved = {**saved, "data": move_options(saved["data"], moved, str(path))[0]}
    return comparable(saved) == current


def resolve_auto_resume(config, dumped: dict, moved: Mapping[str, str] | None = None) -> AutoResume:
    """Which checkpoint ``fit --ckpt_path auto`` continues: the newest readable one of this same experiment.

    Args:
        config: the parsed ``fit`` config (its ``trainer``, ``checkpoint`` and ``ckpt_path``).
        dumped: the same config as the plain dict LightningCLI saves as ``config.yaml``.
        moved: the datamodule's moved data options (``{old: new}``), for run folders saved before a move.

    Raises:
        OptionError: without a TensorBoard or CSV logger, with ``checkpoint.dirpath`` set, or, under SLURM, when
            this experiment has no checkpoint but ``default_root_dir`` holds another run's ``hpc_ckpt_*.ckpt``.
    """
    run_logger = config.trainer.logger
    if not (hasattr(run_logger, "class_path") and run_logger.class_path.rsplit(".", 1)[-1] in RUN_LOGGERS):
        raise OptionError(
            f"--ckpt_path {config.ckpt_path} finds the run folders of one TensorBoardLogger or CSVLogger, got "
            f"trainer.logger={run_logger!r}; set one (configs/trainer/*.yaml do) or pass a checkpoint file."
        )
    if config.checkpoint.dirpath is not None:
        raise OptionError(
            f"--ckpt_path {config.ckpt_path} looks in the run folders' checkpoints/, but checkpoint.dirpath="
            f"{config.checkpoint.dirpath!r} puts them elsewhere; unset it or pass a checkpoint file."
        )
    init = run_logger.init_args
    experiment_dir = Path(init.save_dir) / (init.name or "")
    hpc_dir = Path(config.trainer.default_root_dir or os.getcwd())
    current = comparable(dumped)
    resume = find_resume(
        experiment_dir,
        hpc_dir,
        lambda folder: saved_config_is(folder / "config.yaml", current, moved),
        versions=version_glob(init.version),
    )
    # Lightning is imported here, where a fit resolves its resume, not with this module: `kpca-experiment status`
    # reads checkpoints through it and needs torch alone.
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    if resume.checkpoint is None and SLURMEnvironment.detect() and any(hpc_dir.glob("hpc_ckpt_*.ckpt")):
        # Lightning restores the newest hpc_ckpt_* of default_root_dir under SLURM whenever ckpt_path is None.
        raise OptionError(
            f"--ckpt_path {config.ckpt_path}: this experiment has no checkpoint, but trainer.default_root_dir="
            f"{str(hpc_dir)!r} holds SLURM hpc_ckpt_*.ckpt files of another run, which Lightning would restore "
            "under SLURM. Give each experiment its own --trainer.default_root_dir (e.g. runs/<experiment>)."
        )
    return AutoResume(resume, experiment_dir, experiment_dir / f"fit-{_digest(current)}.lock")


def version_glob(version: int | str | None) -> str:
    """The run folders a logger ``version`` allows: all ``version_*`` when unset, else its one folder."""
    if version is None:
        return "version_*"
    return f"version_{version}" if isinstance(version, int) else str(version)


def _digest(config: dict) -> str:
    """A short stable digest of a configuration (its lock file's name)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
