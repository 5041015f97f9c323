"""What the machine must offer a run, checked before anything is built: a GPU for a GPU trainer, a writable folder.

:class:`kpca.training.cli.ProjectCLI` calls :func:`check_machine` on the parsed config of every subcommand that
builds a trainer. Each refusal is a :class:`~kpca.training.errors.MachineError` (exit status 4) naming the setting
and the fix; nothing is created on the way (the folder check writes one temporary file and removes it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from kpca.training.cache_folder import CACHE_FIX, cache_folder_source
from kpca.training.errors import MachineError, OptionError

GPU_ACCELERATORS = ("gpu", "cuda")
CPU_TRAINER = "configs/trainer/cpu.yaml"


def check_accelerator(accelerator: object) -> None:
    """Refuse a GPU accelerator on a machine where torch sees no CUDA GPU, naming the CPU trainer file."""
    if not (isinstance(accelerator, str) and accelerator.lower() in GPU_ACCELERATORS):
        return
    if torch.cuda.is_available():
        return
    raise MachineError(
        f"trainer.accelerator={accelerator} needs a CUDA GPU, and torch sees none on this machine "
        f"(torch.cuda.is_available() is False, torch {torch.__version__}). To run on the CPU give -c {CPU_TRAINER} in "
        "place of the GPU trainer file (or --trainer.accelerator=cpu --trainer.devices=1 --trainer.precision=32-true); "
        "on a GPU node, check that nvidia-smi lists the GPU and that this torch is a CUDA build."
    )


FLOAT16_PRECISIONS = ("16-mixed", "16", "16-true")


def check_precision(accelerator: object, precision: object) -> None:
    """Refuse float16 precision for a run on the CPU.

    Lightning would run bfloat16 there instead, while the config and every report record float16.
    """
    if str(precision) not in FLOAT16_PRECISIONS:
        return
    name = str(accelerator).lower() if accelerator is not None else "auto"
    on_cpu = name == "cpu" or (name == "auto" and not torch.cuda.is_available())
    if on_cpu:
        raise MachineError(
            f"trainer.precision={precision} is float16 on a CUDA GPU, and this run is on the CPU "
            f"(trainer.accelerator={accelerator}), where Lightning would run bfloat16 while the records say "
            f"{precision}; use --trainer.precision=bf16-mixed or 32-true on the CPU."
        )


def nearest_existing(folder: Path) -> Path:
    """``folder`` or its nearest ancestor that exists (where creating ``folder`` starts)."""
    folder = folder.absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_writable(folder: Path, option: str) -> None:
    """Refuse a run folder that cannot be created or written (read-only, full, a file in its path), naming ``option``.

    The check writes one temporary file into ``folder`` or, when ``folder`` does not exist yet, into its nearest
    existing ancestor, and removes it: a refusal leaves nothing behind.
    """
    existing = nearest_existing(Path(folder))
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(existing))
        with tempfile.TemporaryFile(dir=existing, prefix=".kpca-write-check-"):
            pass
    except OSError as error:
        raise MachineError(
            f"cannot write the run folder {folder} ({option}): {error.strerror or error} ({existing}). Choose a "
            f"folder on a writable disk with space: --{option}=<folder>."
        ) from None


def check_cache_folder(cache_dir: str | Path | None) -> None:
    """Refuse a cache folder (``data.cache_dir``, ``$KPCA_CACHE``) that cannot hold generated data, naming the setting.

    A file in its path is refused (an option error); so is a folder that does not exist and cannot be created (its
    nearest existing folder is not writable: a machine error). An existing folder is accepted even when read-only:
    the data may already be there (a shared cache), and a write it still needs names the same fix.
    """
    folder, source = cache_folder_source(cache_dir)
    existing = nearest_existing(folder)
    if not existing.is_dir():
        raise OptionError(f"{source} cannot be the cache folder: {existing} is a file, not a folder; {CACHE_FIX}.")
    if existing != folder.absolute() and not os.access(existing, os.W_OK | os.X_OK):
        raise MachineError(
            f"{source}: cannot create the cache folder {folder}: {existing} is not writable; {CACHE_FIX}."
        )


def check_machine(trainer_config) -> None:
    """Check a parsed ``trainer`` section: its accelerator, and the folders its logger and its root write into."""
    check_accelerator(trainer_config.get("accelerator"))
    check_precision(trainer_config.get("accelerator"), trainer_config.get("precision"))
    logger = trainer_config.get("logger")
    init_args = getattr(logger, "init_args", None)
    save_dir = init_args.get("save_dir") if init_args is not None else None
    if save_dir:
        check_writable(Path(save_dir), "trainer.logger.init_args.save_dir")
    if trainer_config.get("default_root_dir"):
        check_writable(Path(trainer_config.default_root_dir), "trainer.default_root_dir")
