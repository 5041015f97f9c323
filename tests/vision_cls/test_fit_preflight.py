"""``vision-cls fit`` refuses before its first step what would fail there or train nothing, as a user types it.

Refused: an odd per-device batch with Mixup / CutMix (timm's ``Mixup`` asserts an even batch at step 1), a training
set smaller than one batch (Lightning would warn "No training batches" and exit 0 with nothing trained).

The commands run the console script's own path in this process (``vision_cls`` of tests/console_support.py),
which spares each one the seconds of importing Lightning and torch; the DDP one runs as a process, as its two ranks
are processes.
"""

import subprocess
from pathlib import Path

import pytest

from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.input import TrainData
from tests.cli_support import CONFIGS, smoke_options
from tests.console_support import Done, vision_cls, vision_cls_process

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"  # Mixup 0.8 and CutMix 1.0 on the 1437 training digits


def options(root: Path, cache: Path, *extra: object) -> list[object]:
    """``fit`` on the smoke config for at most 2 steps, writing under ``root``."""
    return ["fit", *smoke_options(SMOKE, root, cache, "--trainer.max_steps=2", "--trainer.limit_val_batches=1", *extra)]


def fit(capsys: pytest.CaptureFixture, root: Path, cache: Path, *extra: object) -> Done:
    """``vision-cls fit`` (:func:`options`) as typed in a shell in ``root``, run in this process."""
    return vision_cls(capsys, root, *options(root, cache, *extra))


def refusal(done: Done | subprocess.CompletedProcess, root: Path) -> str:
    """The one-line error of a fit refused before training: exit status 2, no traceback, no checkpoint."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not list(root.rglob("*.ckpt"))
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), done.stderr[-3000:]
    return last


def checkpoints(root: Path) -> list[str]:
    return sorted(path.name for path in root.rglob("*.ckpt"))


def test_an_odd_batch_with_mixup_is_refused_with_the_batch_sizes_that_work(
    capsys: pytest.CaptureFixture, tmp_path: Path, digits_cache_dir: Path
):
    error = refusal(fit(capsys, tmp_path, digits_cache_dir, "--data.batch_size=15"), tmp_path)
    assert "data.batch_size=15 over 1 device(s)" in error and "gives 15 per device" in error
    assert "model.mixup_alpha=0.8, model.cutmix_alpha=1.0" in error
    assert "e.g. 14 or 16" in error and "model.mixup_alpha=0 and model.cutmix_alpha=0" in error


@pytest.mark.slow
def test_an_even_batch_with_mixup_trains_in_the_version_folder_a_refused_start_left_free(
    capsys: pytest.CaptureFixture, tmp_path: Path, digits_cache_dir: Path
):
    refusal(fit(capsys, tmp_path, digits_cache_dir, "--data.batch_size=15"), tmp_path)
    logs = tmp_path / "runs" / "lightning_logs"
    assert not logs.exists()  # refused before anything was built: no version folder taken
    done = fit(capsys, tmp_path, digits_cache_dir, "--data.batch_size=14")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (logs / "version_0" / "checkpoints" / "last.ckpt").is_file()  # the docs' commands assume version_0


@pytest.mark.slow
def test_an_odd_batch_without_mixing_trains(capsys: pytest.CaptureFixture, tmp_path: Path, digits_cache_dir: Path):
    mixing = ("--model.mixup_alpha=0", "--model.cutmix_alpha=0")
    done = fit(capsys, tmp_path, digits_cache_dir, "--data.batch_size=15", *mixing)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "last.ckpt" in checkpoints(tmp_path)


@pytest.mark.slow
def test_an_odd_batch_per_device_under_ddp_is_refused_on_every_rank(tmp_path: Path, digits_cache_dir: Path):
    ddp = ("--data.batch_size=30", "--trainer.devices=2", "--trainer.strategy=ddp")
    two_ranks = vision_cls_process(tmp_path, *options(tmp_path, digits_cache_dir, *ddp))  # DDP: processes
    error = refusal(two_ranks, tmp_path)
    assert "data.batch_size=30 over 2 device(s)" in error and "gives 15 per device" in error
    assert "a multiple of 4" in error and "e.g. 28 or 32" in error


def test_no_partial_batch_reaches_mixup(digits_cache_dir: Path):
    """The check above counts on every training batch having the per-device size: the loader drops the rest."""
    for repeated_aug in (1, 2):
        data = ImageNetDataModule(
            builtin="digits", cache_dir=str(digits_cache_dir), batch_size=14, num_workers=0, image_size=32,
            train=TrainData(repeated_aug=repeated_aug),
        )  # fmt: skip
        data.setup("fit")
        assert data.train_dataloader().drop_last


# Lightning warns of the empty training loader (ResumableLoader, then CombinedLoader) as the optimizer's schedule
# counts its steps, before the refusal; a process shows the warnings on stderr and goes on to the refusal.
@pytest.mark.filterwarnings(r"ignore:Total length of `\w+` across ranks is zero:UserWarning")
def test_a_training_set_smaller_than_one_batch_is_refused(
    capsys: pytest.CaptureFixture, tmp_path: Path, digits_cache_dir: Path
):
    error = refusal(fit(capsys, tmp_path, digits_cache_dir, "--data.batch_size=4096"), tmp_path)
    assert "the training set has 1437 samples" in error and "1 device(s) (devices × nodes) gets 1280 per epoch" in error
    assert "its batch of 4096" in error and "drop_last=True" in error
    assert "set data.batch_size to at most 1280" in error


def test_no_training_asked_for_is_not_refused(capsys: pytest.CaptureFixture, tmp_path: Path, digits_cache_dir: Path):
    done = fit(capsys, tmp_path, digits_cache_dir, "--data.batch_size=4096", "--trainer.limit_train_batches=0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert checkpoints(tmp_path) == []
