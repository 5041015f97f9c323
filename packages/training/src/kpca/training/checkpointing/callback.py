"""Checkpoint: Lightning's ModelCheckpoint whose ``last.ckpt`` follows every save point."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

logger = logging.getLogger(__name__)


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

    A save point before the first validation (a fit shorter than its validation interval) has no monitored metric
    yet: no best checkpoint is chosen there, ``last.ckpt`` is written, and one INFO line says so (Lightning warns
    that the key is missing, as if the module never logged it). After a validation, a missing key is still
    Lightning's error.
    """

    resuming: bool = False
    _told_unmonitored: bool = False

    def _ModelCheckpoint__warn_if_dir_not_empty(self, dirpath) -> None:  # noqa: N802 (overrides the mangled name)
        if not self.resuming:
            super()._ModelCheckpoint__warn_if_dir_not_empty(dirpath)

    def _save_topk_checkpoint(self, trainer, monitor_candidates) -> None:
        if self._before_the_monitored_metric(trainer, monitor_candidates):
            self._tell_unmonitored(trainer)
        else:
            super()._save_topk_checkpoint(trainer, monitor_candidates)
        if self.save_last:
            self._last_global_step_saved = trainer.global_step  # the condition under which Lightning writes last

    def _before_the_monitored_metric(self, trainer: pl.Trainer, monitor_candidates: dict) -> bool:
        """Whether this save point comes before any validation logged the monitored metric."""
        if self.monitor is None or self.save_top_k == 0 or self.monitor in monitor_candidates:
            return False
        return not trainer.fit_loop.epoch_loop.val_loop._has_run

    @rank_zero_only
    def _tell_unmonitored(self, trainer: pl.Trainer) -> None:
        if not self._told_unmonitored:
            self._told_unmonitored = True
            logger.info(
                "checkpoint at step %d: no %s yet (no validation has run), so no best checkpoint is chosen there; "
                "last.ckpt is written",
                trainer.global_step,
                self.monitor,
            )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.fast_dev_run:
            super().on_train_end(trainer, pl_module)
