"""What the apps' CLI tests share: the configs folder, running a command as from a shell, smoke-run options."""

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest
import torch
import yaml
from filelock import FileLock
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CPU = CONFIGS / "trainer" / "cpu.yaml"
# Expected when a run loads a checkpoint: it logs into a new version folder, so ModelCheckpoint's dirpath moved.
NEW_CHECKPOINT_DIR = pytest.mark.filterwarnings("ignore:The dirpath has changed from")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a process group's ``MASTER_PORT``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_cli(main: Callable, prog: str, *args: object):
    """``main`` on ``args`` as ``prog`` from a shell; sys.argv is bare (LightningCLI warns when both are given).

    The environment is restored afterwards (Lightning sets variables such as the DDP ones).
    """
    with mock.patch.object(sys, "argv", [prog]), mock.patch.dict(os.environ):
        return main([str(arg) for arg in args])


def printed_config(capsys: pytest.CaptureFixture, main: Callable, prog: str, *options: object) -> dict:
    """The config ``prog test`` would save with ``options`` (its ``--print_config``, parsed)."""
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, prog, "test", *options, "--print_config")
    printed = capsys.readouterr()
    assert exit_info.value.code == 0, printed.err
    return yaml.safe_load(printed.out)


def refusal(capsys: pytest.CaptureFixture, main: Callable, prog: str, *args: object) -> str:
    """What ``prog args`` prints on stderr when its parser refuses them; it must exit with a non-zero status."""
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, prog, *args)
    error = capsys.readouterr().err
    assert exit_info.value.code != 0, error
    return error


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder that ``build(folder)`` fills once per test run, for every xdist worker: read it, never write into it.

    For what several tests only read (a short fit's run folder): the first worker to ask builds it, under a file
    lock, and the others wait for it and reuse it; a test that changes it works on a copy (``shutil.copytree``). It
    lies in the run's temporary folder beside the workers' own (pytest removes those as a worker ends, when all of
    its tests passed; the run's, when the run ends), so a worker that finishes first takes nothing away. ``build``
    writes where the folder stays, so the paths a run records in it (its config's cache_dir) stay true; a build
    that failed leaves no mark and the next one starts again from an empty folder.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, holding each worker's basetemp (popen-gw0, ...)
    folder, built = base / f"shared-{name}", base / f"shared-{name}.built"
    with FileLock(base / f"shared-{name}.lock"):
        if not built.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            built.touch()
    return folder


def smoke_options(smoke: Path, root: Path, cache: Path, *extra: object) -> list[object]:
    """Options of a CPU run of the ``smoke`` YAML writing under ``root``, with its data cached in ``cache``."""
    return [
        "-c", CPU, "-c", smoke, f"--data.cache_dir={cache}", f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root / 'runs'}", "--trainer.enable_progress_bar=false", *extra,
    ]  # fmt: skip


def fit_command(app: str, options: list[object]) -> list[str]:
    """``python -m kpca.<app> fit <options> --ckpt_path auto``: the command a cluster job reruns after a kill."""
    return [sys.executable, "-m", f"kpca.{app}", "fit", *map(str, options), "--ckpt_path", "auto"]


def run_to_the_end(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``command`` as from a shell (offline hubs) and fail with its stderr if it fails."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def kill_after_first_checkpoint(command: list[str], cwd: Path, last: Path) -> int:
    """Start ``command``, SIGKILL it as soon as ``last`` (its last.ckpt) exists, and return that file's step.

    The run must still be training then (give it epochs to spare): the test fails if it finished first.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while not last.is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, f"the run ended before it was killed:\n{stderr.decode()[-3000:]}"
    return int(torch.load(last, map_location="cpu", weights_only=True)["global_step"])


def assert_same_weights(left: Path, right: Path) -> None:
    """The two checkpoints hold bit-identical model weights and the same global step."""
    a, b = (torch.load(p, map_location="cpu", weights_only=True) for p in (left, right))
    assert a["global_step"] == b["global_step"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][name]), name


def assert_rerun_resumes(
    app: str, options_for: Callable[[Path], list[object]], tmp_path: Path, total_steps: int
) -> None:
    """The README's cluster promise, as a user lives it: a fit killed with SIGKILL after its first checkpoint,
    rerun with the same command, continues from that checkpoint in the same run folder, on one TensorBoard step
    axis, and ends with the weights of an uninterrupted run (deterministic CPU).

    ``options_for(root)`` gives the app's fit options writing under ``root``; the run must save a checkpoint
    each epoch and train ``total_steps`` steps over several epochs.
    """
    straight = tmp_path / "straight"
    run_to_the_end(fit_command(app, options_for(straight)), tmp_path)
    killed = tmp_path / "killed"
    command = fit_command(app, options_for(killed))
    run_dir = killed / "runs" / "lightning_logs" / "version_0"
    killed_at = kill_after_first_checkpoint(command, tmp_path, run_dir / "checkpoints" / "last.ckpt")
    rerun = run_to_the_end(command, tmp_path)
    restored = re.search(r"auto resume: restoring (\S+) \(step (\d+)\)", rerun.stderr)
    assert restored is not None, rerun.stderr[-3000:]
    assert Path(restored[1]).parent == (run_dir / "checkpoints").resolve()
    assert killed_at <= int(restored[2]) < total_steps  # it continued; it did not start over
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["version_0"]  # logs and checkpoints stay in one folder
    straight_last = straight / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert_same_weights(run_dir / "checkpoints" / "last.ckpt", straight_last)
    events = EventAccumulator(str(run_dir))
    events.Reload()
    steps = [event.step for event in events.Scalars("train/loss_step")]
    assert steps == sorted(set(steps)) and steps[-1] == total_steps - 1  # one step axis, no repeated steps


COMPILED_FIT_OPTIONS = ("--model.compile=true", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2",
                        "--trainer.log_every_n_steps=1", "--rpc_diagnostics.every_n_steps=1")  # fmt: skip
"""A short compiled fit: two training steps, two validation batches.

Limits of 2, not 1: once mmengine is imported (the segmentation tests), jsonargparse reads ``1`` as ``1.0``, which
Lightning takes for 100 %. Diagnostics on every step keep one training graph (their switch recompiles).
"""


def run_compiled_fit(main: Callable, prog: str, smoke: Path, root: Path, cache: Path, metric: str):
    """``<prog> fit --model.compile true`` on a smoke config; checks that it trained and evaluated compiled.

    Returns:
        The CLI object and the run's ``last.ckpt``, whose keys are checked to be the eager module's.
    """
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cli = run_cli(main, prog, "fit", *smoke_options(smoke, root, cache, *COMPILED_FIT_OPTIONS))
    assert cli.trainer.global_step == 2 and metric in cli.trainer.callback_metrics
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # training and evaluation ran compiled
    last = Path(cli.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    assert not [key for key in torch.load(last, weights_only=True)["state_dict"] if "_orig_mod" in key]
    return cli, last


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` (in benchmarks/, tools/ or requirements/: no packages) imported as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module
