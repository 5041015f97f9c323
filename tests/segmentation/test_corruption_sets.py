"""ADE20K-C presets: what each expands to, overrides, the datamodule's test sets, and clear errors."""

from pathlib import Path

import pytest
from imagecorruptions import get_corruption_names

from kpca.segmentation.corruption_sets import (
    CORRUPTION_PRESETS,
    CorruptionPreset,
    CorruptionSet,
    resolve_corruption_set,
)
from kpca.segmentation.data import ADE20KDataModule
from kpca.segmentation.eval_data import EvalData
from kpca.training.choices import choices

pytestmark = pytest.mark.mmseg

# KurtPask/Elliptical-Attention ADE20K/test_city_c.py:93-98: noise, extra, blur, digital, weather lists.
GROUP_ORDER = [
    "gaussian_noise", "shot_noise", "speckle_noise", "impulse_noise", "zoom_blur", "elastic_transform",
    "gaussian_blur", "motion_blur", "glass_blur", "defocus_blur", "contrast", "jpeg_compression", "saturate",
    "pixelate", "snow", "fog", "frost", "spatter", "brightness",
]  # fmt: skip
# Hendrycks & Dietterich's 15, in ImageNet-C's order.
IMAGENET_C = [
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression",
]  # fmt: skip


def test_presets_expand_to_the_published_corruption_severity_pairs():
    group = resolve_corruption_set("elliptical").pairs()
    assert group == [(c, s) for c in GROUP_ORDER for s in (1, 2, 3)] and len(group) == 57
    assert set(GROUP_ORDER) == set(get_corruption_names("all"))  # all 19 of imagecorruptions
    ours = resolve_corruption_set("imagenet-c").pairs()
    assert ours == [(c, s) for c in IMAGENET_C for s in (1, 2, 3, 4, 5)] and len(ours) == 75
    assert list(CORRUPTION_PRESETS) == list(choices(CorruptionPreset)) == ["imagenet-c", "elliptical"]


def test_given_corruptions_or_severities_replace_the_presets():
    assert resolve_corruption_set("elliptical", severities=[5]).pairs() == [(c, 5) for c in GROUP_ORDER]
    assert resolve_corruption_set("imagenet-c", corruptions=["fog"]).pairs() == [("fog", s) for s in range(1, 6)]
    assert resolve_corruption_set("elliptical", corruptions=[]).pairs() == []  # clean only


def test_datamodule_test_sets_are_clean_then_exactly_the_preset(tmp_path: Path):
    datamodule = ADE20KDataModule(root=tmp_path, eval=EvalData(corruption_preset="elliptical"))
    names = [f"{c}/s{s}" for c in GROUP_ORDER for s in (1, 2, 3)]
    assert [name for name, _, _ in datamodule.eval_sets] == ["clean", *names]
    assert datamodule.eval.corruption_set == CorruptionSet(tuple(GROUP_ORDER), (1, 2, 3))
    assert len(ADE20KDataModule(root=tmp_path).eval_sets) == 1 + 75  # the default: imagenet-c


def test_unknown_names_fail_with_the_valid_choices():
    with pytest.raises(ValueError, match=r"data.eval.corruption_preset='ade20k-c' is not one of 'imagenet-c', 'ell"):
        EvalData(corruption_preset="ade20k-c")
    with pytest.raises(ValueError, match=r"Unknown corruption\(s\) \['rain'\]; choose from \[.*'speckle_noise'"):
        resolve_corruption_set("imagenet-c", corruptions=["fog", "rain"])
    with pytest.raises(ValueError, match="severities must be integers in 1-5"):
        resolve_corruption_set("elliptical", severities=[0, 3])
    with pytest.raises(ValueError, match=r"data.eval.corruptions lists \['fog'\] more than once"):
        CorruptionSet(("fog", "snow", "fog"), (1,))
