"""Protocol provenance of the segmentation report: the rules against the shipped configs, and what ``test`` records.

docs/protocols.md lists differences that no setting removes for both groups (the test resize; how ADE20K-C is made), so
neither is ever ``published``; ``data.eval.corruption_preset: elliptical`` removes the one a setting can remove. A
config saved before the ``data.eval`` group, with the flat keys, gets the same protocol.
"""

import json
from pathlib import Path

import pytest
import yaml

from kpca.segmentation.cli import main
from kpca.segmentation.corruption_sets import ELLIPTICAL_SET
from kpca.segmentation.evaluation import (
    KEEP_RATIO_RESIZE,
    ON_THE_FLY_CORRUPTIONS,
    SEGMENTATION_REPORT,
    write_reports,
)
from tests.cli_support import CONFIGS, printed_config

pytestmark = pytest.mark.mmseg

GPU = CONFIGS / "trainer" / "gpu_1x_bf16.yaml"
ADE20K = sorted((CONFIGS / "segmentation").glob("segmenter-*_ade20k-512.yaml"))
METRICS = ["clean/mIoU", "corrupted/mIoU"]


def differences(config: dict) -> dict[str, tuple[str, ...]]:
    return {group: p.differences for group, p in SEGMENTATION_REPORT.protocol_of(config, METRICS).items()}


@pytest.mark.parametrize("experiment", ADE20K, ids=lambda path: path.stem)
def test_the_elliptical_preset_leaves_only_the_differences_no_setting_removes(experiment: Path, capsys):
    config = printed_config(
        capsys, main, "segmentation", "-c", GPU, "-c", experiment, "--data.eval.corruption_preset=elliptical"
    )
    assert differences(config) == {
        "clean": (KEEP_RATIO_RESIZE,),
        "corrupted": (KEEP_RATIO_RESIZE, ON_THE_FLY_CORRUPTIONS),
    }


def test_the_default_preset_is_named_as_a_difference(capsys):
    config = printed_config(capsys, main, "segmentation", "-c", GPU, "-c", ADE20K[0])
    assert differences(config)["corrupted"] == (
        "corruption_preset=imagenet-c (published: elliptical)",
        KEEP_RATIO_RESIZE,
        ON_THE_FLY_CORRUPTIONS,
    )
    config["data"]["eval"] |= {"corruption_preset": "elliptical", "corruptions": ["fog"], "severities": [1]}
    config["model"]["stride"] = 256
    assert differences(config)["corrupted"][:3] == (
        "stride=256 (published: 512)",
        "corruptions=[fog] (published: null (the elliptical preset's 19))",
        "severities=[1] (published: null (the elliptical preset's 1-3))",
    )
    config["data"]["eval"] |= {"corruptions": list(reversed(ELLIPTICAL_SET.corruptions)), "severities": [3, 2, 1]}
    assert differences(config)["corrupted"] == (
        "stride=256 (published: 512)",
        KEEP_RATIO_RESIZE,
        ON_THE_FLY_CORRUPTIONS,
    )


def saved_before_the_eval_group(config: dict) -> dict:
    """``config`` as a run saved it before ``data.eval``: the group's options flat under ``data``."""
    data = dict(config["data"])
    group = data.pop("eval")
    data |= {("eval_subset" if key == "subset" else key): value for key, value in group.items()}
    return {**config, "data": data}


def test_a_config_saved_with_the_flat_keys_gets_the_same_protocol(capsys):
    config = printed_config(capsys, main, "segmentation", "-c", GPU, "-c", ADE20K[0])
    old = saved_before_the_eval_group(config)
    assert "eval" not in old["data"] and old["data"]["corruption_preset"] == "imagenet-c"
    assert differences(old) == differences(config)
    assert "corruption_preset=imagenet-c (published: elliptical)" in differences(old)["corrupted"]
    config["data"]["eval"] |= {
        "corruption_preset": "elliptical",
        "corruptions": ["fog"],
        "severities": [2],
        "subset": 3,
    }
    old = saved_before_the_eval_group(config)
    assert old["data"]["eval_subset"] == 3
    assert differences(old) == differences(config)
    assert differences(old)["corrupted"][:4] == (
        "eval.subset=3 (published: null (every image))",
        "corruptions=[fog] (published: null (the elliptical preset's 19))",
        "severities=[2] (published: null (the elliptical preset's 1-3))",
        KEEP_RATIO_RESIZE,
    )


def test_the_report_records_the_protocol_of_the_config_saved_beside_it(tmp_path: Path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"data": {"eval": {"corruption_preset": "elliptical"}}}))
    metrics = {"aAcc": 0.9, "mAcc": 0.8, "mIoU": 0.7, "IoU": [0.7, 0.7], "Acc": [0.8, 0.8]}
    write_reports({"clean": metrics}, [("clean", None, None)], ["wall", "floor"], tmp_path)
    record = json.loads((tmp_path / "protocol.json").read_text())
    assert list(record) == ["clean"] and record["clean"]["comparable_with_published"] is False
    assert record["clean"]["differences"][0] == "window not recorded (published: 512)"
    assert record["clean"]["differences"][-1] == KEEP_RATIO_RESIZE
    markdown = (tmp_path / "segmentation.md").read_text()
    assert "## Protocol" in markdown and "- `clean`: ours: window not recorded (published: 512);" in markdown
    assert "## Protocol" not in (tmp_path / "per_class_clean.md").read_text()
