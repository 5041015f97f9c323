"""What the vision data-option tests share: a printed config saved, read back, and built into its datamodule."""

from pathlib import Path

import pytest
import yaml
from jsonargparse import ArgumentParser

from kpca.vision_cls.cli import main
from kpca.vision_cls.data import ImageNetDataModule
from tests.cli_support import printed_config


def reloaded_datamodule(capsys: pytest.CaptureFixture, config: dict, tmp_path: Path) -> ImageNetDataModule:
    """The datamodule that ``config`` (a printed ``vision-cls`` config) builds.

    First the config is saved as ``config.yaml`` and read back with ``-c``, which must print the same config.
    """
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(config))
    assert printed_config(capsys, main, "vision-cls", "-c", saved) == config
    parser = ArgumentParser()
    parser.add_class_arguments(ImageNetDataModule, "data")
    return parser.instantiate(parser.parse_object({"data": config["data"]})).data
