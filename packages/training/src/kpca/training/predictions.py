"""What ``predict`` writes into its run folder: a table of every item's prediction, gathered over the processes.

:class:`TablePredictionWriter` is Lightning's ``BasePredictionWriter`` at the end of the predict epoch: each process
turns its own predictions into rows (one per item, with the item's ``index`` in the predicted set), the rows of every
process are gathered (under DDP each process predicted its share of the set, every item once), and rank 0 writes
them in index order to ``<run folder>/predictions.csv`` atomically and logs where. An app's writer says what a row
holds (:meth:`TablePredictionWriter.rows`).
"""

from __future__ import annotations

import abc
import csv
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch.distributed as dist
from lightning.pytorch.callbacks import BasePredictionWriter

from kpca.training.files import write_atomic

logger = logging.getLogger(__name__)

PREDICTIONS_TABLE = "predictions.csv"


class TablePredictionWriter(BasePredictionWriter, abc.ABC):
    """Write ``predict``'s rows to ``<run folder>/predictions.csv`` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(write_interval="epoch")

    @abc.abstractmethod
    def rows(
        self, trainer: pl.Trainer, predictions: Sequence[Any], indices: Sequence[int], run_folder: Path
    ) -> list[dict[str, Any]]:
        """This process's rows: one per predicted item, each with its ``index`` in the predicted set.

        Args:
            predictions: ``predict_step``'s outputs of this process, batch by batch.
            indices: the predicted set's index of each item of those batches, in the same order.
            run_folder: the run folder the table goes to (for files a row names, relative to it).
        """

    def write_on_epoch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, predictions: Sequence[Any], batch_indices: Any
    ) -> None:
        """Gather every process's rows and write them once, in index order (rank 0), then say where."""
        run_folder = Path(trainer.log_dir or trainer.default_root_dir)  # a collective: every rank asks
        path = run_folder / PREDICTIONS_TABLE
        indices = [int(index) for batch in _one_loader(batch_indices) for index in batch]
        rows = self.rows(trainer, _one_loader(predictions), indices, run_folder)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[list[dict[str, Any]] | None] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, rows)
            rows = [row for part in gathered for row in part or []]
        if not trainer.is_global_zero:
            return
        rows.sort(key=lambda row: row["index"])
        columns = list(rows[0]) if rows else ["index"]
        write_atomic(path, lambda stream: _write_csv(stream, columns, rows), mode="w", encoding="utf-8", newline="")
        logger.info("predictions of %d items written to %s", len(rows), path)


def _one_loader(per_loader: Any) -> list:
    """The batches of the one predict dataloader (Lightning nests them per dataloader when there are several)."""
    if per_loader and isinstance(per_loader[0], list) and per_loader[0] and isinstance(per_loader[0][0], list):
        if len(per_loader) != 1:
            raise ValueError(f"a prediction table reads one predict dataloader, got {len(per_loader)}")
        return per_loader[0]
    return list(per_loader)


def _write_csv(stream: Any, columns: list[str], rows: list[dict[str, Any]]) -> None:
    writer = csv.DictWriter(stream, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
