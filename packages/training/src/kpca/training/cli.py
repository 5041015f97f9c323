"""ProjectCLI: the LightningCLI that every app's command builds on.

It adds a ``checkpoint`` ModelCheckpoint (best by the app's metric, plus a ``last.ckpt`` rewritten at every
save point, see :class:`kpca.training.checkpointing.callback.Checkpoint`), the RPC diagnostics callback, the kernel-PCA
monitor (``--kernel_pca.every_n_epochs``, off by default), the HParams summary of each run's final metrics,
the SLURM requeue moved out of the signal handler,
Lightning's learning-rate and throughput monitors, atomic checkpoint writes, console logging for the ``kpca``
loggers, and saves the resolved config of each run. ``test`` prints the app's report table once instead of
Lightning's table per dataloader. ``analyze`` writes the kernel-PCA diagnostics of a checkpoint
(:meth:`kpca.training.trainer.ProjectTrainer.analyze`). ``fit --ckpt_path auto`` (or ``last``) resumes from the
newest readable checkpoint of the same experiment, so rerunning the command that was killed continues it (see
:mod:`kpca.training.checkpointing.resume`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from kpca.training.analysis import KernelPCAMonitor
from kpca.training.callbacks import (
    DeferredSlurmRequeue,
    HParamsSummary,
    NonFiniteLoss,
    RPCDiagnostics,
    Throughput,
)
from kpca.training.checkpointing.callback import Checkpoint
from kpca.training.checkpointing.resume import check_checkpoint, find_resume
from kpca.training.run_config import without_keys
from kpca.training.trainer import ProjectTrainer

logger = logging.getLogger(__name__)

CHECKPOINT_IO = "kpca.training.checkpointing.io.AtomicCheckpointIO"
AUTO_RESUME = ("auto", "last")
"""``fit --ckpt_path`` values that resume from the newest readable checkpoint of this experiment, if any."""
LIGHTNING_CKPT_KEYWORDS = ("hpc", "best", "registry")
RUN_LOGGERS = ("TensorBoardLogger", "CSVLogger")
RESUME_IGNORED_KEYS = (
    "ckpt_path", "config", "trainer.logger.init_args.version", "trainer.logger.init_args.purge_step", "model.compile",
)  # fmt: skip
"""Config keys that resuming itself sets, and ``model.compile`` (it changes how the network runs, not what it is): a
saved run whose config differs only in these is this experiment."""


def batch_size(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor (``(images, labels)``, ``(tokens, targets)``, ...)."""
    first = batch[0] if isinstance(batch, (tuple, list)) else next(iter(batch.values()))
    return len(first)


def batch_tokens(batch: Any) -> int:
    """Tokens in a batch of ``(B, N)`` token ids: ``B * N`` (ThroughputMonitor's items, for tokens/s)."""
    return batch[0].numel()


def console_logging(name: str = "kpca") -> None:
    """Show INFO messages of the ``name`` loggers on the console, as Lightning does for its own (once per process).

    Nothing is added when the root logger or ``name`` already has handlers (the user configured logging).
    """
    logger = logging.getLogger(name)
    if logger.handlers or logging.getLogger().handlers:
        return
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.StreamHandler())
    logger.propagate = False


class ProjectCLI(LightningCLI):
    """An app's command: set ``monitor``, ``mode``, ``best_filename`` and ``throughput``, add its own arguments.

    Subclasses override :meth:`add_app_arguments` for their callbacks and links. ``throughput`` gives
    ThroughputMonitor's ``batch_size_fn`` and ``length_fn`` (tokens/s for sequence models).
    """

    monitor: str = "val/loss"
    mode: str = "min"
    best_filename: str = "best-{epoch:03d}"
    throughput: tuple[Callable[[Any], int], Callable[[Any], int] | None] = (batch_size, None)
    trainer_type: type[ProjectTrainer] = ProjectTrainer
    """The Trainer class; an app whose Trainer subclass adds a subcommand also lists it in :meth:`subcommands`."""
    description: str = "A kpca app: fit, validate, test and analyze models from YAML configs."
    """What the app's command does, shown by ``--help``."""

    def __init__(self, model_class, datamodule_class, args: ArgsType = None) -> None:
        console_logging()
        super().__init__(
            model_class,
            datamodule_class,
            args=args,
            trainer_class=self.trainer_type,
            trainer_defaults={"plugins": [{"class_path": CHECKPOINT_IO}]},
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": self.description},
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(Checkpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": self.monitor,
                "checkpoint.mode": self.mode,
                "checkpoint.save_last": True,
                "checkpoint.filename": self.best_filename,
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        parser.add_lightning_class_args(RPCDiagnostics, "rpc_diagnostics")
        parser.add_lightning_class_args(KernelPCAMonitor, "kernel_pca")
        parser.add_lightning_class_args(HParamsSummary, "hparams_summary")
        parser.add_lightning_class_args(DeferredSlurmRequeue, "slurm_requeue")
        parser.add_lightning_class_args(NonFiniteLoss, "nonfinite_loss")
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.set_defaults({"lr_monitor.logging_interval": "step"})
        parser.add_lightning_class_args(Throughput, "throughput")
        size_fn, length_fn = self.throughput
        parser.set_defaults({"throughput.batch_size_fn": size_fn, "throughput.length_fn": length_fn})
        self.add_app_arguments(parser)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's subcommands plus ``analyze`` (kernel-PCA diagnostics of a checkpoint)."""
        return {**LightningCLI.subcommands(), "analyze": {"model", "datamodule"}}

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "test":  # the module prints its report table once; Lightning's is one per dataloader
            parser.set_defaults({"verbose": False})
        return parser

    def add_app_arguments(self, parser: LightningArgumentParser) -> None:
        """Add the app's callbacks and argument links (nothing by default)."""

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse, then for ``fit`` resolve ``--ckpt_path auto`` / ``last`` and refuse a damaged explicit checkpoint.

        Done here, before LightningCLI reads the checkpoint's hyper-parameters, so that a damaged file gets an
        error that names it instead of an unpickling error.
        """
        super().parse_arguments(parser, args)
        if self.config.get("subcommand") != "fit":
            return
        config = self.config.fit
        if config.ckpt_path in AUTO_RESUME:
            self._resume_automatically(config)
        elif config.ckpt_path is not None and config.ckpt_path not in LIGHTNING_CKPT_KEYWORDS:
            check_checkpoint(config.ckpt_path)

    def before_fit(self) -> None:
        """Tell the checkpoint callbacks that the run continues in its own folder when it resumes."""
        if self.config.fit.ckpt_path is not None:
            for callback in self.trainer.checkpoint_callbacks:
                if isinstance(callback, Checkpoint):
                    callback.resuming = True

    def _resume_automatically(self, config) -> None:
        """Point ``ckpt_path`` and the logger's version at the newest readable checkpoint of this experiment."""
        run_logger = config.trainer.logger
        if not (hasattr(run_logger, "class_path") and run_logger.class_path.rsplit(".", 1)[-1] in RUN_LOGGERS):
            raise ValueError(
                f"--ckpt_path {config.ckpt_path} finds the run folders of one TensorBoardLogger or CSVLogger, got "
                f"trainer.logger={run_logger!r}; set one (configs/trainer/*.yaml do) or pass a checkpoint file."
            )
        if config.checkpoint.dirpath is not None:
            raise ValueError(
                f"--ckpt_path {config.ckpt_path} looks in the run folders' checkpoints/, but checkpoint.dirpath="
                f"{config.checkpoint.dirpath!r} puts them elsewhere; unset it or pass a checkpoint file."
            )
        init = run_logger.init_args
        experiment_dir = Path(init.save_dir) / (init.name or "")
        hpc_dir = Path(config.trainer.default_root_dir or os.getcwd())
        current = self._comparable(yaml.safe_load(self._parser("fit").dump(config, skip_none=False)))
        resume = find_resume(
            experiment_dir,
            hpc_dir,
            lambda folder: self._saved_config_is(folder / "config.yaml", current),
            versions=_version_glob(init.version),
        )
        if resume.checkpoint is None and SLURMEnvironment.detect() and any(hpc_dir.glob("hpc_ckpt_*.ckpt")):
            # Lightning restores the newest hpc_ckpt_* of default_root_dir under SLURM whenever ckpt_path is None.
            raise ValueError(
                f"--ckpt_path {config.ckpt_path}: this experiment has no checkpoint, but trainer.default_root_dir="
                f"{str(hpc_dir)!r} holds SLURM hpc_ckpt_*.ckpt files of another run, which Lightning would restore "
                "under SLURM. Give each experiment its own --trainer.default_root_dir (e.g. runs/<experiment>)."
            )
        if rank_zero_only.rank == 0:  # every process resolves the same files; one of them tells
            for path, reason in resume.skipped:
                logger.warning("auto resume: skipping %s: %s", path, reason)
            if resume.checkpoint is None:
                logger.info(
                    "auto resume: no readable checkpoint of this experiment in %s; starting fresh", experiment_dir
                )
            else:
                logger.info("auto resume: restoring %s (step %d)", resume.checkpoint, resume.step)
        if resume.checkpoint is None:
            config.ckpt_path = None
            return
        config.ckpt_path = str(resume.checkpoint)
        init.version = resume.run_folder.name
        if "purge_step" in init:  # TensorBoard hides the events a killed run wrote after its last checkpoint
            init.purge_step = resume.step

    @staticmethod
    def _comparable(config: dict) -> dict:
        """The configuration without the keys that resuming itself sets (:data:`RESUME_IGNORED_KEYS`)."""
        return without_keys(config, RESUME_IGNORED_KEYS)

    def _saved_config_is(self, path: Path, current: dict) -> bool:
        """Whether the ``config.yaml`` a run saved at ``path`` is ``current`` but for :data:`RESUME_IGNORED_KEYS`."""
        if not path.is_file():
            return False
        try:
            saved = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError:
            return False
        return isinstance(saved, dict) and self._comparable(saved) == current


def _version_glob(version: int | str | None) -> str:
    """The run folders a logger ``version`` allows: all ``version_*`` when unset, else its one folder."""
    if version is None:
        return "version_*"
    return f"version_{version}" if isinstance(version, int) else str(version)
