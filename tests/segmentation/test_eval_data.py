"""The data.eval group: its options and checks, its YAML and command-line spelling, and the test loaders it gives (the
same sets, images and seeds as the flat options gave)."""

from pathlib import Path

import numpy as np
import pytest
import yaml
from jsonargparse import ArgumentParser

from kpca.segmentation.cli import main
from kpca.segmentation.corruption_sets import CorruptionSet
from kpca.segmentation.data import ADE20KDataModule, CorruptImage, build_transforms
from kpca.segmentation.eval_data import EvalData
from kpca.training.images.corruptions import IMAGENET_C_CORRUPTIONS
from tests.cli_support import CONFIGS, CPU, printed_config
from tests.segmentation.conftest import SMOKE_SET

pytestmark = pytest.mark.mmseg

SMOKE = CONFIGS / "segmentation" / "smoke.yaml"


def cpu_config(capsys: pytest.CaptureFixture, *options: object) -> dict:
    """The config ``segmentation test -c cpu.yaml *options`` would save."""
    return printed_config(capsys, main, "segmentation", "-c", CPU, *options)


def datamodule_of(config: dict) -> ADE20KDataModule:
    """The datamodule that the ``data`` section of a parsed or saved config builds."""
    parser = ArgumentParser()
    parser.add_class_arguments(ADE20KDataModule, "data")
    return parser.instantiate(parser.parse_object({"data": config["data"]})).data


def test_the_options_are_checked_when_given():
    with pytest.raises(ValueError, match=r"data.eval.subset=0 must be positive, or None"):
        EvalData(subset=0)
    with pytest.raises(ValueError, match=r"data.eval.corruption_preset='ade20k-c' is not one of"):
        EvalData(corruption_preset="ade20k-c")
    with pytest.raises(ValueError, match=r"Unknown corruption.*'gausian_noise'"):
        EvalData(corruptions=("gausian_noise",))
    with pytest.raises(ValueError, match=r"severities must be integers in 1-5"):
        EvalData(severities=(0,))
    with pytest.raises(ValueError, match=r"data.eval.severities lists \[2\] more than once"):
        EvalData(severities=(2, 1, 2))


def test_the_defaults_are_the_imagenet_c_preset_on_every_image():
    options = EvalData()
    assert options.corruption_set == CorruptionSet(IMAGENET_C_CORRUPTIONS, (1, 2, 3, 4, 5))
    assert options.subset is None and options.corruption_seed == 0
    assert EvalData(corruptions=()).eval_sets() == [("clean", None, None)]  # clean only


def test_lists_from_python_are_kept_as_tuples():
    options = EvalData(corruptions=["fog"], severities=[1, 3])
    assert options == EvalData(corruptions=("fog",), severities=(1, 3)) and hash(options)
    assert options.eval_sets() == [("clean", None, None), ("fog/s1", "fog", 1), ("fog/s3", "fog", 3)]


def test_the_group_round_trips_through_a_saved_config(capsys: pytest.CaptureFixture, tmp_path: Path):
    options = ("--data.eval.corruption_preset=elliptical", "--data.eval.severities=[3]", "--data.eval.subset=2")
    config = cpu_config(capsys, "-c", SMOKE, *options)
    expected = {
        "corruption_preset": "elliptical",
        "corruptions": ["gaussian_noise"],  # smoke.yaml's
        "severities": [3],
        "corruption_seed": 0,
        "subset": 2,
    }
    assert config["data"]["eval"] == expected
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(config))
    assert printed_config(capsys, main, "segmentation", "-c", saved) == config
    datamodule = datamodule_of(config)
    assert datamodule.eval == EvalData("elliptical", ("gaussian_noise",), (3,), 0, 2)
    assert datamodule.eval_sets == [("clean", None, None), ("gaussian_noise/s3", "gaussian_noise", 3)]


def test_the_configs_test_the_same_sets_as_before(capsys: pytest.CaptureFixture):
    demo = cpu_config(capsys, "-c", CONFIGS / "segmentation" / "demo_synthetic.yaml")
    demo_corruptions = ("gaussian_noise", "defocus_blur", "contrast", "jpeg_compression")
    expected = [f"{c}/s{s}" for c in demo_corruptions for s in (1, 2, 3, 4, 5)]
    assert [name for name, _, _ in datamodule_of(demo).eval_sets] == ["clean", *expected]
    ade20k = cpu_config(capsys, "-c", CONFIGS / "segmentation" / "segmenter-tiny_rpc_8xb1-64e_ade20k-512.yaml")
    expected = [f"{c}/s{s}" for c in IMAGENET_C_CORRUPTIONS for s in (1, 2, 3, 4, 5)]
    assert [name for name, _, _ in datamodule_of(ade20k).eval_sets] == ["clean", *expected]


def test_the_test_loaders_hold_the_chosen_images(capsys: pytest.CaptureFixture, seg_cache_dir: Path):
    config = cpu_config(capsys, "-c", SMOKE, f"--data.cache_dir={seg_cache_dir}", "--data.eval.subset=2")
    datamodule = datamodule_of(config)
    datamodule.setup("test")
    loaders = datamodule.test_dataloader()
    names = [[name for batch in loader for name in batch["names"]] for loader in loaders]
    assert [name for name, _, _ in datamodule.eval_sets] == ["clean", "gaussian_noise/s1", "gaussian_noise/s2"]
    assert names == [["ADE_val_00000000", "ADE_val_00000002"]] * 3  # 2 of the 4, evenly spaced
    datamodule = datamodule_of({"data": {**config["data"], "eval": {"corruptions": [], "subset": None}}})
    datamodule.setup("test")
    (clean,) = datamodule.test_dataloader()
    assert len(clean.dataset) == SMOKE_SET.num_val == 4


@pytest.mark.parametrize("seed", [0, 5])
def test_each_corrupted_image_is_corrupted_with_the_given_seed(seed: int, seg_cache_dir: Path):
    options = EvalData(corruptions=("gaussian_noise",), severities=(2,), corruption_seed=seed, subset=1)
    datamodule = ADE20KDataModule(
        builtin="synthetic",
        synthetic=SMOKE_SET,
        cache_dir=seg_cache_dir,
        num_workers=0,
        scale=(192, 48),
        eval=options,
    )  # 48 px images stay 48 px: the test image is the corrupted original
    datamodule.setup("test")
    batch = next(iter(datamodule.test_dataloader()[1]))
    path = datamodule.data_root / "images" / "validation" / "ADE_val_00000000.jpg"
    (load,) = build_transforms([{"type": "LoadImageFromFile"}])
    for corruption_seed, same in ((seed, True), (seed + 1, False)):
        bgr = CorruptImage("gaussian_noise", 2, corruption_seed)(load({"img_path": str(path)}))["img"]
        expected = np.ascontiguousarray(bgr[..., ::-1]).transpose(2, 0, 1)  # (3, H, W) RGB
        image = np.rint(batch["images"][0].numpy() * 255).astype(np.uint8)
        assert np.array_equal(image, expected) is same
