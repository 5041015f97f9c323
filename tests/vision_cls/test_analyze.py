"""``vision-cls analyze``: the kernel-PCA report of a checkpoint, and the monitor during fit, through the CLI."""

import csv
import shutil
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kpca.training.analysis import analyze_network
from kpca.vision_cls.cli import VisionCLI, main
from tests.cli_support import CONFIGS, run_cli, smoke_options

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
EMA_IN_EVAL_MODE = pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")


def run(*args: object) -> VisionCLI:
    return run_cli(main, "vision-cls", *args)


@EMA_IN_EVAL_MODE
def test_analyze_writes_the_report_of_the_checkpoint_weights(
    monitored_run: Path, tmp_path: Path, digits_cache_dir: Path
):
    options = smoke_options(
        SMOKE, tmp_path, digits_cache_dir, "--trainer.limit_train_batches=3", "--trainer.log_every_n_steps=1"
    )
    events = EventAccumulator(str(monitored_run))  # the fit's, with --kernel_pca.every_n_epochs=1
    events.Reload()
    assert {"kpca/vit.blocks.0/projection_loss", "kpca/vit.blocks.1/value_alignment"} <= set(events.Tags()["scalars"])
    run_folder = shutil.copytree(monitored_run, tmp_path / "run")  # analyze writes into the checkpoint's run folder
    last = run_folder / "checkpoints" / "last.ckpt"

    cli = run("analyze", *options, "--ckpt_path", last, "--samples", "5")
    checkpoint = torch.load(last, weights_only=True)
    for name, value in cli.model.state_dict().items():
        assert torch.equal(value, checkpoint["state_dict"][name]), name
    folder = last.parent.parent / "analysis"  # the run folder's, beside checkpoints/
    with (folder / "kernel_pca.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert [row["layer"] for row in rows] == ["vit.blocks.0", "vit.blocks.1"]
    assert (folder / "kernel_pca.png").stat().st_size > 0 and (folder / "kernel_pca.md").is_file()
    cli.datamodule.setup("validate")
    images = next(iter(cli.datamodule.val_dataloader()))[0][:5]
    expected = analyze_network(cli.model.net, images)
    for row, layer in zip(rows, expected, strict=True):
        assert float(row["projection_loss"]) == pytest.approx(float(layer.projection_loss.mean()), rel=1e-9)
        assert int(row["heads"]) == 2
