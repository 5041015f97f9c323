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
:mod:`kpca.training.checkpointing.resume`). A ``fit`` holds a lock on its run folder (and ``--ckpt_path auto`` one on
its experiment), so a second identical command refuses, naming the first (:mod:`kpca.training.run_lock`), and removes
the partial files of checkpoint saves that were killed. A ``--ckpt_path`` written by another app is refused, naming
that app's command (:mod:`kpca.training.checkpointing.origin`). ``check-data`` reads every file of the configured
data and lists the damaged ones, building neither model nor trainer (:meth:`ProjectTrainer.check_data`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sys
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import yaml
from jsonargparse import Namespace
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from kpca.training.analysis import KernelPCAMonitor
from kpca.training.attention_options import DroppedSetting, drop_settings, settle_attention_groups
from kpca.training.callbacks import (
    DeferredSlurmRequeue,
    HParamsSummary,
    NonFiniteLoss,
    RPCDiagnostics,
    Throughput,
)
from kpca.training.checkpointing.callback import Checkpoint
from kpca.training.checkpointing.io import remove_leftover_writes
from kpca.training.checkpointing.origin import app_command, app_of, check_origin
from kpca.training.checkpointing.resume import check_checkpoint, resolve_auto_resume
from kpca.training.checkpointing.trained_options import (
    CLASS_PATH,
    OptionDifference,
    check_weights_fit,
    option_differences,
    plain,
    trained_data_options,
    trained_model_options,
    typed_over_trained,
)
from kpca.training.data_checks.bad_files import BadFilesMonitor
from kpca.training.files import write_atomic
from kpca.training.help_text import PlainHelpFormatter
from kpca.training.machine_checks import check_cache_folder, check_machine
from kpca.training.moved_options import Move, MovedConfigs, move_options
from kpca.training.option_checks import check_optimizer, check_seed, check_trainer_options, refused_trainer_options
from kpca.training.parser import ProjectArgumentParser
from kpca.training.run_lock import RunLock
from kpca.training.trainer import CHECK_DATA, ProjectTrainer

logger = logging.getLogger(__name__)

CHECKPOINT_IO = "kpca.training.checkpointing.io.AtomicCheckpointIO"
AUTO_RESUME = ("auto", "last")
"""``fit --ckpt_path`` values that resume from the newest readable checkpoint of this experiment, if any."""
LIGHTNING_CKPT_KEYWORDS = ("hpc", "best", "registry")
FIT_SUMMARY = "fit_summary.json"
"""The file :meth:`ProjectCLI.after_fit` writes into the fit's log folder: its best and last checkpoints."""
RUN_LOCK_FILE = "fit.lock"
"""The lock file a ``fit`` holds in its run folder (see :mod:`kpca.training.run_lock`)."""
CKPT_PATH_HELP = (
    "A checkpoint file whose weights this command uses. The model options you type (config files and command line) "
    "run; the checkpoint's training options fill in the rest, and a run whose options differ from them says so in "
    "its log and report. Options the weights cannot take (a width, a depth) are refused.",
    "Resume from a checkpoint: 'auto' (or 'last') continues the newest readable checkpoint of this same experiment "
    "(the same config) in its own run folder, or starts fresh when there is none, so rerunning a killed command "
    "resumes it; a file continues a copy of that run in a new run folder (typed model options run, as in test). "
    "Lightning's 'hpc' and 'registry' keywords work as in Lightning. Default: start fresh.",
)
"""``--ckpt_path``'s help: of ``validate`` / ``test`` / ``predict`` / ``analyze`` / ``export``, and of ``fit``."""
NEW_RUN_FOLDER = (
    "To run beside it, give this run its own version folder: leave trainer.logger.init_args.version unset and pass "
    "--ckpt_path null (start afresh) or --ckpt_path <one of its checkpoints> (continue a copy of it)."
)
NEW_RUN_OF_AN_EXPERIMENT = (
    "To run beside it, start a new version folder: replace --ckpt_path auto by --ckpt_path null (start afresh) or "
    "--ckpt_path <one of its checkpoints> (continue a copy of it)."
)


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
    _experiment_lock: Path | None = None
    """The experiment's lock file of ``fit --ckpt_path auto`` (set while resolving it)."""
    _auto_resume_notes: list[tuple[int, str]]
    """What ``--ckpt_path auto`` found, as (level, message), logged once the run holds its locks."""
    _args: ArgsType = None
    """The arguments the command was given (None: ``sys.argv``), parsed again for what the user typed."""
    trained_differences: list[OptionDifference] = []
    """The model options this run uses that differ from its ``--ckpt_path``'s training (set by parsing)."""
    _trained: dict | None = None
    """The ``--ckpt_path``'s model options when they are the subcommand's defaults (:meth:`_checkpoint_defaults`)."""
    dropped_settings: list[DroppedSetting] = []
    """The attention settings that came from earlier config files for a kind that does not read them (set by
    parsing; :mod:`kpca.training.attention_options`)."""

    def __init__(self, model_class, datamodule_class, args: ArgsType = None) -> None:
        console_logging()
        self._auto_resume_notes = []
        self._moved_configs = MovedConfigs()
        self._named_subcommands = _named_subcommands(args, self.subcommands())
        super().__init__(
            model_class,
            datamodule_class,
            args=args,
            trainer_class=self.trainer_type,
            trainer_defaults={"plugins": [{"class_path": CHECKPOINT_IO}]},
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": self.description, **_prog(model_class)},
        )

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Lightning's parser, the main command's and each subcommand's.

        It refuses abbreviated options and starts a refusal with its one line (:mod:`kpca.training.parser`); its help
        is plain text, without the reStructuredText of the docstrings it comes from (:mod:`kpca.training.help_text`).
        """
        self.parser_class = ProjectArgumentParser
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        return super().init_parser(**kwargs)

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
        parser.add_lightning_class_args(BadFilesMonitor, "bad_files_monitor")
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
        """Lightning's subcommands plus ``analyze`` (kernel-PCA diagnostics of a checkpoint) and ``check-data``."""
        return {**LightningCLI.subcommands(), "analyze": {"model", "datamodule"}, CHECK_DATA: {"datamodule"}}

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        """The subcommand's parser; only its description when the command line runs another subcommand.

        Building a subcommand's options (the trainer's, model's and data's classes) takes most of a command's start
        (about 0.2 s each of ``fit``, ``validate``, ``test``, ``predict``, ``analyze``, ``check-data`` and ``export``);
        a command runs one, so the subcommands it does not name keep only what the main help lists. A command line
        that names none (``--help``, a config file that chooses one) gets them all, as does one that names several
        (a value that reads like a subcommand).
        """
        if self._named_subcommands and subcommand not in self._named_subcommands:
            self._subcommand_method_arguments[subcommand] = []
            return self.init_parser(**kwargs)
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "test":  # the module prints its report table once; Lightning's is one per dataloader
            parser.set_defaults({"verbose": False})
        ckpt_path = next((action for action in parser._actions if action.dest == "ckpt_path"), None)
        if ckpt_path is not None:
            ckpt_path.help = CKPT_PATH_HELP[subcommand == "fit"]
        return parser

    def add_app_arguments(self, parser: LightningArgumentParser) -> None:
        """Add the app's callbacks and argument links (nothing by default)."""

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse, then check ``--ckpt_path``: resolve ``auto``, refuse damaged files and other apps' checkpoints.

        ``fit --ckpt_path auto`` (or ``last``) is resolved; in every subcommand a checkpoint that is a folder, empty,
        not a torch file or truncated is refused, and so is one that another app wrote (a missing one just before
        anything is built, so that a plan's validation parses a test of the checkpoint its fit will write). Done here,
        before LightningCLI reads the checkpoint's hyper-parameters, so that a damaged file gets an error that names
        it instead of an unpickling error, and another app's file one that names that app instead of a parser dump.
        """
        typed, args = args, self._move_config_options(args)
        self._args = args
        self._checkpoint_defaults(parser, args)
        with warnings.catch_warnings():
            if typed is None and args is not None:  # sys.argv with moved copies of its config files
                warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended to run")
            super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        config = self.config[subcommand]
        check_seed(config.get("seed_everything"))  # LightningCLI seeds before before_instantiate_classes
        given = sys.argv[1:] if args is None else args
        self.dropped_settings = settle_attention_groups(config, given, subcommand, self._trained)
        if rank_zero_only.rank == 0:
            for setting in self.dropped_settings:
                logger.info(setting.text)
        ckpt_path = config.get("ckpt_path")
        if subcommand == "fit" and ckpt_path in AUTO_RESUME:
            self._resume_automatically(config)
        elif ckpt_path is not None and ckpt_path not in LIGHTNING_CKPT_KEYWORDS:
            if subcommand == "fit" or Path(ckpt_path).exists():  # a missing one: see before_instantiate_classes
                check_checkpoint(ckpt_path, subcommand)
            check_origin(ckpt_path, app_of(self.model_class), subcommand)

    def _move_config_options(self, args: ArgsType) -> ArgsType:
        """``args`` with each config file that spells a moved data option the old way read through a moved copy.

        The datamodule's ``moved_options`` name the moves (:mod:`kpca.training.moved_options`); each one made is
        logged. Arguments given as a dict or Namespace, and a command line without such a file, stay as they are.
        """
        moved = getattr(self.datamodule_class, "moved_options", {})
        if not moved or not (args is None or isinstance(args, (list, tuple))):
            return args
        words, moves = self._moved_configs.rewrite(sys.argv[1:] if args is None else args, moved)
        _log_moves(moves)
        return words if moves else args

    def _checkpoint_defaults(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Let a checkpoint given to ``validate``/``test``/``predict``/``analyze``/``export`` stand in for the defaults.

        The model options it was trained with (and the data options its DataModule saved) become the subcommand
        parser's defaults, so that ``test -c <trainer> --ckpt_path X`` runs the checkpoint's model without its
        experiment file; typed options still override them (see :meth:`_parse_ckpt_path`). Data options saved under a
        spelling that has since moved are read at their new place (the datamodule's ``moved_options``), each move
        logged. Only a ``--ckpt_path`` typed on the command line is read here; a checkpoint that cannot be read is left
        to the later checks, which name the problem.
        """
        if not isinstance(args, (list, tuple)) and args is not None:
            return
        words = list(sys.argv[1:] if args is None else args)
        subcommand = next((word for word in words if word in self._subcommand_parsers), None)
        ckpt_path = _typed_value(words, "--ckpt_path")
        if subcommand in (None, "fit") or ckpt_path is None or not Path(ckpt_path).is_file():
            return
        try:
            trained, data = trained_model_options(ckpt_path), trained_data_options(ckpt_path)
        except Exception:  # noqa: BLE001 (any unreadable file: check_origin and Lightning name it later)
            return
        moved = getattr(self.datamodule_class, "moved_options", {})
        data, moves = move_options(data, moved, f"--ckpt_path {ckpt_path}")
        _log_moves(moves)
        subparser = self._subcommand_parsers[subcommand]
        self._trained = trained
        _set_saved_defaults(subparser, "model", trained)
        _set_saved_defaults(subparser, "data", data)

    def _parse_ckpt_path(self) -> None:
        """Run what the user typed: the checkpoint's model options fill in only the model options not typed.

        LightningCLI replaces the whole ``model`` section by the checkpoint's hyper-parameters, silently dropping model
        options typed in config files or on the command line. Here the checkpoint's options take the place of the
        defaults and every typed option stays: they were the parse's defaults (:meth:`_checkpoint_defaults`), or, for
        a ``--ckpt_path`` that only a config file names (and ``fit``'s), what was typed is merged over them
        (:func:`~kpca.training.checkpointing.trained_options.typed_over_trained`). The options that then differ from
        the training are kept in :attr:`trained_differences` and logged.
        """
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        trained = trained_model_options(ckpt_path)
        if not trained:
            return
        if self._trained is None:  # the checkpoint was no default of the parse: merge what was typed over it
            typed_config = self._typed_config()[subcommand]
            drop_settings(typed_config, self.dropped_settings)
            typed = typed_config.get("model")
            merged = typed_over_trained(trained, plain(typed) if typed is not None else {})
            self.config = self.parser.parse_object({subcommand: {"model": merged}}, self.config)
        self.trained_differences = option_differences(trained, plain(self.config[subcommand].model))
        if self.trained_differences and rank_zero_only.rank == 0:
            logger.warning(
                "%s runs with model options that differ from its checkpoint's training (what you typed runs): %s",
                subcommand,
                "; ".join(difference.text for difference in self.trained_differences),
            )

    def _typed_config(self) -> Namespace:
        """What the user typed (config files and command line), without the parser's defaults."""
        if isinstance(self._args, (dict, Namespace)):
            return self.parser.parse_object(self._args, defaults=False, _skip_validation=True)
        return self.parser.parse_args(self._args, defaults=False, _skip_validation=True)

    def before_instantiate_classes(self) -> None:
        """Refuse what this machine cannot run and option values that would fail inside the run, before any build.

        See :mod:`kpca.training.machine_checks`, :mod:`kpca.training.option_checks` and :meth:`check_options`.
        """
        if self.subcommand is not None:
            check_cache_folder(_data_setting(self.config[self.subcommand], "cache_dir"))
        if self.subcommand not in (None, CHECK_DATA):
            config = self.config[self.subcommand]
            ckpt_path = config.get("ckpt_path")
            if self.subcommand != "fit" and ckpt_path is not None and ckpt_path not in LIGHTNING_CKPT_KEYWORDS:
                check_checkpoint(ckpt_path, self.subcommand)  # missing: a plan's later step may name a future file
            check_machine(config.trainer)
            check_trainer_options(config.trainer)
            check_optimizer(config.model.get("optimizer"))
            self.check_options(config)

    def check_options(self, config: Namespace) -> None:
        """Refuse options of the app that must agree and do not (nothing here); ``config`` is the subcommand's."""

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        """Lightning's Trainer, its refusal of an argument as one error line (:func:`refused_trainer_options`)."""
        try:
            return super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, ValueError) as error:
            raise refused_trainer_options(error) from error

    def instantiate_classes(self) -> None:
        """Build the configured classes; for ``check-data`` the datamodule alone (no model, no trainer)."""
        if self.subcommand != CHECK_DATA:
            super().instantiate_classes()
            ckpt_path = self.config[self.subcommand].get("ckpt_path") if self.subcommand else None
            if self.trained_differences:
                check_weights_fit(self.model.state_dict(), ckpt_path, self.trained_differences)
            return
        parser = LightningArgumentParser()
        parser.add_lightning_class_args(self.datamodule_class, "data", subclass_mode=self.subclass_mode_data)
        self.datamodule = parser.instantiate(Namespace(data=self.config[CHECK_DATA].data)).data
        self.model = self.trainer = None

    def _run_subcommand(self, subcommand: str) -> None:
        """Run the subcommand: ``check-data`` exits with status 1 when it finds problems; ``fit`` holds its locks."""
        if subcommand == CHECK_DATA:
            options = self.config[CHECK_DATA]
            if self.trainer_class.check_data(self.datamodule, options.workers, options.progress).problems:
                raise SystemExit(1)
            return
        folder = _run_folder(self.trainer) if self.trainer.global_rank == 0 else None
        created = _missing_folders(folder) if folder is not None else []  # the run folder and its new parents
        try:
            with ExitStack() as locks:
                if subcommand == "fit" and self.trainer.global_rank == 0 and not self.trainer.fast_dev_run:
                    self._lock_run(locks)
                for level, note in self._auto_resume_notes:  # after the locks: a refused fit restores nothing
                    logger.log(level, note)
                super()._run_subcommand(subcommand)
        except BaseException:
            if created and not _work_started(self.trainer):
                _remove_unused_run_folder(created)  # after the locks are released: they live in it
            raise
        leave_process_group()

    def _lock_run(self, locks: ExitStack) -> None:
        """Take this fit's locks into ``locks``, then remove what killed checkpoint saves left in its folder.

        ``fit --ckpt_path auto`` first locks its experiment (its configuration, in the logger's experiment folder),
        so that an identical command refuses even before the first one saved a checkpoint; every fit locks its run
        folder (the logger's version folder), where its checkpoints, logs and config go. The leftovers are removed
        only under the lock: a running save's temporary file looks the same.
        """
        if self._experiment_lock is not None:
            what = f"this experiment (its configuration, with --ckpt_path auto) in {self._experiment_lock.parent}"
            locks.enter_context(RunLock(self._experiment_lock, what, NEW_RUN_OF_AN_EXPERIMENT))
        folder = _run_folder(self.trainer)
        locks.enter_context(RunLock(folder / RUN_LOCK_FILE, f"the run folder {folder}", NEW_RUN_FOLDER))
        remove_leftover_writes(folder / "checkpoints")

    def before_fit(self) -> None:
        """Tell the checkpoint callbacks that the run continues in its own folder when it resumes."""
        if self.config.fit.ckpt_path is not None:
            for callback in self.trainer.checkpoint_callbacks:
                if isinstance(callback, Checkpoint):
                    callback.resuming = True

    def after_fit(self) -> None:
        """Write ``<trainer.log_dir>/fit_summary.json`` (rank 0, atomically): the fit's best and last checkpoints.

        Keys: ``best_model_path``, ``best_model_score``, ``last_model_path`` (of the ``checkpoint`` callback, ""
        and None when it saved none), ``epoch`` and ``global_step``. Experiment plans read it to find the checkpoint
        that their later steps evaluate (:mod:`kpca.training.experiment.steps`).
        """
        log_dir = self.trainer.log_dir  # a broadcast from rank 0: every process asks
        if self.trainer.global_rank != 0 or log_dir is None:
            return
        callback = self.trainer.checkpoint_callback
        score = getattr(callback, "best_model_score", None)
        summary = {
            "best_model_path": getattr(callback, "best_model_path", ""),
            "best_model_score": None if score is None else float(score),
            "last_model_path": getattr(callback, "last_model_path", ""),
            "epoch": self.trainer.current_epoch,
            "global_step": self.trainer.global_step,
        }
        write_atomic(
            Path(log_dir) / FIT_SUMMARY,
            lambda stream: json.dump(summary, stream, indent=2),
            mode="w",
            encoding="utf-8",
        )

    def _resume_automatically(self, config) -> None:
        """Point ``ckpt_path`` and the logger's version at the checkpoint that resuming found, and say which.

        Which checkpoint is :func:`kpca.training.checkpointing.resume.resolve_auto_resume`'s rule.
        """
        dumped = yaml.safe_load(self._parser("fit").dump(config, skip_none=False))
        found = resolve_auto_resume(config, dumped, getattr(self.datamodule_class, "moved_options", {}))
        self._experiment_lock = found.lock
        resume = found.resume
        if rank_zero_only.rank == 0:  # every process resolves the same files; one tells, once it holds the locks
            for path, reason in resume.skipped:
                self._auto_resume_notes.append((logging.WARNING, f"auto resume: skipping {path}: {reason}"))
            if resume.checkpoint is None:
                self._auto_resume_notes.append(
                    (
                        logging.INFO,
                        f"auto resume: no readable checkpoint of this experiment in {found.experiment_dir}; starting "
                        "fresh",
                    )
                )
            else:
                note = f"auto resume: restoring {resume.checkpoint} (step {resume.step})"
                self._auto_resume_notes.append((logging.INFO, note))
        if resume.checkpoint is None:
            config.ckpt_path = None
            return
        init = config.trainer.logger.init_args
        config.ckpt_path = str(resume.checkpoint)
        init.version = resume.run_folder.name
        if "purge_step" in init:  # TensorBoard hides the events a killed run wrote after its last checkpoint
            init.purge_step = resume.step


def _log_moves(moves: list[Move]) -> None:
    """Name each data option read at its new place, once (rank zero)."""
    if rank_zero_only.rank == 0:
        for move in moves:
            logger.info(move.text)


def _set_saved_defaults(parser: LightningArgumentParser, prefix: str, options: dict) -> None:
    """Make saved options ``parser``'s defaults: a group (a dataclass) by its leaves, else each option whole.

    A key the parser does not have (an option renamed since the checkpoint was saved) is left to its default.
    """
    for key, value in options.items():
        dotted = f"{prefix}.{key}"
        if isinstance(value, dict) and value and CLASS_PATH not in value:
            try:  # a group's leaves, when the parser has an option for each
                for leaf, leaf_value in _leaves(dotted, value):
                    parser.set_defaults({leaf: leaf_value})
                continue
            except KeyError:
                pass
        with contextlib.suppress(KeyError, ValueError, TypeError):
            parser.set_defaults({dotted: value})


def _leaves(prefix: str, options: dict) -> list[tuple[str, object]]:
    """``(dotted key, value)`` of each leaf of nested ``options`` (a class spec is a leaf)."""
    leaves: list[tuple[str, object]] = []
    for key, value in options.items():
        dotted = f"{prefix}.{key}"
        nested = isinstance(value, dict) and value and CLASS_PATH not in value
        leaves += _leaves(dotted, value) if nested else [(dotted, value)]
    return leaves


def _data_setting(config: Namespace, name: str) -> Any:
    """The ``data`` section's setting ``name`` of a subcommand's config (None where the section has none)."""
    data = config.get("data")
    if data is not None and "init_args" in data:  # a datamodule given by class path
        data = data.init_args
    return data.get(name) if data is not None else None


def _named_subcommands(args: ArgsType, subcommands: dict[str, set[str]]) -> set[str]:
    """The subcommands a command line names (every word that is one); empty when ``args`` is not a command line."""
    if not isinstance(args, (list, tuple)) and args is not None:
        return set()
    words = sys.argv[1:] if args is None else args
    return {word for word in words if isinstance(word, str) and word in subcommands}


def _typed_value(words: list[str], option: str) -> str | None:
    """The value of ``option`` typed last on a command line (``--option=value`` or ``--option value``), if any."""
    value = None
    for i, word in enumerate(words):
        if word.startswith(f"{option}="):
            value = word.partition("=")[2]
        elif word == option and i + 1 < len(words):
            value = words[i + 1]
    return value


def _prog(model_class: type) -> dict[str, str]:
    """The command's name in help and errors (``vision-cls``, also under ``python -m kpca.vision_cls``), if an app's."""
    app = app_of(model_class)
    return {"prog": app_command(app)} if app is not None else {}


def leave_process_group() -> None:
    """Destroy this process's default process group, if any, once its subcommand has finished.

    Lightning destroys an NCCL group at exit but leaves a gloo group to the interpreter's finalization, where gloo's
    worker threads can end the process with SIGABRT ("terminate called without an active exception", one exit in
    three for 4 gloo ranks on torch 2.14; none once the group is destroyed). Destroying it is local: no rank waits
    for another, so a rank that died cannot make this hang. A subcommand that raised keeps the group (its peers may be
    inside a collective that the exception interrupted).
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _work_started(trainer: pl.Trainer) -> bool:
    """Whether any loop of ``trainer`` started a batch (training, validation, test or prediction)."""
    loops = (trainer.fit_loop.epoch_loop, trainer.validate_loop, trainer.test_loop, trainer.predict_loop)
    return any(loop.batch_progress.total.started for loop in loops) or trainer.global_step > 0


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and each parent of it that does not exist yet, innermost first (``[]`` when ``folder`` exists)."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_unused_run_folder(created: list[Path]) -> None:
    """Remove the run folder that a start which failed before any batch created, so the next try reuses its name.

    ``created`` is the run folder and the parents its start created (the logger's ``runs/<name>``), innermost first.
    Only a run folder holding nothing but what starting writes (its config, an empty log) goes: the next attempt then
    gets the same ``version_N``. A folder holding a checkpoint or a report is kept. The created parents go with it
    while they are empty.
    """
    folder = created[0]
    kept = [path for path in folder.rglob("*") if path.is_file() and not _start_file(path)]
    if kept:
        return
    shutil.rmtree(folder, ignore_errors=True)
    for parent in created[1:]:
        try:
            parent.rmdir()  # only while empty: another run may have started in it meanwhile
        except OSError:
            break
        folder = parent
    logger.info("removed %s: the run failed before its first batch", folder)


def _start_file(path: Path) -> bool:
    """A file that starting a run writes before any batch: its config, hparams, lock and TensorBoard event files."""
    return path.name in ("config.yaml", "hparams.yaml", RUN_LOCK_FILE) or path.name.startswith("events.out.tfevents.")


def _run_folder(trainer: pl.Trainer) -> Path:
    """The folder a fit writes into (``trainer.log_dir``), computed on this process alone.

    ``trainer.log_dir`` broadcasts from rank 0, a collective; this runs before the other processes exist.
    """
    if trainer.loggers:
        first = trainer.loggers[0]
        folder = first.log_dir if isinstance(first, (TensorBoardLogger, CSVLogger)) else first.save_dir
        if folder is not None:
            return Path(folder)
    return Path(trainer.default_root_dir)
