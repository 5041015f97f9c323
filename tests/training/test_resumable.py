"""ResumableLoader: a state taken mid-epoch resumes the same batches, with the workers' random numbers; Lightning
restores it also when ``configure_optimizers`` built the loader before the checkpoint was read."""

import random

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loops import _FitLoop
from torch import nn
from torch.utils.data import Dataset

from kpca.training.checkpointing.restore import ExactResume, rng_states, set_rng_states
from kpca.training.data import ProjectDataModule
from kpca.training.resumable import ResumableLoader, resumable_loader


class Augmented(Dataset):
    """Item i: (i, a Python, a NumPy and a torch random number drawn in the worker), as a random transform draws."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), random.random(), np.random.rand(), torch.rand(()).item()])  # (4,)


def loader(sampler=None, workers: int = 2) -> ResumableLoader:
    return resumable_loader(Augmented(), 0, sampler is None, sampler, batch_size=4, num_workers=workers)


def set_epoch(loader: ResumableLoader, epoch: int) -> None:
    """What Lightning does at an epoch's start (torchdata's RandomSampler has no epoch)."""
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)


def epochs(loader: ResumableLoader, first: int, count: int) -> list[torch.Tensor]:
    """The batches of epochs ``first .. first + count - 1`` (``set_epoch`` as Lightning calls it)."""
    batches = []
    for epoch in range(first, first + count):
        set_epoch(loader, epoch)
        batches += list(loader)
    return batches


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("distributed", [False, True])
def test_a_mid_epoch_state_resumes_the_same_batches(monkeypatch, workers: int, distributed: bool):
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")

    def sampler():
        return torch.utils.data.DistributedSampler(range(24), num_replicas=1, rank=0) if distributed else None

    pl.seed_everything(0)
    straight = epochs(loader(sampler(), workers), 0, 3)
    pl.seed_everything(0)
    interrupted = loader(sampler(), workers)
    batches = epochs(interrupted, 0, 1)
    set_epoch(interrupted, 1)
    iterator = iter(interrupted)
    batches += [next(iterator) for _ in range(2)]
    state, main_rngs = interrupted.state_dict(), rng_states()  # with 0 workers the items draw from the main RNGs
    del iterator, interrupted
    resumed = loader(sampler(), workers)
    set_rng_states(main_rngs)  # as ExactResume does
    resumed.load_state_dict(state)  # before iter and before Lightning's set_epoch, as Lightning does
    batches += list(resumed) + epochs(resumed, 2, 1)
    assert len(batches) == len(straight) == 18
    assert all(torch.equal(a, b) for a, b in zip(batches, straight, strict=True))


def test_an_end_of_epoch_state_resumes_with_the_next_epoch(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    straight = epochs(loader(), 0, 2)
    interrupted = loader()
    first = epochs(interrupted, 0, 1)
    resumed = loader()
    resumed.load_state_dict(interrupted.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(first + list(resumed), straight, strict=True))


def test_a_foreign_state_is_refused():
    with pytest.raises(ValueError, match="not a ResumableLoader's"):
        loader(workers=0).load_state_dict({"_snapshot": {}})


def test_lightning_keeps_the_pending_loader_states_it_is_given():
    """Canary for kpca.training.checkpointing.restore: the private names it reads exist."""
    fit_loop = _FitLoop(pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False))
    assert fit_loop._combined_loader_states_to_load == [] and fit_loop._data_fetcher is None
    assert callable(fit_loop._load_combined_loader_states)


class Data(ProjectDataModule):
    def __init__(self) -> None:
        super().__init__(batch_size=4, num_workers=2, pin_memory=False)

    def train_dataloader(self) -> ResumableLoader:
        return self.train_loader(Augmented())


class Module(ExactResume, pl.LightningModule):
    """Reads ``estimated_stepping_batches`` in ``configure_optimizers`` (a warmup in epochs does), which makes
    Lightning build the training loader before it reads the checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.seen = nn.Linear(4, 1), []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch)
        return self.net(nn.functional.dropout(batch, 0.5)).square().mean()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        total = self.trainer.estimated_stepping_batches
        return [optimizer], [torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total)]


class StopAt(pl.Callback):
    def __init__(self, path, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def test_a_fit_resumed_mid_epoch_trains_on_the_batches_and_weights_of_the_straight_fit(tmp_path, recwarn):
    def fit(callbacks=(), ckpt_path=None) -> Module:
        pl.seed_everything(0, workers=True)
        module = Module()
        trainer = pl.Trainer(
            max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, callbacks=list(callbacks), default_root_dir=tmp_path,
        )  # fmt: skip
        trainer.fit(module, Data(), ckpt_path=ckpt_path)
        return module

    straight = fit()
    first = fit([StopAt(tmp_path / "mid.ckpt", 9)])  # epoch 1, batch 3 of 6
    resumed = fit(ckpt_path=tmp_path / "mid.ckpt")
    assert len(first.seen) == 9 and len(resumed.seen) == 3
    assert all(torch.equal(a, b) for a, b in zip(first.seen + resumed.seen, straight.seen, strict=True))
    assert all(
        torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), straight.state_dict().values(), strict=True)
    )
    assert not [w for w in recwarn if "not resumable" in str(w.message)]
