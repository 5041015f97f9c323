"""A 2-process CPU DDP fit for tests/training/test_train_loss_ddp.py: rank r's loss at batch i is (r + 1)(i + 1).

Run as ``python -m tests.training.ddp_train_loss_probe OUT_DIR``: Lightning's DDP launcher starts the second
process with the same command. Each rank trains one epoch of two batches of two samples, logs through
:meth:`kpca.training.module.NetModule.log_train_loss` and writes TensorBoard events under ``OUT_DIR``. The losses
are 1, 2 on rank 0 and 2, 4 on rank 1, so the epoch mean over both ranks is 2.25 and rank 0's own is 1.5.
"""

import functools
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kpca.training.module import NetModule


class RankLoss(NetModule):
    """A module whose loss is known on every rank: ``(global_rank + 1) * (batch_idx + 1)``."""

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (inputs,) = batch  # (B, 1)
        loss = self.net(inputs).sum() * 0 + (self.global_rank + 1) * (batch_idx + 1)
        self.log_train_loss(loss, inputs.shape[0])
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(self.parameters())


def main(out_dir: str) -> None:
    module = RankLoss(nn.Linear(1, 1), functools.partial(torch.optim.SGD, lr=0.0))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=TensorBoardLogger(out_dir, name="", version=""),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(TensorDataset(torch.ones(8, 1)), batch_size=2))


if __name__ == "__main__":
    main(sys.argv[1])
