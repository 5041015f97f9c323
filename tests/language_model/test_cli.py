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
from kpca.language_model.corpus import SPLITS, split_file
from kpca.language_model.word_tokenizer import count_vocabulary
from tests.cli_support import CONFIGS, CPU, NEW_CHECKPOINT_DIR, run_cli, smoke_options

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
        assert net["dropout"] == 0.1 and net["attention_dropout"] == 0.0  # the authors' --dropatt 0.0
    if experiment.stem.endswith("_published"):  # the authors' data, head and evaluation (KPCA-S script.sh, ELL)
        data = config["data"]
        assert (data["text_files"], data["hf_name"], data["tokenizer"]["kind"]) == ("tokens", "wikitext-103-v1", "word")
        assert data["tokenizer"]["vocab_size"] == 267735 and data["tokenizer"]["min_freq"] == 0
        assert (data["context"], data["eval_stride"], data["score_first_token"]) == (256, 1, False)
        assert data["word_swap"] == {"rate": 0.015, "replacement": "AAA", "seed": 0, "protocol": "textattack"}
        assert (net["output"], net["adaptive_cutoffs"], net["adaptive_div_value"]) == (
            "adaptive",
            [20000, 40000, 200000],
            1.0,
        )
        assert (net["activation"], net["attention_bias"], net["tie_embeddings"]) == ("relu", False, False)
        assert config["model"]["min_lr_ratio"] == 0.0 and data["batch_size"] == 96


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

    # the checkpoint alone gives the model and the data (its DataModule saved its options): the same perplexities
    bare = run(
        "test", "-c", CPU, "--seed_everything=0", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false", "--ckpt_path", last,
    )  # fmt: skip
    with (Path(bare.trainer.log_dir) / "perplexity.csv").open() as stream:
        assert {row["set"]: row["ppl_word"] for row in csv.DictReader(stream)} == {
            name: row["ppl_word"] for name, row in rows.items()
        }


@NEW_CHECKPOINT_DIR
@pytest.mark.slow
def test_two_process_ddp_fit_and_test_score_every_token_once_and_match_one_process(tmp_path: Path, lm_cache_dir: Path):
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
    ddp_rows = read_rows(tmp_path / "runs/lightning_logs/version_1")
    assert len(ddp_rows) == 4 and all(row["complete"] == "True" for row in ddp_rows.values())
    last = tmp_path / "runs/lightning_logs/version_0/checkpoints/last.ckpt"
    single = run("test", *options, "--ckpt_path", last)  # one process, the same checkpoint
    single_rows = read_rows(Path(single.trainer.log_dir))
    for name, row in ddp_rows.items():  # the NLL sums reduced over the 2 ranks equal one process's
        assert single_rows[name]["tokens"] == row["tokens"]
        assert float(single_rows[name]["ppl_word"]) == pytest.approx(float(row["ppl_word"]), rel=1e-6)
        assert float(single_rows[name]["ppl_token"]) == pytest.approx(float(row["ppl_token"]), rel=1e-6)
    ddp_val = scalar_values(tmp_path / "runs/lightning_logs/version_0", "val/ppl")  # the DDP fit's validation
    validate = run("validate", *options, "--ckpt_path", last)
    assert len(ddp_val) == 1 and validate.trainer.callback_metrics["val/ppl"].item() == pytest.approx(
        ddp_val[0], rel=1e-6
    )


def read_rows(log_dir: Path) -> dict[str, dict[str, str]]:
    with (log_dir / "perplexity.csv").open() as stream:
        return {row["set"]: row for row in csv.DictReader(stream)}


def scalar_values(folder: Path, tag: str) -> list[float]:
    values = []
    for events in folder.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            values += [event.value for event in accumulator.Scalars(tag)]
    return values


@NEW_CHECKPOINT_DIR
@pytest.mark.slow
def test_the_published_protocol_runs_end_to_end_on_a_tokens_corpus(tmp_path: Path, corpus_folder: Path):
    """Word tokens, adaptive softmax, stride 1 with the first token as context, the TextAttack swap: fit, then test."""
    folder = tmp_path / "wikitext-tokens"
    folder.mkdir()
    for split in SPLITS:  # the built-in corpus (whitespace words) under the wiki.*.tokens names
        split_file(folder, split, "tokens").write_text(split_file(corpus_folder, split).read_text())
    vocab_size = len(count_vocabulary(split_file(folder, "train", "tokens")))
    published = [
        f"--data.data_dir={folder}", "--data.text_files=tokens", "--data.tokenizer.kind=word",
        f"--data.tokenizer.vocab_size={vocab_size}", "--data.eval_stride=1", "--data.score_first_token=false",
        "--data.eval_batch_size=256", "--data.word_swap.protocol=textattack", "--data.test_splits=[test]",
        "--model.net.init_args.output=adaptive", "--model.net.init_args.adaptive_cutoffs=[500,2000]",
        "--model.net.init_args.tie_embeddings=false", "--model.net.init_args.activation=relu",
        "--model.net.init_args.attention_bias=false", "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=1",
    ]  # fmt: skip
    options = smoke(tmp_path, tmp_path / "cache", *published)
    fit = run("fit", *options)
    assert fit.model.net.head.cutoffs == [500, 2000, vocab_size] and fit.datamodule.tokenizer.vocab_size == vocab_size
    test = run("test", *options, "--ckpt_path", fit.trainer.checkpoint_callback.last_model_path)
    rows = read_rows(Path(test.trainer.log_dir))
    arrays = test.datamodule.arrays
    assert set(rows) == {"test", "test_wordswap"}
    for name, row in rows.items():  # T - 1 tokens, each a word: word- and token-level perplexity are one number
        assert row["complete"] == "True" and int(row["tokens"]) == arrays[name].length - 1 == arrays[name].words - 1
        assert float(row["ppl_word"]) == pytest.approx(float(row["ppl_token"]), rel=1e-12)
    assert float(rows["test_wordswap"]["ppl_word"]) != float(rows["test"]["ppl_word"])
