"""The training input path's options: data.train.input and data.train.augment_on, and their one check."""

from pathlib import Path

import pytest
from PIL import Image

from kpca.training.choices import keyed_by_choices
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.input import TrainData
from kpca.vision_cls.input.dali import train_input as dali_train_input
from kpca.vision_cls.input.dali.loader import DaliTrainLoader
from kpca.vision_cls.input.dali.train_input import DaliInput
from kpca.vision_cls.input.options import (
    AUGMENT_ON,
    AugmentOn,
    InputPath,
    check_input_options,
    check_input_source,
)

DEIT = "rand-m9-mstd0.5-inc1"
OK = None

# (data.train.input, data.train.augment_on, other data.train options) -> None (accepted) or a regex of the ValueError.
COMBINATIONS = [
    ("turbo", "device", {}, OK),
    ("turbo", "workers", {}, OK),
    ("timm", "device", {}, OK),
    ("timm", "workers", {}, OK),
    ("turbo", "device", {"auto_augment": None, "bad_files": "skip"}, OK),
    ("timm", "workers", {"auto_augment": "original", "color_jitter": 0.4}, OK),
    ("dali", "device", {}, OK),
    ("dali", "device", {"auto_augment": None, "color_jitter": 0.0}, OK),
    ("dali", "device", {"auto_augment": "rand-m7-n3-mstd1-inc1"}, OK),
    (
        "pil",
        "device",
        {},
        r"data.train.input='pil' is not one of 'turbo', 'timm', 'dali'; choose .* 'turbo' \(DataLoader",
    ),
    (
        "turbo",
        "cpu",
        {},
        r"data.train.augment_on='cpu' is not one of 'device', 'workers', 'device_randaugment'; choose",
    ),
    (
        "dali",
        "workers",
        {},
        r"data.train.augment_on=workers .* set data.train.augment_on=device or use data.train.input=turbo",
    ),
    ("dali", "device", {"auto_augment": "original"}, r"auto_augment='original'.*use data.train.input=turbo"),
    ("dali", "device", {"auto_augment": "rand-m9-tweights"}, r"dali mirrors .*section 'tweights' is not one"),
    (
        "dali",
        "device",
        {"auto_augment": None, "color_jitter": 0.4},
        r"data.train.color_jitter=0.4 .* data.train.color_jitter=0",
    ),
    ("dali", "device", {"bad_files": "skip"}, r"data.train.bad_files=skip needs DataLoader workers.*bad_files=error"),
    ("turbo", "device_randaugment", {}, OK),
    ("timm", "device_randaugment", {"auto_augment": "rand-m9-mstd0.5"}, OK),
    ("dali", "device_randaugment", {}, r"data.train.input=dali\s+has none: DALI runs RandAugment in its own pipeline"),
    ("turbo", "device_randaugment", {"auto_augment": None}, r"data.train.auto_augment=None; set such a policy"),
    (
        "timm",
        "device_randaugment",
        {"auto_augment": "original"},
        r"data.train.auto_augment='original'.*augment_on=device",
    ),
]


@pytest.mark.parametrize(("path", "augment_on", "options", "error"), COMBINATIONS)
def test_input_option_combinations(path: str, augment_on: str, options: dict, error: str | None):
    options = {"auto_augment": DEIT, "color_jitter": 0.3, "bad_files": "error", **options}
    if error is None:
        check_input_options(path, augment_on, **options)
    else:
        with pytest.raises(ValueError, match=error):
            check_input_options(path, augment_on, **options)


def test_the_group_and_the_datamodule_run_the_checks():
    with pytest.raises(ValueError, match="data.train.input='pil' is not one of 'turbo', 'timm', 'dali'"):
        TrainData(input="pil")
    with pytest.raises(ValueError, match="not data.builtin='digits'"):
        ImageNetDataModule(builtin="digits", train=TrainData(input="dali"))


def test_only_dali_needs_an_image_folder():
    for path in ("turbo", "timm"):
        check_input_source(path, "digits")
    check_input_source("dali", None)
    with pytest.raises(ValueError, match=r"not data.builtin='digits'; set data.root, or use data.train.input=turbo"):
        check_input_source("dali", "digits")


def test_a_table_keyed_by_a_literal_must_cover_exactly_its_values():
    with pytest.raises(TypeError, match=r"\['timm', 'turbo'\] are not the values of"):
        keyed_by_choices(InputPath, {"turbo": "", "timm": ""})
    with pytest.raises(TypeError, match="not the values of"):
        keyed_by_choices(AugmentOn, {**AUGMENT_ON, "cpu": ""})


def test_dali_lists_the_training_files_and_reads_them_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """With data.train.input=dali the datamodule holds the DALI path: ``setup("fit")`` lists the training files (no
    ImageFolder, no worker transform) and the loader reads them; the validation set is built as on every path."""
    for split in ("train", "val"):
        for wnid in ("n01440764", "n01443537"):
            (tmp_path / split / wnid).mkdir(parents=True)
            Image.new("RGB", (40, 30)).save(tmp_path / split / wnid / "image.JPEG")
    monkeypatch.setattr(dali_train_input, "require_dali", lambda: None)  # DALI itself is not needed to plan the epoch
    data = ImageNetDataModule(
        root=str(tmp_path), batch_size=2, num_workers=0, train=TrainData(input="dali", repeated_aug=1)
    )
    data.setup("fit")
    train_input = data.train_input
    assert isinstance(train_input, DaliInput) and not hasattr(train_input, "transform") and len(data.val_set) == 2
    assert [Path(path).parent.name for path, _ in train_input.samples] == ["n01440764", "n01443537"]
    loader = data.train_dataloader()
    assert isinstance(loader, DaliTrainLoader) and loader.samples == train_input.samples and len(loader) == 1
