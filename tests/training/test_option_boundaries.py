"""Bad values of options a user types end in one ``error:`` line with exit status 2 before any work: the console
scripts' own path (:func:`kpca.training.errors.run_command` around the app's ``main``), run in this process.

Each case once ended in a traceback (a division by zero, timm's or mmseg's assertion, numpy's seed range) or ran
silently with a value that means nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest

from kpca.language_model.cli import main as lm_main
from kpca.training.errors import run_command
from kpca.vision_cls.cli import main as vision_main
from tests.cli_support import CONFIGS, CPU

LM = ("language-model", lm_main, CONFIGS / "language_model" / "smoke.yaml")
VISION = ("vision-cls", vision_main, CONFIGS / "vision_cls" / "smoke.yaml")


def one_error_line(capsys: pytest.CaptureFixture, app: tuple, tmp_path: Path, option: str) -> str:
    """The one stderr line of ``<app> fit -c cpu.yaml -c smoke.yaml <option>`` run in ``tmp_path``, which must exit
    with status 2 and leave no file there (no run folder)."""
    prog, main, smoke = app
    argv = [prog, "fit", "-c", str(CPU), "-c", str(smoke), option]
    with (
        mock.patch.object(sys, "argv", argv),
        mock.patch.dict("os.environ"),
        pytest.MonkeyPatch.context() as patch,
        pytest.raises(SystemExit) as exit_info,
    ):
        patch.chdir(tmp_path)
        run_command(main)
    error = capsys.readouterr().err
    lines = [line for line in error.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 2 and len(lines) == 1 and "Traceback" not in error, error
    assert not any(tmp_path.iterdir()), "a refused option left files behind"
    return lines[0]


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ("--trainer.accumulate_grad_batches=0", "--trainer.accumulate_grad_batches=0 is out of range"),
        ("--trainer.num_nodes=0", "--trainer.num_nodes=0 is out of range"),
        ("--trainer.val_check_interval=-1", "--trainer.val_check_interval=-1 is out of range"),
        ("--seed_everything=-1", "--seed_everything=-1 is out of range"),
        ("--model.net.init_args.width=0", "width=0 must be 1 or more"),
        ("--model.net.init_args.ffn_dim=0", "ffn_dim=0 must be 1 or more"),
        ("--data.eval_stride=0", "eval_stride=0 must be in [1, context=32]"),
        ("--model.generation.max_new_tokens=-1", "generation.max_new_tokens=-1 must be 1 or more"),
        ("--model.generation.temperature=0", "generation.temperature=0.0 must be above 0"),
    ],
)
def test_language_model_options(capsys: pytest.CaptureFixture, tmp_path: Path, option: str, named: str):
    assert named in one_error_line(capsys, LM, tmp_path, option)


@pytest.mark.mmseg
@pytest.mark.parametrize(
    ("option", "named"),
    [
        ("--model.net.init_args.embed_dim=0", "embed_dim=0 must be 1 or more"),
        ("--model.net.init_args.patch_size=0", "patch_size=0 must be 1 or more"),
        ("--model.net.init_args.num_heads=3", "embed_dim=32 is not divisible by num_heads=3"),
        ("--model.net.init_args.img_size=30", "img_size=30 is not a multiple of patch_size=8"),
        ("--model.net.init_args.drop_path_rate=2", "drop_path_rate=2.0 must be in [0, 1)"),
        ("--model.net.init_args.decoder_dropout=-1", "decoder_dropout=-1.0 must be in [0, 1)"),
        ("--model.net.init_args.decoder_heads=0", "decoder depth, width and heads must be 1 or more"),
        ("--data.crop_size=0", "data.crop_size=0 and data.scale=[192, 48] must be 1 or more"),
        ("--data.scale=[0,48]", "data.scale=[0, 48] must be 1 or more"),
        ("--overlays.num_images=-1", "overlays.num_images=-1 must be 0 (no overlays) or more"),
    ],
)
def test_segmentation_options(capsys: pytest.CaptureFixture, tmp_path: Path, option: str, named: str):
    from kpca.segmentation.cli import main as segmentation_main

    app = ("segmentation", segmentation_main, CONFIGS / "segmentation" / "smoke.yaml")
    assert named in one_error_line(capsys, app, tmp_path, option)


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ("--model.warmup_epochs=-1", "model.warmup_epochs=-1.0 is out of range: it must be >= 0"),
        ("--model.mixup_alpha=-1", "model.mixup_alpha=-1.0 is out of range"),
        ("--model.label_smoothing=2", "model.label_smoothing=2.0 is out of range: it must be in [0, 1)"),
        ("--model.ema_decay=2", "model.ema_decay=2.0 is out of range"),
        ("--model.evaluator.attack_batches=0", "attack_batches must be >= 1"),  # raised inside jsonargparse's build
        ("--model.net.init_args.patch_size=0", "model.net.init_args.patch_size=0 must be 1 or more"),
        ("--data.train.color_jitter=-1", "data.train.color_jitter=-1.0 must be 0 (none) or more"),
        ("--data.train.auto_augment=foo", "data.train.auto_augment='foo' is no timm policy (Unknown AA policy foo)"),
    ],
)
def test_vision_options(capsys: pytest.CaptureFixture, tmp_path: Path, option: str, named: str):
    assert named in one_error_line(capsys, VISION, tmp_path, option)
