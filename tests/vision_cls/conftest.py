"""Fixtures shared by the vision_cls tests: one built-in digits tree per session."""

from pathlib import Path

import pytest

from kpca.vision_cls.builtin_data import write_digits_imagefolder


@pytest.fixture(scope="session")
def digits_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``data.cache_dir`` holding the 32 px digits tree, written once (about 2 s) and shared."""
    cache = tmp_path_factory.mktemp("digits_cache")
    write_digits_imagefolder(cache / "digits-32px", image_size=32)
    return cache
