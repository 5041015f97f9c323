"""Checkpoint: Lightning's ModelCheckpoint whose ``last.ckpt`` follows every save point."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint


class Checkpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint whose last.ckpt follows every save point.

    Lightning 2.6 rewrites ``last.ckpt`` only at the steps where a best-k file was written, so after an epoch
    that did not improve the monitored metric ``last.ckpt`` still holds an older state, and a preempted run
    would resume from there and lose the epochs since. Here each save point (every epoch, or every
    ``every_n_train_steps``) counts as saved, so ``last.ckpt`` is rewritten at each one; best-k is unchanged.
    When :attr:`resuming` (set by ``ProjectCLI`` for a fit that resumes), continuing in the run's own
    ``checkpoints/`` folder does not warn that the folder is not empty. Under ``trainer.fast_dev_run`` nothing is
    saved: Lightning 2.6 skips every save point then but still writes ``last.ckpt`` at the end of training, into
    ``<cwd>/checkpoints`` since a fast dev run has no logger folder.
    """

    resuming: bool = False

    def _ModelCheckpoint__warn_if_dir_not_empty(self, dirpath) -> None:  # noqa: N802 (overrides the mangled name)
        if not self.resuming:
            super()._ModelCheckpoint__warn_if_dir_not_empty(dirpath)

    def _save_topk_checkpoint(self, trainer, monitor_candidates) -> None:
        super()._save_topk_checkpoint(trainer, monitor_candidates)
        if self.save_last:
            self._last_global_step_saved = trainer.global_step  # the condition under which Lightning writes last

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.fast_dev_run:
            super().on_train_end(trainer, pl_module)
