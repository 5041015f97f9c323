"""What the machine must offer, refused in one line before anything is built: the real ``vision-cls`` command.

The commands run the console script's own function in this process (tests/console_support.py), which spares each one
the seconds of importing Lightning and torch.
"""

import errno
from pathlib import Path

import pytest
import torch

from kpca.training.errors import MachineError, error_line
from kpca.training.files import write_atomic
from kpca.training.machine_checks import check_writable
from tests.cli_support import CONFIGS, CPU
from tests.console_support import Done, vision_cls

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"


def assert_one_error_line(done: Done, status: int, *words: str) -> str:
    assert done.returncode == status, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    for word in words:
        assert word in errors[0]
    return errors[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_a_gpu_trainer_file_without_a_gpu_names_the_cpu_trainer_file(tmp_path: Path, capsys):
    gpu = CONFIGS / "trainer" / "gpu_1x_bf16.yaml"
    done = vision_cls(capsys, tmp_path, "fit", "-c", gpu, "-c", SMOKE, "--trainer.max_steps=1")
    assert_one_error_line(done, 4, "trainer.accelerator=gpu", "configs/trainer/cpu.yaml")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_run_folder_that_cannot_be_written_names_the_option_to_move_it(tmp_path: Path, capsys):
    (tmp_path / "a_file").write_text("")
    save_dir = tmp_path / "a_file" / "runs"
    done = vision_cls(
        capsys, tmp_path, "fit", "-c", CPU, "-c", SMOKE, f"--trainer.logger.init_args.save_dir={save_dir}"
    )
    assert_one_error_line(done, 4, str(save_dir), "--trainer.logger.init_args.save_dir=<folder>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_the_folder_check_writes_nothing_where_it_succeeds(tmp_path: Path):
    check_writable(tmp_path / "runs" / "deeper", "trainer.logger.init_args.save_dir")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_writing_names_the_file_and_the_fix(tmp_path: Path):
    target = tmp_path / "last.ckpt"

    def fill(stream) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as raised:
        write_atomic(target, fill)
    assert list(tmp_path.iterdir()) == []  # no partial file
    message, status = error_line(raised.value)
    assert status == MachineError.exit_status == 4
    assert str(target) in message and "No space left on device" in message
    assert "--trainer.logger.init_args.save_dir=<folder>" in message
    assert error_line(RuntimeError("a bug")) is None  # anything else keeps its traceback


def test_float16_on_the_cpu_is_refused_rather_than_run_as_bfloat16_and_recorded_as_float16(tmp_path: Path, capsys):
    done = vision_cls(capsys, tmp_path, "fit", "-c", CPU, "-c", SMOKE, "--trainer.precision=16-mixed")
    line = assert_one_error_line(done, 4, "trainer.precision=16-mixed", "--trainer.precision=bf16-mixed or 32-true")
    assert line.startswith("error: trainer.precision=16-mixed is float16 on a CUDA GPU, and this run is on the CPU")
    assert not (tmp_path / "runs").exists()
