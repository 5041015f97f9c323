"""The apps print none of the console messages that no user can act on (kpca.training.quiet), and still the others.

The commands run as a user runs them, in a process of their own, so that no pytest warning filter hides or shows
anything: what reaches stderr is what a user would read.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest

from tests.cli_support import CONFIGS, run_cli, run_to_the_end, smoke_options

NOISE = {
    "the litlogger tip": "Tip: For seamless cloud logging",
    "the LeafSpec deprecation": "isinstance(treespec, LeafSpec)",
    "the eval-mode modules": "module(s) in eval mode at the start of training",
    "the moved checkpoint folder": "The dirpath has changed from",
}
"""What kpca.training.quiet silences, each by a part of its text."""
MONITOR_NOT_LOGGED = "`ModelCheckpoint(monitor='val/acc1')` could not find the monitored key"
"""Lightning's warning when a fit ends before any validation logged the monitored metric (here max_steps=2), which
reads as if the module never logged it; the project's checkpoint callback says instead what happened:"""
NOT_VALIDATED_YET = "checkpoint at step 2: no val/acc1 yet (no validation has run), so no best checkpoint is chosen"
WEIGHTS_LOADED = "Loaded model weights from the checkpoint at"
"""Lightning's info line, kept, from the logger that also carries the litlogger tip."""


def noise_in(stderr: str) -> list[str]:
    return [name for name, text in NOISE.items() if text in stderr]


def test_a_vision_fit_and_a_test_of_its_checkpoint_print_no_known_noise_and_keep_the_rest(tmp_path: Path):
    """``vision-cls fit`` (2 steps, so no validation) then ``vision-cls test --ckpt_path`` of its last.ckpt."""
    options = [str(o) for o in smoke_options(CONFIGS / "vision_cls" / "smoke.yaml", tmp_path, tmp_path / "cache")]
    command = [sys.executable, "-m", "kpca.vision_cls"]
    fit = run_to_the_end([*command, "fit", *options, "--trainer.max_steps=2"], tmp_path)
    last = tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    test = run_to_the_end([*command, "test", *options, f"--ckpt_path={last}"], tmp_path)
    assert noise_in(fit.stderr) == [], fit.stderr
    assert noise_in(test.stderr) == [], test.stderr
    assert MONITOR_NOT_LOGGED not in fit.stderr and NOT_VALIDATED_YET in fit.stderr, fit.stderr
    assert fit.stderr.count("no best checkpoint is chosen") == 1  # once, however many save points
    assert WEIGHTS_LOADED in test.stderr and (last.parents[2] / "version_1").is_dir(), test.stderr


class EvalModules(pl.Callback):
    """Records the modules in eval mode at the start of training, where Lightning counts them."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.names = [name for name, module in pl_module.named_modules() if not module.training]


@pytest.mark.parametrize("app", ["vision_cls", "language_model", "segmentation"])
def test_the_only_modules_in_eval_mode_at_fit_start_are_the_ema_copy(app: str, tmp_path: Path):
    """What makes the eval-mode message noise in the apps: it can only mean the vision module's EMA copy."""
    main = importlib.import_module(f"kpca.{app}.cli").main
    options = smoke_options(CONFIGS / app / "smoke.yaml", tmp_path, tmp_path / "cache", "--trainer.fast_dev_run=1")
    probe = f"--trainer.callbacks+={EvalModules.__module__}.EvalModules"
    cli = run_cli(main, app.replace("_", "-"), "fit", *options, probe)
    (recorded,) = [callback for callback in cli.trainer.callbacks if isinstance(callback, EvalModules)]
    assert [name for name in recorded.names if name != "ema.module" and not name.startswith("ema.module.")] == []
    assert bool(recorded.names) == (app == "vision_cls")  # its smoke config keeps an EMA (model.ema_decay)
