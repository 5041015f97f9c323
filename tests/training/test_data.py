"""Data helpers: global batch split, evaluation subsets, setup guard, unpadded sampler, cache folder."""

from pathlib import Path

import pytest

from kpca.training.data import (
    UnpaddedDistributedSampler,
    default_cache_dir,
    evenly_spaced,
    per_device_batch_size,
    require_built,
)


def test_per_device_batch_size_splits_the_global_batch():
    assert per_device_batch_size(1024, 8) == 128
    assert per_device_batch_size(5, 1) == 5


@pytest.mark.parametrize(("global_batch", "world_size", "multiple"), [(1000, 3, 999), (2, 3, 3)])
def test_per_device_batch_size_names_the_key_and_a_multiple(global_batch, world_size, multiple):
    with pytest.raises(ValueError, match=rf"batch_size={global_batch} .*world_size={world_size}") as error:
        per_device_batch_size(global_batch, world_size)
    assert f"set data.batch_size to a multiple of {world_size}, e.g. {multiple}." in str(error.value)
    assert multiple % world_size == 0 and multiple > 0


def test_per_device_batch_size_names_a_custom_key():
    with pytest.raises(ValueError, match=r"set data\.tokens_per_batch to a multiple of 4"):
        per_device_batch_size(10, 4, name="data.tokens_per_batch")


@pytest.mark.parametrize("world_size", [0, -1])
def test_per_device_batch_size_rejects_no_processes(world_size):
    with pytest.raises(ValueError, match=f"world_size={world_size} must be at least 1"):
        per_device_batch_size(8, world_size)


@pytest.mark.parametrize(("n", "k"), [(10, None), (10, 10), (10, 20)])
def test_evenly_spaced_none_means_all(n, k):
    assert evenly_spaced(n, k) is None


@pytest.mark.parametrize(("n", "k"), [(10, 3), (1000, 7), (5, 1), (100, 99)])
def test_evenly_spaced_picks_k_increasing_indices_over_the_range(n, k):
    indices = evenly_spaced(n, k)
    assert len(indices) == k and indices[0] == 0 and indices[-1] < n
    assert all(a < b for a, b in zip(indices, indices[1:], strict=False))
    assert indices[-1] >= n - n // k - 1  # spans the range, not just its start


def test_require_built():
    built = [object()]
    assert require_built(built, "fit") is built
    with pytest.raises(RuntimeError, match=r"call setup\('fit'\) first"):
        require_built(None, "fit")


def test_unpadded_sampler_counts_each_item_once():
    items = range(7)
    samplers = [UnpaddedDistributedSampler(items, num_replicas=3, rank=rank) for rank in range(3)]
    shards = [list(sampler) for sampler in samplers]
    assert shards == [[0, 3, 6], [1, 4], [2, 5]]
    assert [len(sampler) for sampler in samplers] == [3, 2, 2]
    assert sorted(i for shard in shards for i in shard) == list(items)


def test_default_cache_dir_honours_kpca_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("KPCA_CACHE", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("KPCA_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "kpca"
