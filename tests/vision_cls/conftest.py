"""Fixtures shared by the vision_cls tests: short fits built once per test run (the digits tree: tests/conftest.py)."""

import shutil
import warnings
from pathlib import Path

import pytest

from tests.cli_support import CONFIGS, run_cli, shared_folder, smoke_options

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"


@pytest.fixture(scope="session")
def one_step_run(tmp_path_factory: pytest.TempPathFactory, digits_cache_dir: Path) -> Path:
    """The run folder (``config.yaml``, ``checkpoints/last.ckpt``) of a one-step smoke fit (RPC, n_iter 2, embed_dim
    32; ``--data.eval.subset=16``), built once per test run for every xdist worker: read it, copy it to change it.

    The fit runs in process, with its own copy of the digits inside the shared folder (the cache_dir it records).
    """

    def build(folder: Path) -> None:
        from kpca.vision_cls.cli import main

        cache = folder / "cache"
        shutil.copytree(digits_cache_dir, cache)
        options = smoke_options(
            SMOKE, folder, cache, "--data.eval.subset=16", "--trainer.max_steps=1", "--trainer.limit_val_batches=1"
        )
        with warnings.catch_warnings():  # the EMA copy stays in eval mode on purpose (timm's ModelEmaV3)
            warnings.filterwarnings("ignore", r"Found \d+ module\(s\) in eval mode")
            run_cli(main, "vision-cls", "fit", *options)

    return shared_folder(tmp_path_factory, "vision-one-step-fit", build) / "runs" / "lightning_logs" / "version_0"


@pytest.fixture(scope="session")
def monitored_run(tmp_path_factory: pytest.TempPathFactory, digits_cache_dir: Path) -> Path:
    """The run folder of a 3-step smoke fit, one validation batch, the kernel-PCA monitor each epoch, logging every
    step: built once per test run for every xdist worker; read it, copy it to change it (``analyze`` writes beside
    the checkpoints). Built in process, with its own copy of the digits inside the shared folder.
    """

    def build(folder: Path) -> None:
        from kpca.vision_cls.cli import main

        cache = folder / "cache"
        shutil.copytree(digits_cache_dir, cache)
        options = smoke_options(
            SMOKE, folder, cache, "--trainer.limit_train_batches=3", "--trainer.log_every_n_steps=1",
            "--trainer.limit_val_batches=1", "--kernel_pca.every_n_epochs=1",
        )  # fmt: skip
        with warnings.catch_warnings():  # the EMA copy stays in eval mode on purpose (timm's ModelEmaV3)
            warnings.filterwarnings("ignore", r"Found \d+ module\(s\) in eval mode")
            run_cli(main, "vision-cls", "fit", *options)

    return shared_folder(tmp_path_factory, "vision-kpca-fit", build) / "runs" / "lightning_logs" / "version_0"
