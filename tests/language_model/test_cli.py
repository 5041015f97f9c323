"""The language-model command: every config through --print_config, real fits, tests, predictions and resumes (CPU)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kpca.language_model.cli import LanguageModelCLI, main
from tests.cli_support import CONFIGS, CPU, NEW_CHECKPOINT_DIR, assert_rerun_resumes, run_cli, smoke_options

SMOKE = CONFIGS / "language_model" / "smoke.yaml"


def run(*args: object) -> LanguageModelCLI:
    return run_cli(main, "language-model", *args)


def smoke(root: Path, cache: Path, *extra: object) -> list[object]:
    """Options of a smoke run writing everything under ``root`` and reading the corpus cache ``cache``."""
    return smoke_options(SMOKE, root, cache, *extra)


@pytest.mark.parametrize("experiment", sorted((CONFIGS / "language_model").glob("*.yaml")), ids=lambda p: p.stem)
def test_experiment_config_parses_with_the_cpu_trainer(experiment: Path, capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit) as exit_info:
        run("fit", "-c", CPU, "-c", experiment, "--print_config")
    printed = capsys.readouterr()
    assert exit_info.value.code == 0, printed.err
    config = yaml.safe_load(printed.out)
    net = config["model"]["net"]["init_args"]
    assert "vocab_size" not in net and "context" not in net  # linked from data.tokenizer.vocab_size, data.context
    assert experiment.stem in ("smoke", "demo") or f"_{net['attention']['kind']}_" in experiment.stem
    if experiment.stem.startswith("lm-16l128d"):  # the paper's set-up
        assert (net["depth"], net["width"], net["num_heads"], net["ffn_dim"]) == (16, 128, 8, 2048)
        assert net["norm_position"] == "post" and config["trainer"]["gradient_clip_val"] == 0.25
        assert config["model"]["optimizer"]["init_args"]["lr"] == 2.5e-4 and config["model"]["warmup_steps"] == 2000


def test_fit_fast_dev_run(tmp_path: Path, lm_cache_dir: Path):
    cli = run("fit", *smoke(tmp_path, lm_cache_dir, "--trainer.fast_dev_run=2"))
    assert cli.trainer.global_step == 2
    assert cli.model.net.vocab_size == 500 and cli.model.net.context == 32


def tensorboard_tags(folder: Path) -> set[str]:
    tags = set()
    for events in folder.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events), size_guidance={"tensors": 0, "scalars": 0})
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"]) | set(accumulator.Tags()["tensors"])
    return tags


@NEW_CHECKPOINT_DIR
@pytest.mark.slow
def test_fit_then_test_and_predict_from_the_checkpoint(tmp_path: Path, lm_cache_dir: Path):
    fit = run(
        "fit",
        *smoke(
            tmp_path, lm_cache_dir, "--trainer.limit_train_batches=20", "--rpc_diagnostics.every_n_steps=5",
            "--throughput.window_size=2",
        ),
    )  # fmt: skip
    last = Path(fit.trainer.checkpoint_callback.last_model_path)
    assert last.name == "last.ckpt" and fit.trainer.checkpoint_callback.best_model_path
    tags = tensorboard_tags(tmp_path / "runs")
    assert {"train/loss_step", "train/lr/decay", "val/ppl", "val/ppl_token"} <= tags
    assert "train/device/items_per_sec" in tags  # tokens/s from ThroughputMonitor
    assert "samples/text/text_summary" in tags
    assert "train/rpc/blocks.0/nonzero_S" in tags  # the layer's path in the module's network

    test = run("test", *smoke(tmp_path, lm_cache_dir, "--ckpt_path", last))
    report = Path(test.trainer.log_dir) / "perplexity.csv"
    with report.open() as stream:
        rows = {row["set"]: row for row in csv.DictReader(stream)}
    assert set(rows) == {"valid", "valid_wordswap", "test", "test_wordswap"}
    arrays = test.datamodule.arrays
    for name, row in rows.items():
        assert row["complete"] == "True" and int(row["tokens"]) == arrays[name].length
        assert 1 < float(row["ppl_token"]) < 500 and float(row["ppl_word"]) > float(row["ppl_token"])
    assert rows["test_wordswap"]["ppl_word"] != rows["test"]["ppl_word"]  # 20 steps: too early to be hurt by it
    logged = test.trainer.callback_metrics
    assert logged["test/test/ppl"].item() == pytest.approx(float(rows["test"]["ppl_word"]), rel=1e-5)

    predict = run("predict", *smoke(tmp_path, lm_cache_dir, "--ckpt_path", last))
    lines = (Path(predict.trainer.log_dir) / "predictions.jsonl").read_text().splitlines()
    predictions = [json.loads(line) for line in lines]
    assert [p["prompt"] for p in predictions] == ["The", "A function is", "In Python, a class"]
    assert all(p["text"].startswith(p["prompt"]) and len(p["text"]) > len(p["prompt"]) for p in predictions)


@pytest.mark.slow
def test_a_killed_fit_resumes_when_the_same_command_is_rerun(tmp_path: Path, lm_cache_dir: Path):
    epochs = [
        "--trainer.max_epochs=4", "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1", "--seed_everything=3",
    ]  # fmt: skip
    assert_rerun_resumes("language_model", lambda root: smoke(root, lm_cache_dir, *epochs), tmp_path, total_steps=24)


@pytest.mark.slow
def test_two_process_ddp_fit_and_test_score_every_token_once(tmp_path: Path, lm_cache_dir: Path):
    options = [str(o) for o in smoke(tmp_path, lm_cache_dir)]
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in (
        ["fit", *options, *ddp, "--trainer.limit_train_batches=4"],
        ["test", *options, *ddp, "--ckpt_path", str(tmp_path / "runs/lightning_logs/version_0/checkpoints/last.ckpt")],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "kpca.language_model", *command], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
    with (tmp_path / "runs/lightning_logs/version_1/perplexity.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == 4 and all(row["complete"] == "True" for row in rows)
