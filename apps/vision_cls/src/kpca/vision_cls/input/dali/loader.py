"""The DALI training input path (``data.train.input: dali``): the loader Lightning iterates.

The pipeline (:mod:`kpca.vision_cls.input.dali.graph`) mirrors the workers' DeiT recipe (timm's
``transforms_imagenet_train``, :class:`~kpca.vision_cls.input.dali.recipe.DaliTrainRecipe`) up to the uint8 crop:
``fn.readers.file`` -> ``fn.decoders.image_random_crop`` (the random-resized-crop window, decoded as a region of
interest) -> ``fn.resize`` to ``image_size`` -> horizontal flip -> timm's RandAugment
(:mod:`kpca.vision_cls.input.dali.tables`) -> (C, S, S) uint8. The device tail (float
conversion, random erasing) and Mixup/CutMix then run unchanged after transfer. On a GPU the decoder is ``mixed``
(nvJPEG) and every later stage runs on the GPU; on a CPU trainer the same graph runs on CPU operators.

Which images a rank reads, and in which order, is decided by the sampler the DataLoader paths have under DDP
(:func:`kpca.vision_cls.input.samplers.rank_sampler`: a ``DistributedSampler`` seeded with ``PL_GLOBAL_SEED``, as
Lightning injects, or DeiT's ``RepeatAugSampler``): each epoch builds a pipeline whose reader walks that epoch's index
list in order. So every input path reads the same files per rank and step, and an epoch ends where the workers'
``drop_last=True`` loader ends.

``nvidia.dali`` is imported lazily, inside the functions that need it (:func:`require_dali`, and an epoch's start,
which imports :mod:`~kpca.vision_cls.input.dali.graph`): the default install never imports it.

Legend: B batch, C channels (3), S output side (``image_size``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DistributedSampler
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

from kpca.training.errors import OptionError
from kpca.vision_cls.input.dali.recipe import DaliTrainRecipe

DALI_INSTALL = "pip install 'kpca-vision-cls[dali]'"


def require_dali() -> None:
    """Import ``nvidia.dali``; ImportError with the install command if it is missing or broken."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"data.train.input=dali needs NVIDIA DALI, which is not importable ({error}). Install the extra: "
            f"{DALI_INSTALL} (or set data.train.input=turbo, the default, or data.train.input=timm)."
        ) from error


def image_folder_samples(folder: str | Path, classes: Sequence[str]) -> list[tuple[str, int]]:
    """``(path, label)`` of every image under ``folder/<class>/``, exactly as torchvision's ImageFolder lists them.

    Labels are positions in ``classes`` (ImageFolder's ``class_to_idx`` for sorted folder names); files are walked
    in ImageFolder's order with its image extensions, so index i is ImageFolder's item i.
    """
    class_to_idx = {name: i for i, name in enumerate(classes)}
    return make_dataset(str(folder), class_to_idx, extensions=IMG_EXTENSIONS)


def epoch_seed(seed: int, rank: int, epoch: int) -> int:
    """The DALI pipeline seed of one rank and epoch: a hash of ``(seed, rank, epoch)`` in [0, 2**31)."""
    return int(np.random.SeedSequence([seed, rank, epoch]).generate_state(1)[0] & 0x7FFFFFFF)


class DaliTrainLoader:
    """Training batches ``(images (B, C, S, S) uint8, labels (B,) int64)`` from DALI, one pipeline per epoch.

    Each epoch reads ``sampler``'s indices for that epoch (this rank's share, shuffled with the sampler's seed and
    epoch) cut to whole batches, as a ``drop_last=True`` DataLoader over the same sampler would: ``len(sampler) //
    batch_size`` batches, the last ``len(sampler) % batch_size`` indices dropped. Under DDP every rank has the same
    number of batches.

    Lightning treats it as a plain iterable (it is not a ``DataLoader``, so ``use_distributed_sampler`` never wraps
    it), calls ``sampler.set_epoch(epoch)`` at the start of each epoch (its ``_set_sampler_epoch`` looks for a
    ``sampler`` attribute) and then ``iter()``; the pipeline is built at the first batch, after ``set_epoch``. An
    epoch left early (``limit_train_batches``) is dropped with its pipeline; the next ``iter()`` starts the next
    epoch's list.

    It does not resume mid-epoch, so it has no ``state_dict`` and Lightning's warning "your dataloader is not
    resumable" stays true for it: a resume from an end-of-epoch checkpoint is exact (the next epoch's list and
    :func:`epoch_seed` depend only on the seed, the rank and the epoch), but from a mid-epoch checkpoint (the SLURM
    requeue's hpc checkpoint, ``every_n_train_steps``) the interrupted epoch is read again from its first batch and
    stops after the batches it had left, so its first ``k`` batches are seen twice and its last ``k`` not at all. The
    order alone could be resumed (skip ``k`` batches of the list), but the random operators could not: the pipeline
    draws per sample from generators seeded by :func:`epoch_seed` at its build, so a pipeline started at batch
    ``k`` would augment it with batch 0's draws; that needs DALI's own checkpointing of the pipeline.

    Args:
        samples: ``(path, label)`` of every training image (:func:`image_folder_samples`).
        sampler: This rank's sampler over ``samples`` (a ``DistributedSampler`` or a subclass).
        recipe: The transform (:class:`DaliTrainRecipe`).
        batch_size: Images per batch on this rank.
        device: The trainer's device: CUDA runs nvJPEG and GPU operators on it, anything else CPU operators.
        num_threads: CPU threads of the pipeline.
        seed: Base seed; each epoch's pipeline is seeded with :func:`epoch_seed` of it, the rank and the epoch.
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        sampler: DistributedSampler,
        recipe: DaliTrainRecipe,
        batch_size: int,
        device: torch.device,
        num_threads: int = 1,
        seed: int = 0,
    ) -> None:
        if len(sampler) < batch_size:
            raise OptionError(
                f"The DALI training loader has {len(sampler)} images on this rank for a per-device batch of "
                f"{batch_size}, so not one full batch; lower data.batch_size or add training images."
            )
        self.samples = samples
        self.sampler = sampler
        self.recipe = recipe
        self.batch_size = batch_size
        self.device = device
        self.num_threads = num_threads
        self.seed = seed
        rank_zero_info(
            f"Training input: DALI on {'nvJPEG + GPU' if device.type == 'cuda' else 'CPU'} operators, {num_threads} "
            f"thread(s) per rank, {len(self)} batches of {batch_size} per epoch and rank."
        )
        self._epoch: Generator[tuple[Tensor, Tensor], None, None] | None = None

    def __len__(self) -> int:
        """Full batches per epoch on this rank."""
        return len(self.sampler) // self.batch_size

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        """The current epoch's batches (the epoch last given to ``sampler.set_epoch``); closes an unfinished one."""
        if self._epoch is not None:
            self._epoch.close()
        self._epoch = self._batches()
        return self._epoch

    def epoch_samples(self) -> list[tuple[str, int]]:
        """``(path, label)`` this rank reads in the current epoch, in order, cut to whole batches."""
        indices = list(self.sampler)[: len(self) * self.batch_size]
        return [self.samples[i] for i in indices]

    def device_id(self) -> int | None:
        """CUDA device index of the pipeline, or None for CPU operators."""
        if self.device.type != "cuda":
            return None
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def _batches(self) -> Generator[tuple[Tensor, Tensor], None, None]:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        from kpca.vision_cls.input.dali.graph import READER_NAME, build_train_pipeline

        files, labels = zip(*self.epoch_samples(), strict=True)
        pipeline = build_train_pipeline(
            files,
            labels,
            self.recipe,
            self.batch_size,
            self.device_id(),
            self.num_threads,
            epoch_seed(self.seed, self.sampler.rank, self.sampler.epoch),
        )
        iterator = DALIGenericIterator(
            [pipeline], ["images", "labels"], reader_name=READER_NAME, last_batch_policy=LastBatchPolicy.DROP
        )
        for (batch,) in iterator:
            yield batch["images"], batch["labels"].view(-1).long()  # (B, C, S, S) uint8, (B,) int64
