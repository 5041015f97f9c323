"""The vision-cls command: every config through --print_config, and real fits, tests and resumes on the digits (CPU)."""

import csv
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kpca.training.checkpointing.io import AtomicCheckpointIO
from kpca.vision_cls.cli import VisionCLI, main
from kpca.vision_cls.model import ViTClassifier
from kpca.vision_cls.module import ClassificationModule
from tests.cli_support import (
    CONFIGS,
    CPU,
    NEW_CHECKPOINT_DIR,
    assert_rerun_resumes,
    free_port,
    run_cli,
    run_to_the_end,
    smoke_options,
)

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"

# Expected in every fit of the smoke model: its EMA copy stays in eval mode on purpose (timm's ModelEmaV3).
EMA_IN_EVAL_MODE = pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")


def run(*args: object) -> VisionCLI:
    return run_cli(main, "vision-cls", *args)


def smoke(root: Path, cache: Path, *extra: object) -> list[object]:
    """Options of a smoke run writing everything under ``root`` and reading the digits from ``cache``."""
    return smoke_options(SMOKE, root, cache, *extra)


def printed_config(trainer: Path, experiment: Path, capsys: pytest.CaptureFixture) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        run("fit", "-c", trainer, "-c", experiment, "--print_config")
    printed = capsys.readouterr()
    assert exit_info.value.code == 0, printed.err.partition("error:")[2] or printed.err
    return yaml.safe_load(printed.out)


@pytest.mark.parametrize("experiment", sorted((CONFIGS / "vision_cls").glob("*.yaml")), ids=lambda p: p.stem)
def test_experiment_config_parses_with_the_cpu_trainer(experiment: Path, capsys: pytest.CaptureFixture):
    config = printed_config(CPU, experiment, capsys)
    kind = config["model"]["net"]["init_args"]["attention"]["kind"]
    assert kind == yaml.safe_load(experiment.read_text())["model"]["net"]["init_args"]["attention"]["kind"]
    assert experiment.stem in ("smoke", "demo_digits") or f"_{kind}_" in experiment.stem
    assert config["trainer"]["accelerator"] == "cpu"


@pytest.mark.parametrize("trainer", sorted((CONFIGS / "trainer").glob("*.yaml")), ids=lambda p: p.stem)
def test_trainer_config_parses_without_its_hardware(trainer: Path, capsys: pytest.CaptureFixture):
    config = printed_config(trainer, SMOKE, capsys)
    settings = yaml.safe_load(trainer.read_text())["trainer"]
    logger = settings.pop("logger")
    assert {key: config["trainer"][key] for key in settings} == settings
    assert config["trainer"]["logger"]["class_path"] == logger["class_path"]


@EMA_IN_EVAL_MODE
def test_fast_dev_run(tmp_path: Path, digits_cache_dir: Path):
    cli = run("fit", *smoke(tmp_path, digits_cache_dir, "--trainer.fast_dev_run=2"))
    assert cli.trainer.state.finished and cli.trainer.global_step == 2


@pytest.fixture(scope="module")
def short_fit(tmp_path_factory: pytest.TempPathFactory, digits_cache_dir: Path) -> VisionCLI:
    """One epoch of 3 steps and 2 validation batches, logging every step."""
    root = tmp_path_factory.mktemp("short_fit")
    return run(
        "fit", *smoke(root, digits_cache_dir), "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1", "--rpc_diagnostics.every_n_steps=1", "--throughput.window_size=2",
    )  # fmt: skip


@EMA_IN_EVAL_MODE
def test_fit_writes_best_and_last_checkpoints_atomically(short_fit: VisionCLI):
    assert isinstance(short_fit.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    folder = Path(short_fit.trainer.checkpoint_callback.dirpath)
    assert sorted(p.name for p in folder.iterdir()) == ["best-000.ckpt", "last.ckpt"]  # no temporary files left
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 3


@EMA_IN_EVAL_MODE
def test_fit_logs_losses_accuracy_rpc_diagnostics_and_attention_maps(short_fit: VisionCLI):
    events = EventAccumulator(short_fit.trainer.log_dir, size_guidance={"images": 0})
    events.Reload()
    scalars, images = set(events.Tags()["scalars"]), set(events.Tags()["images"])
    assert {"train/loss_step", "train/loss_epoch", "val/acc1", "val/acc5", "val/ema_acc1"} <= scalars
    assert {"train/lr/decay", "train/lr/no_decay", "train/device/samples_per_sec"} <= scalars  # Lightning's monitors
    assert {
        "train/rpc/vit.blocks.0/nonzero_S",
        "train/rpc/vit.blocks.0/residual",
        "train/rpc/vit.blocks.0/residual_first",
    } <= scalars  # tags: the layer's path in the module's network
    assert not any(tag.startswith("train/rpc/vit.blocks.1") for tag in scalars)  # block 1 is symmetric softmax
    assert [e.step for e in events.Scalars("train/rpc/vit.blocks.0/residual")] == [0, 1, 2]
    assert images == {"attention/block0", "attention/block-1"}
    maps = events.Images("attention/block0")[-1]
    assert (maps.width, maps.height) == (4 * 64, 32)  # 4 images, each beside its attention map


@EMA_IN_EVAL_MODE
def test_load_from_checkpoint_rebuilds_the_injected_net(short_fit: VisionCLI):
    path = Path(short_fit.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    loaded = ClassificationModule.load_from_checkpoint(path).eval()
    assert isinstance(loaded.net, ViTClassifier) and loaded.net.attention.kind == "rpc"
    images = torch.rand(2, 3, 32, 32)  # (B, C, H, W)
    torch.testing.assert_close(loaded(images), short_fit.model.eval()(images), rtol=0, atol=0)


@EMA_IN_EVAL_MODE
def test_init_from_a_lightning_checkpoint_of_the_cli(short_fit: VisionCLI):
    path = Path(short_fit.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    trained = short_fit.model.net.eval()
    shape = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
    loaded = ViTClassifier(num_classes=10, attention=trained.attention, init_from=str(path), **shape).eval()
    images = torch.rand(2, 3, 32, 32)  # (B, C, H, W)
    torch.testing.assert_close(loaded(images), trained(images), rtol=0, atol=0)


@EMA_IN_EVAL_MODE
@NEW_CHECKPOINT_DIR
def test_test_subcommand_writes_robustness_reports(
    short_fit: VisionCLI, digits_cache_dir: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
):
    root = Path(short_fit.trainer.default_root_dir)
    path = Path(short_fit.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    caplog.set_level(logging.INFO, logger="kpca")
    cli = run("test", *smoke(root, digits_cache_dir), f"--ckpt_path={path}")
    # the console shows the report's table once, not Lightning's table per test loader (3 loaders here)
    assert "Test metric" not in capsys.readouterr().out
    assert sum("| clean/acc1 |" in record.getMessage() for record in caplog.records) == 1
    notes = [record.getMessage() for record in caplog.records if "mCE not comparable" in record.getMessage()]
    assert len(notes) == 1  # the smoke set has 1 of the 15 corruptions: the note, once
    out = Path(cli.trainer.log_dir)
    assert {"robustness.md", "robustness.csv", "robustness_corrupted.md", "robustness_corrupted.csv"} <= {
        p.name for p in out.iterdir()
    }
    with open(out / "robustness.csv") as f:
        results = {row["metric"]: float(row["value"]) for row in csv.DictReader(f)}
    expected = {"clean/acc1", "clean/acc5", "corrupted/gaussian_noise/s1/acc1", "corrupted/gaussian_noise/s2/acc1"}
    assert expected | {"attack/fgsm-pixel/eps2/acc1", "attack/pgd-pixel/eps2/acc1"} <= set(results)
    # The test set "clean" is the validation subset, so the checkpoint's weights give the last val/acc1 again.
    assert results["clean/acc1"] == pytest.approx(float(short_fit.trainer.callback_metrics["val/acc1"]))


@EMA_IN_EVAL_MODE
@NEW_CHECKPOINT_DIR
def test_predict_writes_each_validation_images_top5_and_says_where(
    short_fit: VisionCLI, digits_cache_dir: Path, caplog: pytest.LogCaptureFixture
):
    root = Path(short_fit.trainer.default_root_dir)
    path = Path(short_fit.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    caplog.set_level(logging.INFO, logger="kpca")
    cli = run("predict", *smoke(root, digits_cache_dir), f"--ckpt_path={path}")
    table = Path(cli.trainer.log_dir) / "predictions.csv"
    with table.open() as stream:
        rows = list(csv.DictReader(stream))
    val_set = cli.datamodule.val_set
    assert [int(row["index"]) for row in rows] == list(range(len(val_set)))  # every image once, in order
    assert f"predictions of {len(val_set)} items written to {table}" in caplog.text
    classes = cli.datamodule.classes
    probabilities = torch.cat(cli.trainer.predict_loop.predictions)  # (N, C): predict_step's softmax
    for row, p in zip(rows, probabilities, strict=True):
        assert Path(row["file"]).is_file() and Path(row["file"]).parent.name == row["label"] in classes
        top5 = row["top5"].split()
        assert top5 == [classes[c] for c in p.topk(5).indices.tolist()] and top5[0] == row["prediction"]
        assert float(row["probability"]) == pytest.approx(p.max().item(), abs=1e-6)


@EMA_IN_EVAL_MODE
def test_auto_resume_skips_a_damaged_last_checkpoint_and_an_explicit_one_is_refused(
    tmp_path: Path, digits_cache_dir: Path, caplog: pytest.LogCaptureFixture
):
    options = smoke(
        tmp_path, digits_cache_dir, "--trainer.max_epochs=2", "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1", "--ckpt_path=auto",
    )  # fmt: skip
    first = run("fit", *options, "--trainer.max_epochs=1")  # another experiment (1 epoch): not resumed below
    folder = Path(first.trainer.checkpoint_callback.dirpath)
    caplog.set_level(logging.INFO, logger="kpca")
    run("fit", *options)
    assert "auto resume: no readable checkpoint of this experiment" in caplog.text  # version_0 has another config
    folder = tmp_path / "runs" / "lightning_logs" / "version_1" / "checkpoints"
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # a copy cut short by a dying node
    caplog.clear()
    resumed = run("fit", *options)
    assert f"auto resume: skipping {last.resolve()}: it is truncated" in caplog.text
    assert f"auto resume: restoring {(folder / 'best-000.ckpt').resolve()} (step 2)" in caplog.text
    assert resumed.trainer.global_step == 4 and Path(resumed.trainer.log_dir).name == "version_1"
    last.write_bytes(b"")
    with pytest.raises(ValueError, match=r"last.ckpt' cannot be resumed from: it is empty .* --ckpt_path auto"):
        run("fit", *options[:-1], f"--ckpt_path={last}")


def test_auto_resume_under_slurm_refuses_a_fresh_start_beside_another_runs_hpc_checkpoint(
    tmp_path: Path, digits_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "kpca-test")
    torch.save({"global_step": 8, "kpca_run_folder": str(tmp_path / "elsewhere")}, tmp_path / "hpc_ckpt_1.ckpt")
    with pytest.raises(ValueError, match=r"holds SLURM hpc_ckpt_\*.ckpt files of another run.*default_root_dir"):
        run("fit", *smoke(tmp_path, digits_cache_dir, "--ckpt_path=auto"))


@EMA_IN_EVAL_MODE
def test_a_non_finite_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path: Path, digits_cache_dir: Path):
    options = smoke(
        tmp_path, digits_cache_dir, "--trainer.limit_train_batches=3", "--trainer.log_every_n_steps=1",
        "--checkpoint.every_n_train_steps=1", "--checkpoint.monitor=null",
        "--model.optimizer.init_args.lr=1e30", "--model.warmup_epochs=0", "--model.lr_batch_reference=0",
    )  # fmt: skip
    with pytest.raises(FloatingPointError, match=r"non-finite training step 1 .* loss nan") as error:
        run("fit", *options)
    assert "nonfinite_loss.action=skip" in str(error.value)
    last = torch.load(next(tmp_path.rglob("last.ckpt")), weights_only=True)
    assert last["global_step"] == 1 and all(torch.isfinite(v).all() for v in last["state_dict"].values())


@pytest.mark.slow
def test_a_killed_fit_resumes_when_the_same_command_is_rerun(tmp_path: Path, digits_cache_dir: Path):
    epochs = [
        "--trainer.max_epochs=4", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
        "--trainer.log_every_n_steps=1",
    ]  # fmt: skip
    assert_rerun_resumes("vision_cls", lambda root: smoke(root, digits_cache_dir, *epochs), tmp_path, total_steps=8)


def test_a_finished_ddp_subcommand_destroys_its_gloo_process_group(
    tmp_path: Path, digits_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """Left to the interpreter's exit, a gloo group's threads can abort the process (SIGABRT) after a finished run."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    cli = run("validate", *smoke(tmp_path, digits_cache_dir), "--trainer.strategy=ddp", "--trainer.limit_val_batches=1")
    assert cli.trainer.world_size == 1 and cli.trainer.strategy.process_group_backend == "gloo"
    assert not torch.distributed.is_initialized()


@pytest.mark.slow
def test_two_process_cpu_ddp_fit(tmp_path: Path, digits_cache_dir: Path):
    command = [
        sys.executable, "-m", "kpca.vision_cls", "fit", *smoke(tmp_path, digits_cache_dir), "--trainer.devices=2",
        "--trainer.strategy=ddp", "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(list(map(str, command)), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    last = tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 2  # stopped mid-epoch: no validation, no best-*


def csv_rows(folder: Path) -> dict[str, list[dict[str, str]]]:
    """The rows of every ``robustness*.csv`` report in ``folder``, by file name."""
    rows = {}
    for path in sorted(folder.glob("robustness*.csv")):
        with open(path, newline="") as f:
            rows[path.name] = list(csv.DictReader(f))
    return rows


def prediction_rows(folder: Path) -> list[dict[str, str]]:
    """The rows of the ``predictions.csv`` that ``predict`` wrote into ``folder``."""
    with open(folder / "predictions.csv", newline="") as f:
        return list(csv.DictReader(f))


def assert_same_rows(left: list[dict[str, str]], right: list[dict[str, str]]) -> None:
    """Equal report rows: the same columns and text, numbers within float32 rounding (any columns, e.g. ``n``)."""
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert a.keys() == b.keys()
        for column, value in a.items():
            try:
                assert float(value) == pytest.approx(float(b[column]), abs=1e-6), (a, b)
            except ValueError:
                assert value == b[column], (a, b)


@pytest.mark.slow
@EMA_IN_EVAL_MODE
@NEW_CHECKPOINT_DIR
def test_two_process_ddp_validate_and_test_count_every_image_once(
    short_fit: VisionCLI, digits_cache_dir: Path, tmp_path: Path
):
    """9 evaluation images on 2 ranks (5 + 4, no padding): DDP metrics equal one process's, report for report."""
    last = Path(short_fit.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    options = [
        "--data.eval.subset=9", f"--ckpt_path={last}", "--model.evaluator.attack_batches=null",
        '--model.evaluator.attacks=[{"name": "fgsm", "eps": [0.03137255]}]',  # deterministic, unlike PGD's start
    ]  # fmt: skip
    ddp_root, single_root = tmp_path / "ddp", tmp_path / "single"
    for subcommand in ("validate", "test", "predict"):
        command = [sys.executable, "-m", "kpca.vision_cls", subcommand, *smoke(ddp_root, digits_cache_dir, *options)]
        run_to_the_end([*map(str, command), "--trainer.devices=2", "--trainer.strategy=ddp"], tmp_path)
    ddp_runs = ddp_root / "runs" / "lightning_logs"
    events = EventAccumulator(str(ddp_runs / "version_0"))
    events.Reload()
    single = run("validate", *smoke(single_root, digits_cache_dir, *options)).trainer.callback_metrics
    assert 0 < float(single["val/acc1"]) < 1  # neither all right nor all wrong, so a repeated image would show
    for name in ("val/loss", "val/acc1", "val/acc5", "val/ema_acc1"):
        assert events.Scalars(name)[-1].value == pytest.approx(float(single[name]), abs=1e-6), name
    single_test = run("test", *smoke(single_root, digits_cache_dir, *options))
    reports, expected = csv_rows(ddp_runs / "version_1"), csv_rows(Path(single_test.trainer.log_dir))
    assert sorted(reports) == ["robustness.csv", "robustness_corrupted.csv"] and reports.keys() == expected.keys()
    for name, rows in reports.items():
        assert_same_rows(rows, expected[name])
    assert any(row["metric"].startswith("attack/fgsm") for row in reports["robustness.csv"])
    single_predict = run("predict", *smoke(single_root, digits_cache_dir, *options))
    predicted = prediction_rows(ddp_runs / "version_2")  # both ranks' rows, written once by rank 0
    expected_rows = prediction_rows(Path(single_predict.trainer.log_dir))
    assert [row["index"] for row in predicted] == [str(i) for i in range(9)]
    for row, one in zip(predicted, expected_rows, strict=True):
        assert float(row.pop("probability")) == pytest.approx(float(one.pop("probability")), abs=1e-5)
        assert row == one
