"""Data plumbing every app shares: :class:`ProjectDataModule`, the module <-> datamodule contract, data helpers.

:class:`ProjectDataModule` owns what no app does differently: the global batch split over processes, the
DataLoaders (workers, pinned memory for the trainer's accelerator, the unpadded evaluation sampler under DDP) and
the cache folder (``$KPCA_CACHE``). An app's datamodule subclasses it and keeps only its own data: datasets,
transforms, tokenizers, corruption sets. What a LightningModule reads from its datamodule is a ``typing.Protocol``
in the app's ``data.py``; :func:`require_datamodule` checks the trainer's datamodule against it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sized
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.accelerators import CPUAccelerator
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from kpca.training.cache_folder import default_cache_dir
from kpca.training.data_checks.problems import DataProblem
from kpca.training.errors import OptionError
from kpca.training.resumable import ResumableLoader, resumable_loader

T = TypeVar("T")
P = TypeVar("P")
_MISSING = object()


def resolve_cache_dir(cache_dir: str | Path | None, app_folder: str = "") -> Path:
    """The cache folder of an app: ``cache_dir`` (``~`` expanded) if given, else ``default_cache_dir() / app_folder``.

    Args:
        cache_dir: the ``data.cache_dir`` setting; None for the default.
        app_folder: the app's sub-folder of the default cache (``""``: the cache itself).
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return default_cache_dir() / app_folder


def per_device_batch_size(global_batch: int, world_size: int, name: str = "data.batch_size") -> int:
    """Split a global batch evenly over ``world_size`` processes (devices × nodes).

    Args:
        global_batch: the batch summed over every process.
        world_size: number of processes.
        name: the config key that set ``global_batch``, named in the error.

    Raises:
        ValueError: If ``global_batch`` is not a positive multiple of ``world_size``.
    """
    if world_size < 1:
        raise OptionError(f"world_size={world_size} must be at least 1.")
    if global_batch < world_size or global_batch % world_size:
        lower = max(world_size, global_batch // world_size * world_size)
        raise OptionError(
            f"{name.rsplit('.', 1)[-1]}={global_batch} (the global batch) is not divisible by world_size={world_size} "
            f"(devices × nodes); set {name} to a multiple of {world_size}, e.g. {lower}."
        )
    return global_batch // world_size


def evenly_spaced(n: int, k: int | None) -> list[int] | None:
    """``k`` indices spread evenly over ``range(n)`` (every class of a class-sorted set is hit), or None for all.

    None also when ``k`` is None or ``k >= n``.
    """
    return None if k is None or k >= n else [i * n // k for i in range(k)]


def require_built(value: T | None, stage: str) -> T:
    """``value`` (a dataset or list of datasets built by ``setup``), or RuntimeError saying to call ``setup``."""
    if value is None:
        raise RuntimeError(f"The datasets are not built; call setup({stage!r}) first (the Trainer does).")
    return value


class UnpaddedDistributedSampler(DistributedSampler):
    """Evaluation sampler: rank r takes items r, r + R, r + 2R, ... in order, without padding.

    Lightning's ``DistributedSampler`` pads every rank to the same length by repeating items, which would count
    those items twice in metrics summed over ranks; here each item is counted exactly once (ranks may get one
    item fewer, which is fine: evaluation runs no collective per step). Being a ``DistributedSampler``, Lightning
    uses it as is.

    Args:
        dataset: the evaluation set (only its length is used).
        num_replicas: number of processes R.
        rank: this process's rank r.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.num_samples = len(range(rank, len(dataset), num_replicas))
        self.total_size = len(dataset)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))


def protocol_members(protocol: type) -> list[str]:
    """The public attributes, properties and methods a ``typing.Protocol`` class declares (its bases' included)."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        names.update(name for name in (*vars(cls), *getattr(cls, "__annotations__", {})) if not name.startswith("_"))
    return sorted(names)


def require_datamodule(trainer: pl.Trainer, protocol: type[P]) -> P:
    """The trainer's datamodule, checked to provide every member of ``protocol`` (what the caller reads from it).

    Members are looked up without evaluating them (a property that reads folders is not run), so the check is cheap
    and never fails for another reason than a missing member.

    Args:
        trainer: the trainer whose ``datamodule`` is read.
        protocol: the app's contract, e.g. ``VisionData``.

    Raises:
        RuntimeError: If the trainer runs without a datamodule (dataloaders were passed instead).
        TypeError: If the datamodule lacks members of ``protocol``; the error names them.
    """
    members = protocol_members(protocol)
    datamodule = trainer.datamodule
    if datamodule is None:
        raise RuntimeError(
            f"This module reads {protocol.__name__} ({', '.join(members)}) from the trainer's datamodule, but the "
            "trainer has none; pass datamodule=... (the app's data section) instead of dataloaders."
        )
    missing = [name for name in members if inspect.getattr_static(datamodule, name, _MISSING) is _MISSING]
    if missing:
        raise TypeError(
            f"{type(datamodule).__name__} is not a {protocol.__name__}: it lacks {missing}. Use the app's datamodule, "
            f"or give yours every member of {protocol.__name__} ({', '.join(members)})."
        )
    return datamodule


class ProjectDataModule(pl.LightningDataModule):
    """The loader plumbing of every app's datamodule: the global batch split, DataLoaders and the cache folder.

    A subclass passes its loader settings to ``__init__``, calls ``super().setup(stage)`` first in its ``setup``
    (which splits the global batch over the processes), and builds its loaders with :meth:`train_loader` and
    :meth:`eval_loader`. Memory is pinned only when asked and the trainer's accelerator is not the CPU (not when
    CUDA merely exists: a CPU run on a GPU machine does not pin). Evaluation loaders read each item on exactly one
    rank under DDP (:class:`UnpaddedDistributedSampler`). A subclass implements :meth:`check_data`, which the
    ``check-data`` subcommand runs.

    Args:
        batch_size: global training batch over all devices and nodes; each process loads
            ``batch_size // world_size`` (:meth:`setup` raises ValueError if it does not divide).
        num_workers: DataLoader worker processes per device (0 loads in the main process).
        cache_dir: where generated data goes; None: ``$KPCA_CACHE`` (else ``~/.cache/kpca``) / ``app_folder``.
        app_folder: the app's sub-folder of the default cache (``""``: the cache itself).
        eval_batch_size: evaluation items per device and step; None: the per-device training batch.
        pin_memory: pin batches in page-locked memory when the trainer's accelerator is not the CPU.
        persistent_workers: keep the workers between epochs (only with workers).
        multiprocessing_context: start method of the workers (``fork``, ``spawn``, ``forkserver``); None: the
            platform default (only with workers).
    """

    moved_options: ClassVar[Mapping[str, str]] = {}
    """Options that moved into a group, ``{old name: new dotted name}`` under ``data``: checkpoints and config files
    saved before the move are read at the new place (:mod:`kpca.training.moved_options`)."""

    def __init__(
        self,
        *,
        batch_size: int,
        num_workers: int,
        cache_dir: str | Path | None = None,
        app_folder: str = "",
        eval_batch_size: int | None = None,
        pin_memory: bool = True,
        persistent_workers: bool = False,
        multiprocessing_context: str | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise OptionError(f"batch_size={batch_size} must be positive (it is the global batch over all devices).")
        if num_workers < 0:
            raise OptionError(f"num_workers={num_workers} must be 0 (load in the main process) or more.")
        if eval_batch_size is not None and eval_batch_size < 1:
            raise OptionError(f"eval_batch_size={eval_batch_size} must be positive, or None for the training share.")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.cache_dir = resolve_cache_dir(cache_dir, app_folder)
        self.eval_batch_size = eval_batch_size
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.multiprocessing_context = multiprocessing_context
        self.batch_size_per_device = batch_size

    def setup(self, stage: str | None = None) -> None:
        """Split the global batch over the trainer's processes (one without a trainer); subclasses call it first."""
        world_size = self.trainer.world_size if self.trainer is not None else 1
        self.batch_size_per_device = per_device_batch_size(self.batch_size, world_size)

    def check_data(self, progress: bool = True) -> tuple[int, list[DataProblem]]:
        """Check every file of the configured splits: ``(files checked, problems)``, for ``<app> check-data``.

        Called on a fresh datamodule (neither ``prepare_data`` nor ``setup`` has run; the command builds no model and no
        trainer). It verifies what can be verified (files decode, image and annotation sizes agree, label values are in
        range, text is UTF-8, splits and class folders are not empty, configured folders exist), reads the files with
        :func:`kpca.training.data_checks.check_data.check_in_workers` in ``self.num_workers`` workers (the command's
        ``--workers`` sets it), reports every problem as a :class:`kpca.training.data_checks.problems.DataProblem`
        naming the file (absolute path), the split, what is wrong (values as on disk) and the fix, and raises nothing
        for damaged data. It may write what ``prepare_data`` would (built-in data, a tokenizer) and nothing else.

        Args:
            progress: show a progress bar on stderr.

        Returns:
            The number of files checked and the problems found, in a stable order.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not implement check_data(progress) -> (files checked, problems), so "
            "check-data cannot check its files; implement it as ProjectDataModule.check_data describes."
        )

    @property
    def pins_memory(self) -> bool:
        """Whether loaders pin memory: ``pin_memory`` is set and the trainer's accelerator is not the CPU."""
        return self.pin_memory and self.trainer is not None and not isinstance(self.trainer.accelerator, CPUAccelerator)

    def train_loader(
        self,
        dataset: Dataset,
        sampler: Sampler | None = None,
        drop_last: bool = True,
        collate_fn: Callable[[list], Any] | None = None,
    ) -> ResumableLoader:
        """Training batches of the per-device size, shuffled unless ``sampler`` orders them, resumable mid-epoch.

        The loader is a :class:`kpca.training.resumable.ResumableLoader`: a checkpoint taken mid-epoch holds its
        position, its sampler's epoch, its generators (the shuffled order and the workers' base seeds, seeded from
        ``PL_GLOBAL_SEED`` and the rank) and each worker's RNG states, so a resumed fit loads the batches and
        draws the worker-side augmentations of the uninterrupted one.

        Args:
            dataset: the training set.
            sampler: the sampler (a ``DistributedSampler`` built for this rank, used by Lightning as is); None
                shuffles, and under DDP Lightning swaps in its ``DistributedSampler``.
            drop_last: drop the last partial batch.
            collate_fn: how samples become a batch; None: PyTorch's default.
        """
        trainer = self.trainer
        args = self._loader_args(self.batch_size_per_device, drop_last, collate_fn)
        if trainer is None:
            return resumable_loader(dataset, 0, sampler is None, sampler, **args)
        return resumable_loader(
            dataset, trainer.global_rank, sampler is None, sampler, lambda: trainer.num_training_batches, **args
        )

    def eval_loader(self, dataset: Dataset, collate_fn: Callable[[list], Any] | None = None) -> DataLoader:
        """Evaluation batches of ``eval_batch_size`` (default the per-device training batch), in order.

        Under DDP each rank reads its share without padding (:class:`UnpaddedDistributedSampler`): Lightning's own
        ``DistributedSampler`` would repeat items so that every rank has the same length, counting them twice.
        """
        trainer = self.trainer
        sampler = None
        if trainer is not None and trainer.world_size > 1:
            sampler = UnpaddedDistributedSampler(dataset, trainer.world_size, trainer.global_rank)
        batch_size = self.eval_batch_size or self.batch_size_per_device
        # Its own generator: the workers' base seed is not drawn from the global RNG, whose draws a resumed fit
        # must repeat (persistent workers draw it at the first iteration, which a resumed fit makes later).
        args = self._loader_args(batch_size, False, collate_fn)
        return DataLoader(dataset, sampler=sampler, generator=torch.Generator(), **args)

    def _loader_args(
        self, batch_size: int, drop_last: bool, collate_fn: Callable[[list], Any] | None
    ) -> dict[str, Any]:
        """The ``DataLoader`` arguments (but dataset, order and generator) with the datamodule's workers."""
        workers = self.num_workers
        return dict(
            batch_size=batch_size,
            drop_last=drop_last,
            collate_fn=collate_fn,
            num_workers=workers,
            persistent_workers=self.persistent_workers and workers > 0,
            multiprocessing_context=self.multiprocessing_context if workers > 0 else None,
            pin_memory=self.pins_memory,
        )
