"""A mistake the user can fix ends a command with one ``error:`` line and the status of its kind, no traceback.

Most tests run the console script's own path (``console_main``: :func:`kpca.training.errors.run_command` around
the app's ``main``) in this process, which spares each one the seconds of importing Lightning and torch. These run
the command as a process, because their subject is the process: the exit status and the ``error:`` line of a real
``python -m kpca.vision_cls`` (``test_an_option_check_at_run_time_is_one_line_with_status_2``), the DDP rank
variables and the status an uncaught exception leaves (``python -c`` around ``run_command``), and the language
model's offline hub data (huggingface_hub and datasets read ``HF_HOME`` and the offline switches as they are
imported, so only a new process sees the empty HF cache).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from jsonargparse import ArgumentParser

from kpca.attention.errors import AttentionOptionError
from kpca.training.data_checks.problems import DataError
from kpca.training.errors import TRACEBACK_ENV_VAR, OptionError, UserError, error_line, user_message
from tests.cli_support import CONFIGS, CPU
from tests.console_support import vision_cls, vision_cls_process

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"


N_ITER_0 = ("fit", "-c", CPU, "-c", SMOKE, "--model.net.init_args.attention.n_iter=0")


def test_an_option_check_at_run_time_is_one_line_with_status_2(tmp_path: Path):
    done = vision_cls_process(tmp_path, *N_ITER_0)  # the real console command, as a process
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == ("error: n_iter must be >= 1 (the number of attention evaluations), got 0")


def test_a_missing_data_root_is_one_line_with_status_3(capsys: pytest.CaptureFixture, tmp_path: Path):
    missing = tmp_path / "imagenet"
    done = vision_cls(capsys, tmp_path, "fit", "-c", CPU, "-c", SMOKE, "--data.builtin=null", f"--data.root={missing}")
    assert done.returncode == 3, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"error: {missing / 'train'} is not a directory; expected the layout root/train/")


def test_the_traceback_is_there_on_request(capsys: pytest.CaptureFixture, tmp_path: Path):
    done = vision_cls(capsys, tmp_path, *N_ITER_0, **{TRACEBACK_ENV_VAR: "1"})
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "OptionError: n_iter must be >= 1" in done.stderr


def test_a_dataloader_workers_error_loses_the_workers_traceback():
    # how torch's ExceptionWrapper.reraise rebuilds a worker's exception in the main process
    wrapped = DataError(
        "Caught DataError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in <module>\n    raise DataError(problem)\n'
        "kpca.training.data_checks.problems.DataError: /data/a.JPEG (train): cannot decode it.\nsecond line"
    )
    assert user_message(wrapped) == "/data/a.JPEG (train): cannot decode it.\nsecond line"
    assert error_line(wrapped) == (user_message(wrapped), 3)
    assert error_line(OptionError("bad")) == ("bad", 2)
    assert error_line(ValueError("a bug's ValueError")) is None  # not the project's check: keeps its traceback
    assert error_line(AttentionOptionError("n_iter must be >= 1")) == ("n_iter must be >= 1", 2)  # an option typed
    assert not isinstance(AttentionOptionError("x"), UserError)  # the library carries no exit-status policy


@pytest.mark.parametrize(
    ("error", "rank", "printed"),
    [
        ("OptionError('bad option')", {}, True),
        ("OptionError('bad option')", {"LOCAL_RANK": "1"}, False),  # every rank parses the same options
        ("OptionError('bad option')", {"RANK": "0", "LOCAL_RANK": "0", "SLURM_PROCID": "0"}, True),
        ("DataError('rank 1 meets a damaged file')", {"LOCAL_RANK": "1"}, True),  # maybe this rank's alone
    ],
)
def test_an_option_error_under_ddp_is_printed_by_rank_0_alone(error: str, rank: dict, printed: bool):
    code = (
        "from kpca.training.errors import run_command, OptionError\n"
        "from kpca.training.data_checks.problems import DataError\n"
        f"def main():\n    raise {error}\n"
        "run_command(main)"
    )
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "LOCAL_RANK", "NODE_RANK")}
    environment.pop("SLURM_PROCID", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**environment, **rank})
    assert done.returncode == (2 if error.startswith("Option") else 3)
    assert (done.stderr.startswith("error: ")) == printed and "Traceback" not in done.stderr


@pytest.mark.parametrize("status", [0, 1])
def test_a_command_that_succeeds_or_crashes_is_left_alone(status: int):
    code = "from kpca.training.errors import run_command\n" + (
        "run_command(lambda: None)" if status == 0 else "run_command(lambda: 1 / 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == status
    assert ("ZeroDivisionError" in done.stderr) == (status == 1)


def _bad_checkpoint(tmp_path: Path, problem: str) -> Path:
    """A ``--ckpt_path`` with ``problem``: missing, a folder, empty, text, or a torch.save file cut short."""
    path = tmp_path / f"{problem}.ckpt"
    if problem == "folder":
        path.mkdir()
    elif problem == "empty":
        path.write_bytes(b"")
    elif problem == "text":
        path.write_text("not a checkpoint\n")
    elif problem == "truncated":
        torch.save({"state_dict": {"w": torch.zeros(64, 64)}, "global_step": 1}, path)
        path.write_bytes(path.read_bytes()[:-200])  # the zip directory at the end is gone
    return path


@pytest.mark.parametrize(
    ("problem", "subcommand", "reason"),
    [
        ("missing", "test", "it does not exist"),
        ("folder", "validate", "it is a folder, not a checkpoint file"),
        ("empty", "predict", r"it is empty \(0 bytes\)"),
        ("text", "test", "it is truncated or not a checkpoint"),
        ("truncated", "validate", "it is truncated or not a checkpoint"),
    ],
)
def test_a_bad_checkpoint_stops_every_subcommand_in_one_line_naming_it(
    capsys: pytest.CaptureFixture, tmp_path: Path, problem: str, subcommand: str, reason: str
):
    path = _bad_checkpoint(tmp_path, problem)
    done = vision_cls(capsys, tmp_path, subcommand, "-c", CPU, "-c", SMOKE, f"--ckpt_path={path}")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert re.fullmatch(rf"error: {subcommand} cannot read ckpt_path='{re.escape(str(path))}': {reason}.*", last)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--model.optimizer.init_args.lr=-0.001", "model.optimizer (torch.optim.AdamW) refuses its arguments: "
         "Invalid learning rate: -0.001; set the init_args value it names"),
        ("--trainer.max_epochs=-5", "the trainer options are refused by Lightning: `max_epochs` must be a "
         "non-negative integer or -1. You passed in -5."),
        ("--data.image_size=48", "data.image_size=48 differs from model.net.init_args.img_size=32"),
        ("--trainer.devices=3", "Mixup / CutMix (model.mixup_alpha=0.8, model.cutmix_alpha=1.0) pairs the images of "
         "each device's batch, so that batch must be even, but data.batch_size=16 over 3 device(s) (devices × nodes) "
         "gives 5 per device. Set data.batch_size to a multiple of 6 (an even batch on each device), e.g. 12 or 18"),
        ("--data.image_size=36 --model.net.init_args.img_size=36", "model.net.init_args.img_size=36 is not a multiple "
         "of patch_size=8: the patches would leave the last 4 pixel rows and columns out; use a multiple, e.g. "
         "--data.image_size=32 --model.net.init_args.img_size=32"),
    ],
)  # fmt: skip
def test_an_option_torch_or_lightning_would_refuse_inside_the_run_is_one_line_before_any_work(
    capsys: pytest.CaptureFixture, tmp_path: Path, option: str, message: str
):
    done = vision_cls(capsys, tmp_path, "fit", "-c", CPU, "-c", SMOKE, *option.split())
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"error: {message}")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("source", ["env", "option"])
def test_a_cache_folder_with_a_file_in_its_path_is_one_line_naming_the_setting(
    capsys: pytest.CaptureFixture, tmp_path: Path, source: str
):
    a_file = tmp_path / "cache.txt"
    a_file.write_text("not a folder")
    cache = a_file / "kpca"  # a file in the path
    env = {"KPCA_CACHE": str(cache)} if source == "env" else {}
    option = [f"--data.cache_dir={cache}"] if source == "option" else []
    done = vision_cls(capsys, tmp_path, "fit", "-c", CPU, "-c", SMOKE, "--data.cache_dir=null", *option, **env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    setting = f"KPCA_CACHE={cache}" if source == "env" else f"data.cache_dir={cache}"
    assert done.stderr.splitlines()[-1] == (
        f"error: {setting} cannot be the cache folder: {a_file} is a file, not a folder; pass "
        "--data.cache_dir=<folder> or set KPCA_CACHE=<folder> to a writable folder."
    )
    assert not (tmp_path / "runs").exists()


def test_a_write_refused_inside_the_cache_names_the_cache_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KPCA_CACHE", str(tmp_path / "cache"))
    refused = PermissionError(13, "Permission denied", str(tmp_path / "cache" / "digits-32px"))
    message, status = error_line(refused)
    assert status == 4 and "(the cache folder): Permission denied" in message and "KPCA_CACHE=<folder>" in message
    elsewhere = PermissionError(13, "Permission denied", str(tmp_path / "runs" / "x"))
    assert "--trainer.logger.init_args.save_dir" in error_line(elsewhere)[0]


def test_the_language_models_hub_data_offline_is_one_line_with_status_3(tmp_path: Path):
    command = [
        sys.executable, "-m", "kpca.language_model", "fit", "-c", str(CPU), "-c",
        str(CONFIGS / "language_model" / "smoke.yaml"), "--data.data_dir=null", "--trainer.fast_dev_run=1",
    ]  # fmt: skip
    environment = {key: value for key, value in os.environ.items() if key != TRACEBACK_ENV_VAR}
    environment.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", KPCA_CACHE=str(tmp_path / "cache"))
    environment["HF_HOME"] = str(tmp_path / "hf")  # an empty HF cache: nothing of wikitext is there
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("error: could not load 'wikitext' / 'wikitext-103-raw-v1' with HF datasets (")
    assert last.endswith("data.data_dir=builtin uses the built-in corpus.")


def test_a_start_that_fails_before_its_first_batch_leaves_no_folder_of_a_named_logger(
    capsys: pytest.CaptureFixture, tmp_path: Path
):
    data = tmp_path / "data"
    for label in ("a", "b"):  # a training split without the validation split
        (data / "train" / label).mkdir(parents=True)
    done = vision_cls(
        capsys, tmp_path, "fit", "-c", CPU, "-c", SMOKE, "--data.builtin=null", f"--data.root={data}",
        "--trainer.logger.init_args.name=named",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1].startswith(f"error: {data / 'val'} is not a directory")
    assert "removed runs: the run failed before its first batch" in done.stderr
    assert not (tmp_path / "runs").exists()  # neither runs/named/version_0 nor the runs/named it was created in
    (tmp_path / "runs" / "named").mkdir(parents=True)
    (tmp_path / "runs" / "named" / "notes.txt").write_text("the user's")
    done = vision_cls(
        capsys, tmp_path, "fit", "-c", CPU, "-c", SMOKE, "--data.builtin=null", f"--data.root={data}",
        "--trainer.logger.init_args.name=named",
    )  # fmt: skip
    assert done.returncode == 3
    assert sorted(p.name for p in (tmp_path / "runs" / "named").iterdir()) == ["notes.txt"]  # what was there stays


def test_a_training_split_of_one_class_is_one_line_with_status_3(capsys: pytest.CaptureFixture, tmp_path: Path):
    data = tmp_path / "data"
    (data / "train" / "only").mkdir(parents=True)
    done = vision_cls(capsys, tmp_path, "fit", "-c", CPU, "-c", SMOKE, "--data.builtin=null", f"--data.root={data}")
    assert done.returncode == 3, done.stderr[-3000:]  # torchmetrics refused num_classes=1 in a traceback
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        f"error: {data / 'train'} has 1 class folder(s) (only); a classifier needs at least two."
    )


class _Refusing:
    def __init__(self, size: int = 1) -> None:
        if size < 1:
            raise OptionError(f"size={size} must be 1 or more")


def test_a_user_error_raised_in_a_class_jsonargparse_builds_is_that_user_error():
    """jsonargparse wraps what a class it instantiates raises in a ValueError; the user error inside is the line."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--part", type=_Refusing | None)
    config = parser.parse_args([f"--part={__name__}._Refusing", "--part.size=0"])
    with pytest.raises(ValueError) as wrapped:
        parser.instantiate_classes(config)
    assert error_line(wrapped.value) == ("size=0 must be 1 or more", OptionError.exit_status)
    try:
        raise ValueError("a bug in our own code") from OptionError("size=0 must be 1 or more")
    except ValueError as ours:
        assert error_line(ours) is None  # raised by the project, not jsonargparse: a bug keeps its traceback
