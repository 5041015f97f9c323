"""NetModule: the base LightningModule of every app, around an injected network and optimizer factory."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import nn
from torch.utils.data import DataLoader
from torchmetrics import MeanMetric

from kpca.training.checkpointing.origin import record_origin
from kpca.training.checkpointing.restore import ExactResume
from kpca.training.checkpointing.resume import record_run_folder
from kpca.training.errors import OptionError

ALWAYS_UNSAVED_HPARAMS = ("compile",)
"""Arguments of every :class:`NetModule` that describe how a run executes, not the model: never saved."""


@dataclass(frozen=True)
class CompileOptions:
    """The ``torch.compile`` arguments the network is compiled with (YAML ``model.compile``; ``true`` is the defaults).

    Args:
        mode: Inductor's mode: ``default``, ``reduce-overhead`` (CUDA graphs), ``max-autotune`` or
            ``max-autotune-no-cudagraphs``; None is torch's default.
        fullgraph: raise at the first graph break instead of running that part eagerly.
        dynamic: True compiles for symbolic shapes from the start, False for each shape seen, None (torch's
            default) turns a dimension symbolic once it changes.
        backend: the compiler backend (``inductor``; ``aot_eager`` traces without generating code, to debug).
    """

    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    backend: str = "inductor"


def compile_options(compile: bool | CompileOptions) -> CompileOptions | None:
    """The options ``compile`` asks for: None when off, the defaults for True; TypeError for anything else."""
    if isinstance(compile, CompileOptions):
        return compile
    if isinstance(compile, bool):
        return CompileOptions() if compile else None
    raise TypeError(f"compile must be a bool or a CompileOptions, got {compile!r}; e.g. --model.compile true")


def compile_in_place(net: nn.Module, methods: tuple[str, ...], options: CompileOptions) -> None:
    """Replace each of ``net``'s ``methods`` on the instance by its ``torch.compile`` (of the bound method).

    The module tree, its parameter names and its state_dict do not change (no ``_orig_mod.``), unlike with
    ``torch.compile(net)``; ``forward`` covers ``net(x)``. Compilation itself happens at the first call.
    """
    for name in methods:
        setattr(net, name, torch.compile(getattr(net, name), **asdict(options)))


def empty_training_loader_message(loader: object, world_size: int) -> str:
    """Why ``loader``, this rank's training loader, yields no batch, with the numbers and the fix.

    For a ``DataLoader``: the training set's size, the samples its sampler gives each device per epoch, the
    per-device and global batch (``world_size`` devices × nodes) and ``drop_last``; any other loader is named.
    """
    if not isinstance(loader, DataLoader) or loader.batch_size is None:
        return (
            f"The training loader ({type(loader).__name__}) yields no batch, so fit would train nothing; give it "
            "training data, or set trainer.limit_train_batches=0 to fit without training."
        )
    batch, per_device = loader.batch_size, len(loader.sampler)
    dropped = ", and drop_last=True drops a partial batch" if loader.drop_last else ""
    fix = "train on more data"
    if per_device:
        fix = f"set data.batch_size to at most {per_device * world_size} (one full batch per device), or {fix}"
    return (
        f"The training loader yields no batch, so fit would train nothing: the training set has "
        f"{len(loader.dataset)} samples, of which each of the {world_size} device(s) (devices × nodes) gets "
        f"{per_device} per epoch, fewer than its batch of {batch} (data.batch_size={batch * world_size} over "
        f"{world_size} device(s)){dropped}. To train, {fix}."
    )


def require_training_batches(trainer: pl.Trainer) -> None:
    """Raise :class:`OptionError` if ``fit`` would find no training batch; building the training loader if needed.

    Lightning would warn "No training batches" and end the fit with nothing trained and no checkpoint. Not
    refused: ``trainer.limit_train_batches=0`` (no training asked for). The loader is built as
    ``trainer.estimated_stepping_batches`` builds it (a checkpoint's loader states are applied later, at
    ``on_train_start``). Its length depends on the config and the dataset's size only, so under DDP every rank
    refuses alike.
    """
    if trainer.limit_train_batches == 0:
        return
    if trainer.train_dataloader is None:
        trainer.fit_loop.setup_data()
    if trainer.num_training_batches == 0:
        raise OptionError(empty_training_loader_message(trainer.train_dataloader, trainer.world_size))


class NetModule(ExactResume, pl.LightningModule):
    """A LightningModule whose network and optimizer factory arrive as constructor arguments (so YAML swaps them).

    Hyper-parameters are saved by one rule for every app. Built from Python, the network is not saved (it is
    an object). Built by LightningCLI, the parsed config is saved, network included as its ``class_path`` /
    ``init_args``, so ``load_from_checkpoint`` rebuilds the model. Names in :attr:`unsaved_hparams` and
    ``compile`` are never saved: a checkpoint's hparams override the config of ``test --ckpt_path``, so
    evaluation and execution settings stay out (a model loaded from a checkpoint runs eager unless asked).
    Checkpoints carry every rank's RNG states (:class:`ExactResume`), the run folder that wrote them
    (for ``--ckpt_path auto``, :mod:`kpca.training.checkpointing.resume`) and the app that wrote them (another app's
    command refuses them by name, :mod:`kpca.training.checkpointing.origin`).

    With ``compile``, :meth:`configure_model` compiles the network's :attr:`compiled_methods` in place, as
    Lightning advises for submodules: parameter names and checkpoints are those of the eager network, so
    checkpoints move freely between compiled and eager runs. Submodules called directly run eager (the
    attention-map callback recomputes its maps with the attention layers). Each state the compiled code depends on
    costs one compile: grad mode (training, evaluation, attacks), a new input shape (then compiled for symbolic
    shapes), the RPC diagnostics' ``record_state``. Torch does not guard on the hooks themselves
    (``torch._dynamo.config.skip_nnmodule_hook_guards``): a graph traced with earlier forward hooks may run in
    place of new ones, so calls that register hooks should run eager (``torch.compiler.set_stance("force_eager")``).

    Subclasses call ``super().__init__(net, optimizer, compile)`` first in their ``__init__``.

    Args:
        net: the network.
        optimizer: optimizer factory taking parameters or parameter groups.
        compile: compile the network with ``torch.compile`` (True: torch's defaults; or :class:`CompileOptions`).
    """

    unsaved_hparams: tuple[str, ...] = ()
    compiled_methods: tuple[str, ...] = ("forward",)
    """The network's methods that ``compile`` compiles: those the steps call (``forward`` is ``net(x)``)."""
    flops_per_batch: int | None = None
    """FLOPs per training batch for ``ThroughputMonitor``'s MFU; None: not measured (samples/s still logged)."""

    def __init__(self, net: nn.Module, optimizer: OptimizerCallable, compile: bool | CompileOptions = False) -> None:
        super().__init__()
        unsaved = [*ALWAYS_UNSAVED_HPARAMS, *self.unsaved_hparams]
        self.save_hyperparameters(ignore=["net", *unsaved])
        if "_instantiator" in self.hparams:
            self.save_hyperparameters(ignore=unsaved)
        self.net = net
        self.optimizer_factory = optimizer
        self.compile_options = compile_options(compile)
        self._net_compiled = False
        self.train_loss = MeanMetric(nan_strategy="disable")  # a non-finite loss shows in the mean, as logged

    def log_train_loss(self, loss: torch.Tensor, batch_size: int) -> None:
        """Log ``train/loss``: each step's loss on this process, and each epoch's mean over every process's batches.

        The epoch value is a torchmetrics ``MeanMetric`` weighted by ``batch_size``, which Lightning computes at the
        epoch's end, synchronised across processes, and then resets: under DDP a plain ``self.log(...,
        on_epoch=True)`` would log rank 0's mean alone. The step value stays this process's, as Lightning logs it.
        A non-finite loss is kept (the epoch mean is then NaN or inf, as plain logging gives), neither dropped nor
        warned about: :class:`~kpca.training.callbacks.NonFiniteLoss` is what reports it.
        TensorBoard names them ``train/loss_step`` and ``train/loss_epoch``.

        Args:
            loss: the step's scalar loss.
            batch_size: the samples it averages over on this process (the epoch mean's weight).
        """
        self.train_loss(loss.detach(), batch_size)
        self.log("train/loss", self.train_loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=batch_size)

    def configure_model(self) -> None:
        """Compile the network's :attr:`compiled_methods` in place (:func:`compile_in_place`) when ``compile`` asks.

        Once: Lightning calls this hook at every stage (and ``load_from_checkpoint`` calls it too).
        """
        if self.compile_options is None or self._net_compiled:
            return
        compile_in_place(self.net, self.compiled_methods, self.compile_options)
        self._net_compiled = True

    def on_fit_start(self) -> None:
        """Refuse a fit whose training loader yields no batch (:func:`require_training_batches`), before any step."""
        super().on_fit_start()
        require_training_batches(self.trainer)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Add the run folder and the app to the RNG states (on every rank: ``log_dir`` is agreed between ranks)."""
        super().on_save_checkpoint(checkpoint)
        record_run_folder(checkpoint, self.trainer.log_dir)
        record_origin(checkpoint, type(self))

    def report_dir(self) -> str:
        """The folder for this run's reports: the logger's folder, or the trainer's root without a logger.

        A collective under DDP (the TensorBoard logger's folder is agreed between ranks): call it on every rank.
        """
        return self.trainer.log_dir or self.trainer.default_root_dir
