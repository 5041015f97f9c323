"""One SLURM task of a 2-process CPU DDP fit for tests/training/test_slurm_requeue.py: SIGUSR1 during a validation
whose ranks run different numbers of batches.

Run as ``python -m tests.training.slurm_ddp_probe ROOT`` once per task, with the task's SLURM variables (the test
starts both, as srun would). SIGUSR1 is held from the first line, before torch starts a thread, as
``kpca.training.slurm_start`` holds it. Each rank trains 4 steps of its own batches and validates after steps 2 and
4 on 3 batches (rank 0) or 2 (rank 1), as unpadded evaluation of an uneven set gives; at the first batch of the
first validation each rank sends itself SIGUSR1, as SLURM signals every task.
"""

import signal

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from kpca.training.callbacks import DeferredSlurmRequeue  # noqa: E402


def batches(count: int) -> DataLoader:
    """``count`` batches of 4 random samples with 2 classes."""
    return DataLoader(TensorDataset(torch.randn(4 * count, 4), torch.randint(0, 2, (4 * count,))), batch_size=4)


class UnevenValidation(pl.LightningModule):
    """A linear classifier whose ranks validate on 3 and 2 batches; signalled in the first validation."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, labels = batch  # (4, 4), (4,)
        return nn.functional.cross_entropy(self.net(inputs), labels)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        if batch_idx == 0 and self.trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGUSR1)  # held: it stays pending
        inputs, labels = batch
        self.log("val/loss", nn.functional.cross_entropy(self.net(inputs), labels), sync_dist=True)

    def train_dataloader(self) -> DataLoader:
        return batches(4)

    def val_dataloader(self) -> DataLoader:
        return batches(3 if self.global_rank == 0 else 2)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(root: str) -> None:
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=timedelta(seconds=60)), max_steps=4,
        val_check_interval=2, num_sanity_val_steps=0, use_distributed_sampler=False, default_root_dir=root,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[DeferredSlurmRequeue()],
    )  # fmt: skip
    trainer.fit(UnevenValidation())


if __name__ == "__main__":
    main(sys.argv[1])
