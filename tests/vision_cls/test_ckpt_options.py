"""``--ckpt_path`` runs what the user typed: the ``vision-cls`` command, as typed in a shell (CPU, digits).

A model option typed at ``test --ckpt_path`` runs (the saved config and the report say so, beside the value the
checkpoint was trained with); an option the weights cannot take is refused before any work, in one line.

The commands run the console script's own path in this process (``vision_cls`` of tests/console_support.py:
``sys.argv``, environment, working folder and logging as in a new process), which spares each one the seconds of
importing Lightning and torch; so does the ``kpca-report`` of the first test.
"""

import json
import warnings
from pathlib import Path

import pytest
import yaml

from kpca.vision_cls.cli import main
from tests.cli_support import CONFIGS, run_cli, smoke_options
from tests.console_support import Done, console, vision_cls

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"  # an RPC-SymViT trained with n_iter 2, embed_dim 32
N_ITER = "model.net.init_args.attention.n_iter"


def command(capsys: pytest.CaptureFixture, subcommand: str, root: Path, cache: Path, *extra: object) -> Done:
    """``vision-cls <subcommand>`` on the smoke config as typed in a shell in ``root``, writing there."""
    options = smoke_options(SMOKE, root, cache, "--data.eval.subset=16", *extra)
    return vision_cls(capsys, root, subcommand, *options)


def succeeded(done: Done) -> Done:
    """``done``, which must have ended with status 0 (else the test fails with its stderr)."""
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def trained(one_step_run: Path) -> Path:
    """The last checkpoint of a one-step smoke fit (trained with n_iter 2), shared: only read."""
    return one_step_run / "checkpoints" / "last.ckpt"


def test_a_model_option_typed_at_test_runs_and_the_run_says_what_it_was_trained_with(
    capsys: pytest.CaptureFixture, trained: Path, tmp_path: Path, digits_cache_dir: Path
):
    done = succeeded(command(capsys, "test", tmp_path, digits_cache_dir, f"--{N_ITER}=6", "--ckpt_path", trained))
    message = f"{N_ITER}=6 (trained with 2)"
    assert message in done.stderr  # the log
    run_dir = tmp_path / "runs" / "lightning_logs" / "version_0"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["model"]["net"]["init_args"]["attention"]["n_iter"] == 6  # what ran
    provenance = json.loads((run_dir / "protocol.json").read_text())
    difference = {"option": N_ITER, "trained": 2, "used": 6}
    assert provenance["checkpoint"] == {"path": str(trained), "differences": [difference]}
    assert message in (run_dir / "robustness.md").read_text()
    report = succeeded(console(capsys, "kpca-report", tmp_path, tmp_path / "runs", "--task", "vision_cls"))
    assert "rpc n_iter=6 lambd=4.0 layers=[0] (trained with n_iter=2)" in report.stdout


def test_a_test_with_the_options_of_the_training_says_nothing_of_them(
    capsys: pytest.CaptureFixture, trained: Path, tmp_path: Path, digits_cache_dir: Path
):
    done = succeeded(command(capsys, "test", tmp_path, digits_cache_dir, "--ckpt_path", trained))
    assert "trained with" not in done.stderr
    run_dir = tmp_path / "runs" / "lightning_logs" / "version_0"
    assert "checkpoint" not in json.loads((run_dir / "protocol.json").read_text())
    assert (
        yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["net"]["init_args"]["attention"]["n_iter"] == 2
    )


def test_an_option_the_weights_cannot_take_is_refused_in_one_line_before_any_work(
    capsys: pytest.CaptureFixture, trained: Path, tmp_path: Path, digits_cache_dir: Path
):
    embed_dim = "--model.net.init_args.embed_dim=64"
    refused = command(capsys, "test", tmp_path, digits_cache_dir, embed_dim, "--ckpt_path", trained)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    error = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1
    assert "model.net.init_args.embed_dim=64 (trained with 32)" in error[0]
    assert "Drop these options" in error[0]
    assert not (tmp_path / "runs").exists()  # nothing written


KIND = "model.net.init_args.attention.kind"
LAMBD = "model.net.init_args.attention.lambd"


@pytest.fixture(scope="module")
def neutreno(tmp_path_factory: pytest.TempPathFactory, digits_cache_dir: Path) -> Path:
    """The last checkpoint of a one-step NeuTRENO fit (lambd 0.4), switched from the RPC smoke config by its kind."""
    root = tmp_path_factory.mktemp("neutreno")
    options = ("--data.eval.subset=16", "--trainer.max_steps=1", f"--{KIND}=neutreno", f"--{LAMBD}=0.4")
    with warnings.catch_warnings():  # in process (the tests below run the command); the EMA copy stays in eval mode
        warnings.filterwarnings("ignore", r"Found \d+ module\(s\) in eval mode")
        run_cli(main, "vision-cls", "fit", *smoke_options(SMOKE, root, digits_cache_dir, *options))
    return root / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


def test_a_kind_typed_at_test_replaces_the_attention_group_and_the_run_records_it(
    capsys: pytest.CaptureFixture, neutreno: Path, tmp_path: Path, digits_cache_dir: Path
):
    elliptical = f"--{KIND}=elliptical"
    done = succeeded(command(capsys, "test", tmp_path, digits_cache_dir, elliptical, "--ckpt_path", neutreno))
    assert "attention.lambd=0.4 from the checkpoint does not apply to elliptical: dropped" in done.stderr
    run_dir = tmp_path / "runs" / "lightning_logs" / "version_0"
    attention = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["net"]["init_args"]["attention"]
    assert (attention["kind"], attention["lambd"], attention["n_iter"]) == ("elliptical", None, None)
    differences = json.loads((run_dir / "protocol.json").read_text())["checkpoint"]["differences"]
    assert differences == [
        {"option": KIND, "trained": "neutreno", "used": "elliptical"},
        {"option": LAMBD, "trained": 0.4, "used": None},
    ]


def test_a_kind_the_weights_cannot_take_is_refused_by_name(
    capsys: pytest.CaptureFixture, neutreno: Path, tmp_path: Path, digits_cache_dir: Path
):
    refused = command(capsys, "test", tmp_path, digits_cache_dir, f"--{KIND}=rpc", "--ckpt_path", neutreno)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    (error,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert f"{KIND}=rpc (trained with neutreno)" in error and f"{LAMBD}=null (trained with 0.4)" in error
    assert not (tmp_path / "runs").exists()


# No experiment file: no seed_everything (Lightning seeds with 0 and warns) and the default 8 DataLoader workers (torch
# warns on a machine of fewer cores). A process prints both warnings and goes on.
@pytest.mark.filterwarnings("ignore:No seed found, seed set to 0:UserWarning")
@pytest.mark.filterwarnings(r"ignore:This DataLoader will create \d+ worker processes in total:UserWarning")
def test_test_without_the_experiment_file_runs_the_checkpoints_model(
    capsys: pytest.CaptureFixture, neutreno: Path, tmp_path: Path, digits_cache_dir: Path
):
    """``test -c <trainer> --ckpt_path X``: the model comes from the checkpoint; only the data is typed."""
    data = [
        "--data.builtin=digits",
        "--data.image_size=32",
        "--data.crop_pct=1.0",
        f"--data.cache_dir={digits_cache_dir}",
    ]
    command_line = [
        "test", "-c", str(CONFIGS / "trainer" / "cpu.yaml"), *data,
        "--data.eval.subset=16", "--data.eval.corruptions=[]", "--model.evaluator.attacks=[]",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", "--trainer.enable_progress_bar=false",
        "--ckpt_path", str(neutreno),
    ]  # fmt: skip
    done = succeeded(vision_cls(capsys, tmp_path, *command_line))
    assert "trained with" not in done.stderr
    run_dir = tmp_path / "runs" / "lightning_logs" / "version_0"
    net = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["net"]["init_args"]
    assert (net["attention"]["kind"], net["attention"]["lambd"], net["embed_dim"]) == ("neutreno", 0.4, 32)
    assert "checkpoint" not in json.loads((run_dir / "protocol.json").read_text())
