"""The data.eval group: its options and checks, and its YAML and command-line spelling."""

from pathlib import Path

import pytest

from kpca.vision_cls.cli import main
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.eval_data import EvalData
from tests.cli_support import CONFIGS, CPU, printed_config
from tests.vision_cls.data_support import reloaded_datamodule

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"


def test_the_options_are_checked_when_given():
    with pytest.raises(ValueError, match=r"data.eval.subset=0 must be positive, or None"):
        EvalData(subset=0)
    with pytest.raises(ValueError, match=r"Unknown corruption.*'gausian_noise'"):
        EvalData(corruptions=("gausian_noise",))
    with pytest.raises(ValueError, match=r"data.eval.severities is empty; list at least one of 1-5"):
        EvalData(imagenet_c="/data/imagenet-c", severities=())
    with pytest.raises(ValueError, match=r"data.image_size=16: imagecorruptions \(data.eval.corruptions\) needs"):
        ImageNetDataModule(builtin="digits", image_size=16, eval=EvalData(corruptions=("fog",)))
    ImageNetDataModule(builtin="digits", image_size=16)  # no corruptions, no limit


def test_lists_from_python_are_kept_as_tuples():
    options = EvalData(corruptions=["fog"], severities=[1, 3])
    assert options == EvalData(corruptions=("fog",), severities=(1, 3)) and hash(options)


def test_the_group_round_trips_through_a_saved_config(capsys: pytest.CaptureFixture, tmp_path: Path):
    options = ("--data.eval.corruptions=[fog]", "--data.eval.imagenet_a=/data/imagenet-a", "--data.eval.subset=7")
    config = printed_config(capsys, main, "vision-cls", "-c", CPU, "-c", SMOKE, *options)
    expected = {
        "imagenet_c": None,
        "imagenet_a": "/data/imagenet-a",
        "imagenet_r": None,
        "imagenet_o": None,
        "corruptions": ["fog"],
        "severities": [1, 2],  # smoke.yaml's
        "subset": 7,
    }
    assert config["data"]["eval"] == expected
    datamodule = reloaded_datamodule(capsys, config, tmp_path)
    assert datamodule.eval == EvalData(**{**expected, "corruptions": ("fog",), "severities": (1, 2)})
    assert [s.name for s in datamodule.eval_sets] == ["clean", "corrupted/fog/1", "corrupted/fog/2", "imagenet_a"]
