"""Protocol provenance of the vision report: the rules against the shipped configs, and real test runs.

The shipped combinations come from the CLI's own ``--print_config`` (the config a run saves); the real runs fit once
on a two-class tree cut from the digits and test the checkpoint twice, with ``attacks/published.yaml`` and with the
smoke config's own attacks, then compare them with ``kpca-report``.
"""

import copy
import csv
import json
import shutil
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from kpca.training.results.compare import main as kpca_report
from kpca.vision_cls.cli import main
from kpca.vision_cls.evaluation import ELLIPTICAL_ATTACKED_AS_TRAINED, ON_THE_FLY_CORRUPTIONS, ROBUSTNESS_REPORT
from tests.cli_support import CONFIGS, CPU, NEW_CHECKPOINT_DIR, printed_config, run_cli, smoke_options

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
GPU = CONFIGS / "trainer" / "gpu_1x_bf16.yaml"
ATTACKS = CONFIGS / "vision_cls" / "attacks"
IMAGENET_CONFIGS = sorted((CONFIGS / "vision_cls").glob("deit-*.yaml"))
PUBLISHED_ATTACKS = ("fgsm-reference-predicted", "pgd-reference-predicted", "spsa-reference-predicted-cleverhans")
METRICS = [
    "clean/acc1", "imagenet_c/mean_acc1", "imagenet_c/mCE", "corrupted/mean_acc1", "imagenet_a/acc1",
    "imagenet_r/acc1", "imagenet_o/aupr", *(f"attack/{tag}/eps1/acc1" for tag in PUBLISHED_ATTACKS),
    *(f"attack/{name}-pixel/eps1/acc1" for name in ("fgsm", "pgd", "spsa")),
]  # fmt: skip
"""A metric of every group the shipped configs can give."""


def texts(config: dict) -> dict[str, str]:
    return {group: protocol.text for group, protocol in ROBUSTNESS_REPORT.protocol_of(config, METRICS).items()}


@pytest.mark.parametrize("experiment", IMAGENET_CONFIGS, ids=lambda path: path.stem)
def test_the_one_command_published_evaluation_is_published_in_every_group_but_the_proxy(experiment, capsys):
    config = printed_config(
        capsys,
        main,
        "vision-cls",
        "-c",
        GPU,
        "-c",
        experiment,
        "-c",
        ATTACKS / "published.yaml",
        "--trainer.precision=32-true",
    )
    protocols = texts(config)
    assert protocols.pop("corrupted") == f"ours: {ON_THE_FLY_CORRUPTIONS}"  # never the benchmark
    attacked = f"ours: {ELLIPTICAL_ATTACKED_AS_TRAINED}" if "_elliptical_" in experiment.stem else "published"
    assert protocols == {
        **{group: "published" for group in ("clean", "imagenet_c", "imagenet_a", "imagenet_r", "imagenet_o")},
        **{f"attack/{tag}": attacked for tag in PUBLISHED_ATTACKS},
    }


@pytest.mark.parametrize("kind", ["elliptical", "twicing", "neutreno"])
def test_only_elliptical_attacks_name_the_estimator_they_see(kind, capsys):
    experiment = CONFIGS / "vision_cls" / f"deit-tiny_{kind}_8xb128-300e_imagenet-224.yaml"
    config = printed_config(
        capsys, main, "vision-cls", "-c", GPU, "-c", experiment, "-c", ATTACKS / "pixel.yaml", "--trainer.precision=32"
    )
    pixel = "ours: space=pixel (published: reference); labels=ground_truth (published: predicted)"
    protocols = texts(config)
    assert protocols["clean"] == "published"  # the estimator is no difference where nothing is attacked
    for tag in ("fgsm-pixel", "pgd-pixel"):
        expected = f"{pixel}; {ELLIPTICAL_ATTACKED_AS_TRAINED}" if kind == "elliptical" else pixel
        assert protocols[f"attack/{tag}"] == expected
    assert ("mean estimator" in protocols["attack/spsa-pixel"]) == (kind == "elliptical")


def test_the_defaults_name_each_difference_from_the_authors_protocol(capsys):
    experiment = CONFIGS / "vision_cls" / "deit-tiny_rpc_8xb128-300e_imagenet-224.yaml"
    bf16 = "precision=bf16-mixed (published: 16-mixed or 32-true)"
    protocols = texts(
        printed_config(capsys, main, "vision-cls", "-c", GPU, "-c", experiment, "-c", ATTACKS / "pixel.yaml")
    )
    assert protocols["clean"] == protocols["imagenet_c"] == f"ours: {bf16}"
    assert protocols["imagenet_a"] == "ours: precision=bf16-mixed (published: 32-true)"
    pixel = "space=pixel (published: reference); labels=ground_truth (published: predicted)"
    assert protocols["attack/fgsm-pixel"] == protocols["attack/pgd-pixel"] == f"ours: {pixel}; {bf16}"
    assert protocols["attack/spsa-pixel"] == (
        f"ours: {pixel}; steps=20 (published: 10); spsa_gradient=iterate (published: cleverhans); {bf16}"
    )


def test_a_partial_imagenet_c_is_not_the_published_mean(capsys):
    config = printed_config(
        capsys, main, "vision-cls", "-c", CPU, "-c", IMAGENET_CONFIGS[0], "--data.eval.severities=[1, 2]"
    )
    (protocol,) = ROBUSTNESS_REPORT.protocol_of(config, ["imagenet_c/mean_acc1"]).values()
    assert protocol.differences == (
        "severities=[1, 2] (published: [1, 2, 3, 4, 5])",
        "not all 15 corruptions x 5 severities ran (no imagenet_c/mCE), the mean is over those found",
    )


def test_a_config_saved_before_the_data_eval_group_keeps_its_protocol(capsys):
    config = printed_config(
        capsys, main, "vision-cls", "-c", GPU, "-c", IMAGENET_CONFIGS[0], "-c", ATTACKS / "published.yaml",
        "--trainer.precision=32-true", "--data.eval.severities=[1, 2]",
    )  # fmt: skip
    old = copy.deepcopy(config)
    group = old["data"].pop("eval")
    old["data"] |= {"eval_subset": group["subset"], "severities": group["severities"]}  # the flat keys it replaced
    assert texts(old) == texts(config)
    assert "severities=[1, 2] (published: [1, 2, 3, 4, 5])" in texts(old)["imagenet_c"]
    subset = "eval.subset=8 (published: null (every image))"
    old["data"]["eval_subset"] = 8
    assert subset in texts(old)["clean"]
    config["data"]["eval"]["subset"] = 8
    assert subset in texts(config)["clean"]


def two_class_tree(digits: Path, root: Path) -> Path:
    """An ImageFolder tree with the digits 0 and 1: two training images and one validation image each."""
    for split, count in (("train", 2), ("val", 1)):
        for label in ("0", "1"):
            (root / split / label).mkdir(parents=True)
            for image in sorted((digits / split / label).glob("*.png"))[:count]:
                shutil.copy(image, root / split / label / image.name)
    return root


def hparams(run_dir: Path) -> dict[str, str]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {key: value.string_value for key, value in start.hparams.items()}


@pytest.mark.slow
@NEW_CHECKPOINT_DIR
@pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
def test_published_and_default_test_runs_are_tagged_and_never_averaged(tmp_path, digits_cache_dir, capsys):
    tree = two_class_tree(digits_cache_dir / "digits-32px", tmp_path / "tree")
    options = smoke_options(
        SMOKE, tmp_path, digits_cache_dir, "--data.builtin=null", f"--data.root={tree}", "--data.eval.subset=null",
        "--data.crop_pct=0.875", "--data.batch_size=2", "--trainer.log_every_n_steps=1",
    )  # fmt: skip
    fit = run_cli(main, "vision-cls", "fit", *options)
    checkpoint = f"--ckpt_path={fit.trainer.checkpoint_callback.last_model_path}"
    published = Path(
        run_cli(main, "vision-cls", "test", *options, "-c", ATTACKS / "published.yaml", checkpoint).trainer.log_dir
    )
    default = Path(run_cli(main, "vision-cls", "test", *options, checkpoint).trainer.log_dir)

    record = json.loads((published / "protocol.json").read_text())
    for tag in PUBLISHED_ATTACKS:
        assert record[f"attack/{tag}"] == {
            "protocol": "published",
            "comparable_with_published": True,
            "differences": [],
        }
    assert record["clean"]["comparable_with_published"] and not record["corrupted"]["comparable_with_published"]
    assert "- `attack/pgd-reference-predicted`: published\n" in (published / "robustness.md").read_text()
    assert hparams(published)["protocol/attack/spsa-reference-predicted-cleverhans"] == "published"
    record = json.loads((default / "protocol.json").read_text())
    subset = "attack_batches=1 (published: null (every batch))"
    pixel = "space=pixel (published: reference); labels=ground_truth (published: predicted)"
    assert record["attack/fgsm-pixel"]["protocol"] == f"ours: {pixel}; {subset}"
    assert record["attack/pgd-pixel"]["protocol"] == f"ours: {pixel}; steps=2 (published: 20); {subset}"
    assert hparams(default)["protocol/attack/pgd-pixel"] == record["attack/pgd-pixel"]["protocol"]
    with (default / "robustness.csv").open() as stream:
        assert next(csv.reader(stream)) == ["metric", "value", "n"]  # the report's CSV keeps its format

    kpca_report([str(tmp_path / "runs"), "--task", "vision_cls"])
    with (tmp_path / "runs" / "comparison.csv").open() as stream:
        rows = {row["model"]: row for row in csv.DictReader(stream)}
    label = "rpc n_iter=2 lambd=4.0 layers=[0]"  # the same training run: told apart by their test folders
    by_test = {f"{label} (test: lightning_logs/{folder.name})": folder for folder in (published, default)}
    assert sorted(rows) == sorted(by_test)  # one training run, two evaluation protocols: two rows, one run each
    for name in by_test:
        assert (rows[name]["runs"], rows[name]["seeds"]) == ("1", "0")
        assert rows[name]["clean/acc1"] and rows[name]["protocol:clean"] == "published"
    published_row, default_row = (rows[name] for name in by_test)
    assert published_row["protocol:attack/pgd-reference-predicted"] == "published"
    assert (
        published_row["attack/pgd-pixel/eps2/acc1"] == default_row["attack/pgd-reference-predicted/eps1/acc1"] == "nan"
    )
    assert default_row["protocol:attack/pgd-pixel"] == f"ours: {pixel}; steps=2 (published: 20); {subset}"
    markdown = capsys.readouterr().out
    assert "† measured under the authors' published protocol" in markdown and "- `clean`: published\n" in markdown
    assert f"- `attack/fgsm-pixel`: ours: {pixel}; {subset}\n" in markdown
    cells = {line.split(" | ")[0][2:]: line.split(" | ") for line in markdown.splitlines() if line.startswith("| rpc")}
    assert all(cells[name][2].endswith(" †") for name in by_test)  # clean/acc1, published in both rows
