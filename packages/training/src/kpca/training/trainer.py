"""ProjectTrainer: Lightning's Trainer plus ``analyze`` (the kernel-PCA analysis of a checkpoint) and ``check-data``.

LightningCLI builds one subcommand per Trainer method it is told about, with the method's arguments
as flags, so ``analyze`` lives here and every app's command gets ``<app> analyze -c ... --ckpt_path ...``;
likewise ``<app> check-data -c ...`` (:meth:`ProjectTrainer.check_data`). Building one silences the console messages
no user can act on (:mod:`kpca.training.quiet`), and ``validate``, ``test`` and ``predict`` are Lightning's with a whole
one-line summary (:func:`~kpca.training.help_text.whole_summary`), run without the moved-checkpoint-folder notice.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch

from kpca.training.analysis import analyze_network, network_inputs, write_analysis
from kpca.training.checkpointing.weights import load_checkpoint_weights
from kpca.training.data_checks.check_data import DataCheckResult, run_data_check
from kpca.training.data_checks.problems import format_problems
from kpca.training.errors import OptionError
from kpca.training.help_text import whole_summary
from kpca.training.quiet import evaluation_quiet, quiet_known_noise

logger = logging.getLogger(__name__)

CHECK_DATA = "check-data"
"""The subcommand that runs :meth:`ProjectTrainer.check_data`."""


def _evaluation(method: Callable) -> Callable:
    """Lightning's ``validate``, ``test`` or ``predict`` run under :func:`~kpca.training.quiet.evaluation_quiet`.

    Its docstring is Lightning's with the first paragraph on one line (:func:`~kpca.training.help_text.whole_summary`):
    the subcommand's description in ``--help``.
    """

    @functools.wraps(method)
    def evaluate(self: pl.Trainer, *args: Any, **kwargs: Any) -> Any:
        with evaluation_quiet():
            return method(self, *args, **kwargs)

    evaluate.__doc__ = whole_summary(method.__doc__)
    return evaluate


class ProjectTrainer(pl.Trainer):
    """Lightning's Trainer with two more subcommands, analyze (kernel-PCA diagnostics) and check-data."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Lightning's Trainer, built after :func:`~kpca.training.quiet.quiet_known_noise` (its __init__ logs one)."""
        quiet_known_noise()
        super().__init__(*args, **kwargs)

    validate = _evaluation(pl.Trainer.validate)
    test = _evaluation(pl.Trainer.test)
    predict = _evaluation(pl.Trainer.predict)

    @staticmethod
    def check_data(
        datamodule: pl.LightningDataModule, workers: int | None = None, progress: bool = True
    ) -> DataCheckResult:
        """Read every file of the configured data and print a table of the damaged ones (no model, no training).

        Runs the datamodule's ``check_data`` (:meth:`kpca.training.data.ProjectDataModule.check_data`) and prints
        its problems as a Markdown table (path, split, problem, fix) and a summary line (files checked, problems,
        seconds, files/s) on stdout. A static method: ``check-data`` builds neither the trainer nor the model, so it
        runs on a machine without the configured GPUs.

        Args:
            datamodule: the configured data.
            workers: DataLoader worker processes reading the files; None: the datamodule's ``num_workers``.
            progress: show a progress bar on stderr.

        Returns:
            The files checked, the problems and the time taken (the command exits with status 1 when there are
            problems).
        """
        result = run_data_check(datamodule, workers, progress)
        sys.stdout.write(f"{format_problems(result.problems)}\n\n{result.summary()}\n")
        return result

    def analyze(
        self,
        model: pl.LightningModule,
        datamodule: pl.LightningDataModule | None = None,
        ckpt_path: str | None = None,
        split: Literal["val", "train"] = "val",
        samples: int = 8,
        out_dir: str | None = None,
    ) -> Path:
        """Kernel-PCA analysis: the diagnostics of every attention layer and head on a sample of data.

        Loads the weights of ``ckpt_path``, runs the network on the first ``samples`` inputs of the
        ``split`` dataloader (validation: the evaluation transform; train: the training crops, for apps
        whose validation batches are not one tensor) and writes ``kernel_pca.md``, ``.csv`` and ``.png``
        (see :func:`kpca.training.analysis.write_analysis`).

        Args:
            model: the LightningModule (its ``net`` is analysed).
            datamodule: where the inputs come from.
            ckpt_path: a checkpoint of this app; None analyses the freshly initialised model.
            split: ``val`` or ``train``.
            samples: how many inputs are analysed (the first ones, in loader order).
            out_dir: output folder; default ``<run folder>/analysis`` of the checkpoint, or
                ``<default_root_dir>/analysis`` without one.

        Returns:
            The Markdown report's path.
        """
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise OptionError(f"--samples must be a positive int, got {samples!r}")
        if datamodule is None:
            raise OptionError("analyze needs a datamodule (the app's data: section) to draw its inputs from")
        if ckpt_path is not None:
            step = load_checkpoint_weights(model, ckpt_path)
            logger.info("analyze: weights of %s (step %s)", ckpt_path, step)
        inputs = first_inputs(datamodule, split, samples)
        net = getattr(model, "net", model).to(self.strategy.root_device)
        results = analyze_network(net, inputs.to(self.strategy.root_device))
        folder = Path(out_dir) if out_dir else _default_out_dir(ckpt_path, self.default_root_dir)
        md_path, _, _ = write_analysis({type(net).__name__: results}, folder)
        logger.info("analyze: %d attention layers on %d %s inputs -> %s", len(results), len(inputs), split, md_path)
        return md_path


# LightningCLI finds a subcommand's options and help in the Trainer attribute named like it, and "check-data" is not a
# Python name: the attribute is an alias of check_data.
setattr(ProjectTrainer, CHECK_DATA, ProjectTrainer.__dict__["check_data"])


def first_inputs(datamodule: pl.LightningDataModule, split: str, samples: int) -> torch.Tensor:
    """The first ``samples`` network inputs of the datamodule's ``split`` loader (its first one, if several)."""
    datamodule.prepare_data()  # as Lightning does before a stage: built-in data is written here
    datamodule.setup("fit" if split == "train" else "validate")
    loaders = datamodule.train_dataloader() if split == "train" else datamodule.val_dataloader()
    loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
    chunks, have = [], 0
    for batch in loader:
        chunks.append(network_inputs(batch))
        have += len(chunks[-1])
        if have >= samples:
            break
    if not chunks:
        raise OptionError(f"the {split} dataloader is empty; nothing to analyse")
    return torch.cat(chunks)[:samples]


def _default_out_dir(ckpt_path: str | None, root: str) -> Path:
    """``<run folder>/analysis`` for a checkpoint in ``<run folder>/checkpoints``, else ``<root>/analysis``."""
    if ckpt_path is None:
        return Path(root) / "analysis"
    folder = Path(ckpt_path).resolve().parent
    return (folder.parent if folder.name == "checkpoints" else folder) / "analysis"
