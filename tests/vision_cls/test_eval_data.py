"""The data.eval group: its options and checks, its YAML and command-line spelling, and the flat keys it replaced."""

from pathlib import Path

import pytest
import yaml
from jsonargparse import ArgumentParser

from kpca.training.replaced_options import replaced_option_hint
from kpca.vision_cls.cli import main
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.eval_data import REPLACED_OPTIONS, EvalData
from kpca.vision_cls.replaced_options import REPLACED_OPTIONS as ALL_REPLACED
from tests.cli_support import CONFIGS, CPU, assert_each_replaced_option_gives, printed_config, refusal

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
NEW_SPELLING = {
    "imagenet_c_root": ("--data.imagenet_c_root=/data/c", "data.eval.imagenet_c"),
    "imagenet_a_root": ("--data.imagenet_a_root=/data/a", "data.eval.imagenet_a"),
    "imagenet_r_root": ("--data.imagenet_r_root=/data/r", "data.eval.imagenet_r"),
    "imagenet_o_root": ("--data.imagenet_o_root=/data/o", "data.eval.imagenet_o"),
    "corruptions": ("--data.corruptions=[gaussian_noise]", "data.eval.corruptions"),
    "severities": ("--data.severities=[1]", "data.eval.severities"),
    "eval_subset": ("--data.eval_subset=16", "data.eval.subset"),
}
"""Each removed flat option: a command-line use of it, and the spelling its refusal must give."""


def hint(message: str) -> str | None:
    """The hint vision-cls adds to a parser error ``message``."""
    return replaced_option_hint(message, ALL_REPLACED)


def test_every_removed_option_has_its_new_spelling():
    assert_each_replaced_option_gives(NEW_SPELLING, REPLACED_OPTIONS)


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
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(config))
    assert printed_config(capsys, main, "vision-cls", "-c", saved) == config
    parser = ArgumentParser()
    parser.add_class_arguments(ImageNetDataModule, "data")
    datamodule = parser.instantiate(parser.parse_object({"data": config["data"]})).data
    assert datamodule.eval == EvalData(**{**expected, "corruptions": ("fog",), "severities": (1, 2)})
    assert [s.name for s in datamodule.eval_sets] == ["clean", "corrupted/fog/1", "corrupted/fog/2", "imagenet_a"]


@pytest.mark.parametrize("option", sorted(NEW_SPELLING))
def test_a_removed_option_on_the_command_line_is_refused_with_its_new_spelling(
    option: str, capsys: pytest.CaptureFixture
):
    argument, new = NEW_SPELLING[option]
    error = refusal(capsys, main, "vision-cls", "fit", "-c", CPU, "-c", SMOKE, argument, "--print_config")
    assert f"unrecognized arguments: {argument}" in error and REPLACED_OPTIONS[option] in error and new in error


def test_a_removed_option_in_a_config_file_is_refused_with_its_new_spelling(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    old = tmp_path / "old.yaml"
    old.write_text("data:\n  eval_subset: 16\n")
    error = refusal(capsys, main, "vision-cls", "fit", "-c", CPU, "-c", SMOKE, "-c", old, "--print_config")
    assert "Group 'data' does not accept option 'eval_subset'" in error and REPLACED_OPTIONS["eval_subset"] in error


def test_the_hint_names_removed_options_only():
    assert "write data.eval.subset" in hint("unrecognized arguments: --data.eval_subset=16")
    message = "Group 'data' does not accept option 'imagenet_c_root'"
    assert "write data.eval.imagenet_c" in hint(message)
    assert "write data.input: dali" in hint("unrecognized arguments: --data.backend dali")
    assert hint("unrecognized arguments: --data.eval.subsets=16") is None
    assert hint("Group 'data.eval' does not accept option 'corruption'") is None
    assert hint("Group 'model' does not accept option 'severities'") is None
