"""Data plumbing: ProjectDataModule's loaders, the datamodule contract, global batch split, subsets, cache folder."""

from pathlib import Path
from types import SimpleNamespace
from typing import Protocol

import pytest
import torch
from lightning.pytorch import LightningDataModule, Trainer
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from torch.utils.data import SequentialSampler
from torchdata.stateful_dataloader.sampler import RandomSampler

from kpca.training.data import (
    ProjectDataModule,
    UnpaddedDistributedSampler,
    default_cache_dir,
    evenly_spaced,
    per_device_batch_size,
    protocol_members,
    require_built,
    require_datamodule,
    resolve_cache_dir,
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


def test_resolve_cache_dir_puts_each_app_in_its_folder_of_kpca_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("KPCA_CACHE", str(tmp_path / "cache"))
    assert resolve_cache_dir(None, "language_model") == tmp_path / "cache" / "language_model"
    assert resolve_cache_dir(None) == tmp_path / "cache"
    assert resolve_cache_dir("~/mine", "language_model") == Path.home() / "mine"  # a given folder is used as is


def cpu_trainer() -> Trainer:
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)


def trainer_stand_in(world_size: int = 1, global_rank: int = 0, accelerator=None) -> SimpleNamespace:
    """The trainer attributes a datamodule reads, for process counts and accelerators this machine cannot start."""
    return SimpleNamespace(
        world_size=world_size, global_rank=global_rank, accelerator=accelerator or CPUAccelerator(), datamodule=None
    )


def test_pin_memory_follows_the_trainers_accelerator_not_what_the_machine_has(monkeypatch):
    data = ProjectDataModule(batch_size=4, num_workers=0)
    assert not data.train_loader(range(8)).pin_memory  # no trainer: nothing to copy to
    data.trainer = cpu_trainer()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not data.train_loader(range(8)).pin_memory and not data.eval_loader(range(8)).pin_memory
    data.trainer = trainer_stand_in(accelerator=CUDAAccelerator())
    assert data.train_loader(range(8)).pin_memory and data.eval_loader(range(8)).pin_memory
    data.pin_memory = False
    assert not data.train_loader(range(8)).pin_memory


def test_setup_splits_the_global_batch_and_eval_loaders_read_each_item_once():
    data = ProjectDataModule(batch_size=6, num_workers=0)
    data.trainer = trainer_stand_in(world_size=2, global_rank=1)
    data.setup("fit")
    assert data.batch_size_per_device == 3
    train = data.train_loader(range(10))
    assert isinstance(train.sampler, RandomSampler) and train.batch_size == 3 and train.drop_last
    evaluation = data.eval_loader(range(7))
    assert isinstance(evaluation.sampler, UnpaddedDistributedSampler) and evaluation.batch_size == 3
    assert [batch.tolist() for batch in evaluation] == [[1, 3, 5]] and not evaluation.drop_last
    data.eval_batch_size = 1
    assert data.eval_loader(range(7)).batch_size == 1
    data.trainer = trainer_stand_in(world_size=4)
    with pytest.raises(ValueError, match=r"set data.batch_size to a multiple of 4"):
        data.setup("fit")


def test_loaders_without_a_trainer_run_in_one_process_in_order():
    data = ProjectDataModule(batch_size=4, num_workers=0, eval_batch_size=3)
    data.setup("validate")
    evaluation = data.eval_loader(range(7))
    assert isinstance(evaluation.sampler, SequentialSampler)
    assert [batch.tolist() for batch in evaluation] == [[0, 1, 2], [3, 4, 5], [6]]
    ordered = data.train_loader(range(6), sampler=SequentialSampler(range(6)), drop_last=False, collate_fn=list)
    assert list(ordered) == [[0, 1, 2, 3], [4, 5]]  # the given sampler and collate, no shuffling


def test_workers_settings_apply_only_with_workers():
    with_workers = ProjectDataModule(
        batch_size=2, num_workers=2, persistent_workers=True, multiprocessing_context="spawn"
    ).train_loader(range(4))
    assert with_workers.persistent_workers and with_workers.multiprocessing_context is not None
    assert with_workers.num_workers == 2
    in_process = ProjectDataModule(
        batch_size=2, num_workers=0, persistent_workers=True, multiprocessing_context="spawn"
    ).train_loader(range(4))
    assert not in_process.persistent_workers and in_process.multiprocessing_context is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0, "num_workers": 0}, "batch_size=0 must be positive"),
        ({"batch_size": 2, "num_workers": -1}, "num_workers=-1 must be 0"),
        ({"batch_size": 2, "num_workers": 0, "eval_batch_size": 0}, "eval_batch_size=0 must be positive"),
    ],
)
def test_bad_loader_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ProjectDataModule(**kwargs)


class Readable(Protocol):
    """A contract with an attribute, a property and a method."""

    batch_size: int

    @property
    def eval_sets(self) -> list[str]:
        """Sets."""

    def class_indices(self, name: str) -> list[int] | None:
        """Columns."""


class ReadableData(LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 4

    @property
    def eval_sets(self) -> list[str]:
        raise OSError("reads folders: the contract check must not run it")

    def class_indices(self, name: str) -> list[int] | None:
        return None


def test_protocol_members_lists_attributes_properties_and_methods():
    assert protocol_members(Readable) == ["batch_size", "class_indices", "eval_sets"]


def test_require_datamodule_returns_a_datamodule_that_has_every_member_without_running_them():
    data = ReadableData()
    assert require_datamodule(SimpleNamespace(datamodule=data), Readable) is data


def test_require_datamodule_names_what_another_datamodule_lacks():
    with pytest.raises(
        TypeError,
        match=r"LightningDataModule is not a Readable: it lacks \['batch_size', 'class_indices', 'eval_sets'\]",
    ):
        require_datamodule(SimpleNamespace(datamodule=LightningDataModule()), Readable)
    with pytest.raises(RuntimeError, match="reads Readable .* but the trainer has none; pass datamodule="):
        require_datamodule(SimpleNamespace(datamodule=None), Readable)
