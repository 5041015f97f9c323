"""The data.train group: its options and checks, its YAML and command-line spelling, and runs saved before it.

Commands run in this process (the console script's own path: ``vision_cls`` of tests/console_support.py),
which spares each one the seconds of importing Lightning and torch, except the test named for the console script,
which runs ``python -m kpca.vision_cls`` as a process.
"""

import inspect
import sys
from pathlib import Path

import pytest
import torch
import yaml

from kpca.vision_cls.cli import console_main, main
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.input import TrainData
from tests.cli_support import CONFIGS, CPU, printed_config, refusal, run_to_the_end, smoke_options
from tests.console_support import vision_cls
from tests.vision_cls.data_support import reloaded_datamodule

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"  # data.train: auto_augment DeiT's, re_prob 0.25, repeated_aug 2
FLAT = ("input", "augment_on", "scale", "hflip", "auto_augment", "color_jitter", "re_prob", "re_mode", "repeated_aug")
FLAT += ("bad_files", "max_bad_fraction")


def test_the_options_are_checked_when_given():
    for options, match in [
        ({"re_prob": 1.5}, r"^data.train.re_prob=1.5 must be a probability in \[0, 1\]"),
        ({"hflip": -0.1}, r"^data.train.hflip=-0.1 must be a probability"),
        ({"scale": (0.5, 0.2)}, r"^data.train.scale=\(0.5, 0.2\) must satisfy 0 < low <= high <= 1"),
        ({"repeated_aug": 0}, r"^data.train.repeated_aug=0 must be at least 1"),
        ({"re_mode": "zero"}, r"^data.train.re_mode='zero' is not one of 'pixel', 'rand', 'const'"),
        ({"bad_files": "ignore"}, r"^data.train.bad_files='ignore' is not one of 'error', 'skip'"),
        ({"max_bad_fraction": 2.0}, r"^data.train.max_bad_fraction=2.0 must be a fraction in \[0, 1\]"),
        ({"input": "pil"}, r"^data.train.input='pil' is not one of 'turbo', 'timm', 'dali'"),
        ({"input": "dali", "bad_files": "skip"}, r"^data.train.bad_files=skip needs DataLoader workers"),
    ]:
        with pytest.raises(ValueError, match=match):
            TrainData(**options)


def test_the_defaults_are_deits():
    assert TrainData() == TrainData(
        input="turbo", augment_on="device", scale=(0.08, 1.0), hflip=0.5, auto_augment="rand-m9-mstd0.5-inc1",
        color_jitter=0.3, re_prob=0.25, re_mode="pixel", repeated_aug=3, bad_files="error", max_bad_fraction=0.001,
    )  # fmt: skip
    assert tuple(ImageNetDataModule.moved_options) == FLAT
    assert set(ImageNetDataModule.moved_options.values()) == {f"train.{name}" for name in FLAT}


def test_a_list_from_python_is_kept_as_a_tuple():
    options = TrainData(scale=[0.5, 1.0])
    assert options == TrainData(scale=(0.5, 1.0)) and hash(options)


def test_the_datamodule_init_stays_short():
    lines, _ = inspect.getsourcelines(ImageNetDataModule.__init__)
    assert len(lines) <= 40, f"ImageNetDataModule.__init__ has {len(lines)} lines"


def test_the_group_parses_from_yaml_and_the_command_line(capsys: pytest.CaptureFixture, tmp_path: Path):
    config = printed_config(capsys, main, "vision-cls", "-c", CPU, "-c", SMOKE, "--data.train.re_prob=0.1")
    train = config["data"]["train"]
    assert (train["re_prob"], train["repeated_aug"], train["auto_augment"]) == (0.1, 2, "rand-m9-mstd0.5-inc1")
    datamodule = reloaded_datamodule(capsys, config, tmp_path)
    assert datamodule.train == TrainData(re_prob=0.1, repeated_aug=2)
    assert datamodule.train_input.train is datamodule.train


def test_a_bad_value_is_one_error_line_naming_the_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    argv = ["vision-cls", "fit", "-c", str(CPU), "-c", str(SMOKE), "--data.train.re_prob=2"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        console_main()
    error = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert [line for line in error.splitlines() if line.startswith("error:") or "Traceback" in line] == [
        "error: data.train.re_prob=2.0 must be a probability in [0, 1]; 0 disables random erasing."
    ]


def test_an_old_spelling_on_the_command_line_is_refused_naming_the_new_one(capsys: pytest.CaptureFixture):
    error = refusal(capsys, main, "vision-cls", "test", "-c", CPU, "-c", SMOKE, "--data.re_prob=0")
    assert "unrecognized arguments: --data.re_prob=0" in error and "did you mean --data.train.re_prob?" in error


def flat_config(config: dict) -> dict:
    """``config`` as a run saved it before the group: the ``data.train`` options flat under ``data``."""
    data = dict(config["data"])
    return {**config, "data": {**data.pop("train"), **data}}


def test_a_config_file_with_the_old_spelling_loads_at_the_new_place(capsys: pytest.CaptureFixture, tmp_path: Path):
    config = printed_config(capsys, main, "vision-cls", "-c", CPU, "-c", SMOKE, "--data.train.re_prob=0.0")
    old = tmp_path / "config.yaml"
    old.write_text(yaml.safe_dump(flat_config(config)))
    assert "re_prob" in yaml.safe_load(old.read_text())["data"]
    assert printed_config(capsys, main, "vision-cls", "-c", old) == config


@pytest.mark.slow
def test_the_console_script_names_each_moved_key_of_a_config_file(tmp_path: Path, digits_cache_dir: Path):
    saved = tmp_path / "config.yaml"
    options = smoke_options(SMOKE, tmp_path, digits_cache_dir, "--data.train.re_prob=0.0", "--print_config")
    done = run_to_the_end([sys.executable, "-m", "kpca.vision_cls", "test", *map(str, options)], tmp_path)
    config = yaml.safe_load(done.stdout)
    saved.write_text(yaml.safe_dump(flat_config(config)))
    done = run_to_the_end(
        [sys.executable, "-m", "kpca.vision_cls", "test", "-c", str(saved), "--print_config"], tmp_path
    )
    assert yaml.safe_load(done.stdout) == config
    named = [line for line in done.stderr.splitlines() if "is now data.train." in line]
    assert f"config {saved}: data option re_prob is now data.train.re_prob (read as such)" in named
    assert len(named) == len(FLAT)  # once per key


@pytest.fixture(scope="module")
def flat_checkpoint(tmp_path_factory: pytest.TempPathFactory, one_step_run: Path) -> Path:
    """A one-step smoke fit's last checkpoint whose DataModule saved the flat options (re_prob 0, hflip 0)."""
    root = tmp_path_factory.mktemp("flat_checkpoint")
    run = one_step_run  # shared: only read
    data = flat_config(yaml.safe_load((run / "config.yaml").read_text()))["data"]
    data.update(re_prob=0.0, hflip=0.0, eval={"subset": 16})
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    checkpoint["datamodule_hyper_parameters"] = data
    path = root / "flat.ckpt"
    torch.save(checkpoint, path)
    return path


@pytest.mark.slow
# No experiment file, so no seed_everything: Lightning seeds with 0 and warns (a process prints it and goes on).
@pytest.mark.filterwarnings("ignore:No seed found, seed set to 0:UserWarning")
def test_a_checkpoint_with_the_old_spelling_tests_with_its_options_moved(
    capsys: pytest.CaptureFixture, flat_checkpoint: Path, tmp_path: Path, digits_cache_dir: Path
):
    test = [
        "test", "-c", str(CPU), f"--data.cache_dir={digits_cache_dir}",
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false", "--ckpt_path", str(flat_checkpoint),
    ]  # fmt: skip
    done = vision_cls(capsys, tmp_path, *test)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"--ckpt_path {flat_checkpoint}: data option re_prob is now data.train.re_prob (read as such)" in done.stderr
    assert done.stderr.count("is now data.train.") == len(FLAT)
    saved = yaml.safe_load((tmp_path / "runs" / "lightning_logs" / "version_0" / "config.yaml").read_text())
    assert (saved["data"]["train"]["re_prob"], saved["data"]["train"]["hflip"]) == (0.0, 0.0)
    assert saved["data"]["eval"]["subset"] == 16 and "re_prob" not in saved["data"]
    typed = vision_cls(capsys, tmp_path, *test, "--data.train.re_prob=0.5", "--print_config")
    assert typed.returncode == 0 and yaml.safe_load(typed.stdout)["data"]["train"]["re_prob"] == 0.5  # typed wins
