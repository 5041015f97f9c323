"""The training input path's options: data.input and data.augment_on, and their one check."""

from pathlib import Path

import pytest
from PIL import Image

from kpca.training.choices import keyed_by_choices
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.input.dali import train_input as dali_train_input
from kpca.vision_cls.input.dali.loader import DaliTrainLoader
from kpca.vision_cls.input.dali.train_input import DaliInput
from kpca.vision_cls.input.options import (
    AUGMENT_ON,
    AugmentOn,
    InputPath,
    check_input_options,
)

DEIT = "rand-m9-mstd0.5-inc1"
OK = None

# (data.input, data.augment_on, other data options) -> None (accepted) or a regex of the ValueError.
COMBINATIONS = [
    ("turbo", "device", {}, OK),
    ("turbo", "workers", {}, OK),
    ("timm", "device", {}, OK),
    ("timm", "workers", {}, OK),
    ("turbo", "device", {"builtin": "digits", "auto_augment": None, "bad_files": "skip"}, OK),
    ("timm", "workers", {"auto_augment": "original", "color_jitter": 0.4}, OK),
    ("dali", "device", {}, OK),
    ("dali", "device", {"auto_augment": None, "color_jitter": 0.0}, OK),
    ("dali", "device", {"auto_augment": "rand-m7-n3-mstd1-inc1"}, OK),
    ("pil", "device", {}, r"data.input='pil' is not one of 'turbo', 'timm', 'dali'; choose .* 'turbo' \(DataLoader"),
    ("turbo", "cpu", {}, r"data.augment_on='cpu' is not one of 'device', 'workers', 'device_randaugment'; choose"),
    ("dali", "workers", {}, r"data.augment_on=workers .* set data.augment_on=device or use data.input=turbo"),
    ("dali", "device", {"builtin": "digits"}, r"not builtin='digits'; set data.root, or use data.input=turbo"),
    ("dali", "device", {"auto_augment": "original"}, r"auto_augment='original'.*use data.input=turbo"),
    ("dali", "device", {"auto_augment": "rand-m9-tweights"}, r"dali mirrors .*section 'tweights' is not one"),
    ("dali", "device", {"auto_augment": None, "color_jitter": 0.4}, r"data.color_jitter=0.4 .* data.color_jitter=0"),
    ("dali", "device", {"bad_files": "skip"}, r"data.bad_files=skip needs DataLoader workers.*bad_files=error"),
    ("turbo", "device_randaugment", {}, OK),
    ("timm", "device_randaugment", {"auto_augment": "rand-m9-mstd0.5"}, OK),
    ("dali", "device_randaugment", {}, r"data.input=dali\s+has none: DALI runs RandAugment in its own pipeline"),
    ("turbo", "device_randaugment", {"auto_augment": None}, r"data.auto_augment=None; set such a policy"),
    ("timm", "device_randaugment", {"auto_augment": "original"}, r"data.auto_augment='original'.*augment_on=device"),
]


@pytest.mark.parametrize(("path", "augment_on", "options", "error"), COMBINATIONS)
def test_input_option_combinations(path: str, augment_on: str, options: dict, error: str | None):
    options = {"builtin": None, "auto_augment": DEIT, "color_jitter": 0.3, "bad_files": "error", **options}
    if error is None:
        check_input_options(path, augment_on, **options)
    else:
        with pytest.raises(ValueError, match=error):
            check_input_options(path, augment_on, **options)


def test_the_datamodule_runs_the_check():
    with pytest.raises(ValueError, match="data.input='pil' is not one of 'turbo', 'timm', 'dali'"):
        ImageNetDataModule(builtin="digits", input="pil")
    with pytest.raises(ValueError, match="not builtin='digits'"):
        ImageNetDataModule(builtin="digits", input="dali")


def test_a_table_keyed_by_a_literal_must_cover_exactly_its_values():
    with pytest.raises(TypeError, match=r"\['timm', 'turbo'\] are not the values of"):
        keyed_by_choices(InputPath, {"turbo": "", "timm": ""})
    with pytest.raises(TypeError, match="not the values of"):
        keyed_by_choices(AugmentOn, {**AUGMENT_ON, "cpu": ""})


def test_dali_lists_the_training_files_and_reads_them_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """With data.input=dali the datamodule holds the DALI path: ``setup("fit")`` lists the training files (no
    ImageFolder, no worker transform) and the loader reads them; the validation set is built as on every path."""
    for split in ("train", "val"):
        for wnid in ("n01440764", "n01443537"):
            (tmp_path / split / wnid).mkdir(parents=True)
            Image.new("RGB", (40, 30)).save(tmp_path / split / wnid / "image.JPEG")
    monkeypatch.setattr(dali_train_input, "require_dali", lambda: None)  # DALI itself is not needed to plan the epoch
    data = ImageNetDataModule(root=str(tmp_path), input="dali", batch_size=2, repeated_aug=1, num_workers=0)
    data.setup("fit")
    train_input = data.train_input
    assert isinstance(train_input, DaliInput) and not hasattr(train_input, "transform") and len(data.val_set) == 2
    assert [Path(path).parent.name for path, _ in train_input.samples] == ["n01440764", "n01443537"]
    loader = data.train_dataloader()
    assert isinstance(loader, DaliTrainLoader) and loader.samples == train_input.samples and len(loader) == 1
