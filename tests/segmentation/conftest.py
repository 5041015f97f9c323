"""Fixtures shared by the segmentation tests: one small built-in synthetic ADE20K per session."""

from pathlib import Path

import pytest

from kpca.segmentation.builtin_data import SyntheticADE20K, write_synthetic_ade20k

# The set of configs/segmentation/smoke.yaml.
SMOKE_SET = SyntheticADE20K(num_train=16, num_val=4, image_size=48)


@pytest.fixture(scope="session")
def seg_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``data.cache_dir`` holding the smoke config's synthetic ADE20K, written once and shared."""
    cache = tmp_path_factory.mktemp("seg_cache")
    write_synthetic_ade20k(cache, SMOKE_SET)
    return cache
