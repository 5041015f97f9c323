"""Resume by rerunning the same command: find the newest readable checkpoint of this experiment.

An experiment is a run folder ``<save_dir>/<name>/version_<k>`` of the TensorBoard (or CSV) logger whose
saved ``config.yaml`` equals the current command's configuration (but for ``ckpt_path`` and the logger's
``version`` / ``purge_step``, which resuming sets). Its candidates are the ``*.ckpt`` files of its
``checkpoints/`` folder and Lightning's SLURM ``hpc_ckpt_<n>.ckpt`` files in ``default_root_dir`` that
name it as their run folder (every checkpoint records it, see :func:`record_run_folder`). The newest
candidate that reads as a complete ``torch.save`` file wins; damaged ones are skipped and named.
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kpca.attention.errors import OptionError

logger = logging.getLogger(__name__)

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


def check_checkpoint(path: str | Path) -> None:
    """Raise ValueError naming ``path``, what is wrong with it and what to do, unless it is a complete checkpoint."""
    problem = checkpoint_problem(path)
    if problem is not None:
        raise OptionError(
            f"ckpt_path={str(path)!r} cannot be resumed from: {problem}. A node that died while copying it "
            "leaves such a file. Pass another checkpoint, or --ckpt_path auto to resume from the newest readable "
            "checkpoint of this experiment (damaged ones are skipped); move the damaged file away to keep it."
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
