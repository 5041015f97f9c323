"""Callbacks: sampled text in TensorBoard after each validation, and predictions written to a file."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from kpca.language_model.data import LanguageData
from kpca.training.data import require_datamodule
from kpca.training.errors import OptionError
from kpca.training.files import write_atomic

logger = logging.getLogger(__name__)


class SampleText(pl.Callback):
    """After every every_n_epochs-th validation, continue the datamodule's prompts and log them as TensorBoard text.

    Tag ``samples/text``; decoding follows the module's ``generation`` settings.
    """

    def __init__(self, every_n_epochs: int = 1) -> None:
        if every_n_epochs < 1:
            raise OptionError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        self.every_n_epochs = every_n_epochs

    @rank_zero_only
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        writers = [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not writers:
            return
        texts = pl_module.generate_text(list(require_datamodule(trainer, LanguageData).predict_prompts))
        markdown = "\n\n".join(f"    {text}".replace("\n", "\n    ") for text in texts)  # code blocks keep newlines
        for writer in writers:
            writer.add_text("samples/text", markdown, global_step=trainer.global_step)


class TextPredictionWriter(BasePredictionWriter):
    """Write ``predict``'s prompts and continuations to ``<log dir>/predictions.jsonl`` and log them (INFO)."""

    def __init__(self) -> None:
        super().__init__(write_interval="epoch")

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        path = Path(trainer.log_dir or trainer.default_root_dir) / "predictions.jsonl"  # a collective: every rank asks
        if not trainer.is_global_zero:
            return
        rows = [row for batch in predictions for row in (batch if isinstance(batch, list) else [batch])]
        write_atomic(path, lambda f: f.writelines(json.dumps(row) + "\n" for row in rows), mode="w", encoding="utf-8")
        for row in rows:
            logger.info("--- %r\n%s", row["prompt"], row["text"])
        logger.info("predictions written to %s", path)
