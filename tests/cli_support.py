"""What the apps' CLI tests share: the configs folder, running a command as from a shell, smoke-run options."""

import os
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CPU = CONFIGS / "trainer" / "cpu.yaml"
# Expected when a run loads a checkpoint: it logs into a new version folder, so ModelCheckpoint's dirpath moved.
NEW_CHECKPOINT_DIR = pytest.mark.filterwarnings("ignore:The dirpath has changed from")


def run_cli(main: Callable, prog: str, *args: object):
    """``main`` on ``args`` as ``prog`` from a shell; sys.argv is bare (LightningCLI warns when both are given).

    The environment is restored afterwards (Lightning sets variables such as the DDP ones).
    """
    with mock.patch.object(sys, "argv", [prog]), mock.patch.dict(os.environ):
        return main([str(arg) for arg in args])


def smoke_options(smoke: Path, root: Path, cache: Path, *extra: object) -> list[object]:
    """Options of a CPU run of the ``smoke`` YAML writing under ``root``, with its data cached in ``cache``."""
    return [
        "-c", CPU, "-c", smoke, f"--data.cache_dir={cache}", f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root / 'runs'}", "--trainer.enable_progress_bar=false", *extra,
    ]  # fmt: skip
