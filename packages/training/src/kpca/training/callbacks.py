"""Callbacks every app gets: per-RPC-layer PAP diagnostics, throughput, and the trainer's TensorBoard writer."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from torch import nn
from torch.nn.utils import get_total_norm

from kpca.attention import RPCAttention
from kpca.training.choices import check_choice
from kpca.training.errors import OptionError
from kpca.training.results.protocol import read_protocol_file

logger = logging.getLogger(__name__)


def rpc_layers(net: nn.Module) -> dict[str, RPCAttention]:
    """The RPC attention modules of ``net`` by their qualified name in ``net``."""
    return {name: m for name, m in net.named_modules() if isinstance(m, RPCAttention)}


def layer_tag(name: str) -> str:
    """The log tag of an attention layer (RPC diagnostics, kernel-PCA rows): its path without the trailing ``.attn``.

    E.g. ``vit.blocks.0.attn`` -> ``vit.blocks.0``, ``decoder.blocks.0.attn`` -> ``decoder.blocks.0``.
    """
    return name.removesuffix(".attn")


def tensorboard_writer(trainer: pl.Trainer):
    """The ``SummaryWriter`` of the trainer's first TensorBoard logger, or None when it has none."""
    for lg in trainer.loggers:
        if isinstance(lg, TensorBoardLogger):
            return lg.experiment
    return None


class RPCDiagnostics(pl.Callback):
    """Every every_n_steps training steps, log each RPC layer's fraction of non-zero S and PAP residual.

    The PAP state is recorded only on those steps, so other steps pay nothing, and written to the loggers at
    the step it was recorded (not held until Lightning's next ``log_every_n_steps``). The layers are those of the
    LightningModule's network (``pl_module.net``, or the module itself when it has none), tagged by their
    path in it (:func:`layer_tag`), the same rule in every app. Keys: ``train/rpc/<tag>/nonzero_S`` and
    ``train/rpc/<tag>/residual`` (last iteration, mean over samples and heads), and
    ``train/rpc/<tag>/residual_first`` for the first iteration.

    Args:
        every_n_steps: logging period in optimizer steps.
    """

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise OptionError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._step = 0

    @staticmethod
    def _layers(pl_module: pl.LightningModule) -> dict[str, RPCAttention]:
        net = getattr(pl_module, "net", None)
        return rpc_layers(net if isinstance(net, nn.Module) else pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step
        record = self._step % self.every_n_steps == 0
        for layer in self._layers(pl_module).values():
            layer.record_state = record

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = {}
        for name, layer in self._layers(pl_module).items():
            if not layer.record_state or layer.last_state is None:
                continue
            state, tag = layer.last_state, layer_tag(name)
            metrics[f"train/rpc/{tag}/nonzero_S"] = float(state.nonzero_fraction[-1].mean())
            metrics[f"train/rpc/{tag}/residual"] = float(state.residual[-1].mean())
            metrics[f"train/rpc/{tag}/residual_first"] = float(state.residual[0].mean())
            layer.record_state = False
            layer.last_state = None
        if metrics:  # straight to the loggers (rank 0 writes), at the recorded step, as LearningRateMonitor does
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=self._step)


NonFiniteAction = Literal["stop", "skip"]
"""What :class:`NonFiniteLoss` does at a non-finite loss or gradient: end the run, or drop the step."""


class NonFiniteLoss(pl.Callback):
    """Stop training (or skip the step) when the loss or the gradients are not finite, before the optimizer step.

    The check runs on the gradients after DDP's all-reduce (a NaN or inf loss makes them non-finite), so every
    process sees the same and acts alike; the loss named in the message is this process's. With ``stop`` the
    run ends with an error naming the step and the value, before the bad step changes the weights, so the last
    checkpoint holds the last good ones. With ``skip`` the gradients are dropped (``optimizer.step`` then leaves
    every parameter and its state alone; the lr schedule still advances) and a warning names the step. Runs
    with a gradient scaler (``16-mixed``) are left to the scaler, which skips such steps itself.

    Args:
        action: ``stop`` or ``skip``.
    """

    def __init__(self, action: NonFiniteAction = "stop") -> None:
        check_choice("action", action, NonFiniteAction, "stop ends the run, skip drops the step")
        self.action = action
        self._loss: torch.Tensor | None = None

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = get_total_norm(grads)  # one 2-norm over every gradient (0 without gradients)
        if bool(torch.isfinite(norm)):  # decided on the all-reduced gradients: every process agrees
            return
        loss = float(self._loss) if self._loss is not None else float("nan")
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch}): loss {loss}, gradient norm {norm.item()}"
        if self.action == "stop":
            raise FloatingPointError(
                f"non-finite training {where}. Stopped before the optimizer step, so the last checkpoint holds "
                "the last good weights. Lower the learning rate or clip gradients (trainer.gradient_clip_val), "
                "or set nonfinite_loss.action=skip to skip such steps."
            )
        logger.warning("skipping the optimizer step at non-finite %s", where)
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.grad = None


class Throughput(ThroughputMonitor):
    """Lightning's ThroughputMonitor with its rolling window as an argument the CLI can set.

    Logs ``train/device/samples_per_sec`` (and ``train/samples_per_sec`` over all processes when there are
    several), ``.../items_per_sec`` when ``length_fn`` counts items (tokens), each a mean over the last
    ``window_size`` batches, data loading included; the same for validation under ``validate/``. It measures
    ``fit`` only: ``test`` and ``predict`` batches have other layouts (prompts, lists of images) and their
    speed is not a training concern.

    Args:
        batch_size_fn: samples in a batch.
        length_fn: items (e.g. tokens) in a batch; None logs no items.
        window_size: batches in the rolling mean (at least 2); nothing is logged before that many.
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int],
        length_fn: Callable[[Any], int] | None = None,
        window_size: int = 20,
    ) -> None:
        if window_size < 2:
            raise OptionError(f"window_size must be >= 2 (a rate needs two time stamps), got {window_size}")
        super().__init__(batch_size_fn, length_fn, window_size=window_size)

    def on_test_start(self, *args: Any) -> None:
        """Not measured (see the class docstring)."""

    def on_test_batch_end(self, *args: Any, **kwargs: Any) -> None:
        """Not measured (see the class docstring)."""

    def on_predict_start(self, *args: Any) -> None:
        """Not measured (see the class docstring)."""

    def on_predict_batch_end(self, *args: Any, **kwargs: Any) -> None:
        """Not measured (see the class docstring)."""


class HParamsSummary(pl.Callback):
    """Write each run's hyper-parameters with its real final metrics for TensorBoard's HParams tab.

    Lightning's own hyper-parameter summary carries a placeholder ``hp_metric`` (the trainer files turn it off
    with ``default_hp_metric: false``); this callback writes the one summary of a run when it ends: at the end of
    ``fit`` with the final ``val/*`` metrics and the checkpoint callback's best score (``hparams/best/<monitor>``),
    at the end of ``validate`` / ``test`` with that stage's metrics. Metrics are logged as scalars under
    ``hparams/<name>`` (so they never collide with the run's curves). The hyper-parameters are those Lightning
    collected for the loggers (the module's and the datamodule's saved arguments, the network's config included)
    plus the global seed; a ``test`` run adds the protocol of each column group of its report as
    ``protocol/<group>`` (the ``protocol.json`` its evaluation wrote into the log dir: ``published`` or
    ``ours: <differences>``).
    """

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Summarise a fit: final validation metrics, damaged files skipped, and the best monitored score."""
        metrics = {**self._metrics(trainer, "val/"), **self._metrics(trainer, "data/")}
        best = trainer.checkpoint_callback
        if best is not None and getattr(best, "best_model_score", None) is not None:
            metrics[f"hparams/best/{best.monitor}"] = float(best.best_model_score)
        self._write(trainer, metrics)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Summarise a ``validate`` run (validation inside ``fit`` is summarised at the end of the fit)."""
        if trainer.state.fn == "validate":
            self._write(trainer, self._metrics(trainer, "val/"))

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Summarise a ``test`` run with every test metric and the protocol of each column group of its report."""
        protocols = read_protocol_file(trainer.log_dir) if trainer.log_dir is not None else {}
        params = {f"protocol/{group}": text for group, text in protocols.items()}
        self._write(trainer, self._metrics(trainer, "test/"), params)

    @staticmethod
    def _metrics(trainer: pl.Trainer, prefix: str) -> dict[str, float]:
        return {
            f"hparams/{name}": float(value)
            for name, value in trainer.callback_metrics.items()
            if name.startswith(prefix) and value.numel() == 1
        }

    @staticmethod
    def _write(trainer: pl.Trainer, metrics: dict[str, float], extra: dict[str, str] | None = None) -> None:
        if not metrics or trainer.sanity_checking:
            return
        for lg in trainer.loggers:
            if isinstance(lg, TensorBoardLogger):
                params = {k: v for k, v in lg.hparams.items() if not k.startswith("_")}  # not _instantiator
                params["seed"] = os.environ.get("PL_GLOBAL_SEED", "none")
                params.update(extra or {})
                lg.log_hyperparams(params, metrics, step=trainer.global_step)


class DeferredSlurmRequeue(pl.Callback):
    """Run Lightning's SLURM auto-requeue at the next batch boundary instead of inside the signal handler.

    Lightning saves the hpc checkpoint, finalises the loggers and calls ``scontrol requeue`` inside the
    SIGUSR1 handler, which Python runs between any two bytecodes: when the signal lands while the main
    thread holds a lock that the handler needs (a logger's writer, a file being written), the job hangs
    until SLURM kills it, without a checkpoint (Lightning issue #21406; seen here once in CI). From the start
    of a stage (``on_train_start`` for ``fit``; ``validate``, ``test`` and ``predict`` at theirs), the signal only
    sets a flag; Lightning's own handler then runs after the current batch (in ``fit``, after the current training
    batch or at the end of the current validation). Under DDP the flag of ``fit`` is reduced over ranks (any rank
    signalled), at points every rank reaches together, so every rank saves at the same step: not after a
    validation batch, since unpadded evaluation gives ranks different numbers of batches.

    Under SLURM the apps start with the signal held (:mod:`kpca.training.slurm_start`) in every thread, so it
    never reaches a handler: it stays pending, and this callback takes it at the batch boundary. A signal that
    came during start-up then requeues after the first batch, and one that comes after the stage is discarded
    with the finished process, where SIGUSR1's default action would end the job FAILED. Nothing changes outside
    SLURM auto-requeue.
    """

    def __init__(self) -> None:
        self._signal: int | None = None
        self._lightning_handler: Callable | None = None
        self._pending = False

    def _take_over(self, trainer: pl.Trainer) -> None:
        """Put the flag-setting handler in front of Lightning's requeue handler (registered before the stage)."""
        environment = trainer._accelerator_connector.cluster_environment
        if not isinstance(environment, SLURMEnvironment) or not environment.auto_requeue:
            return
        requeue_signal = environment.requeue_signal
        handler = signal.getsignal(requeue_signal)
        if not callable(handler) or handler is self._defer:
            return
        self._signal, self._lightning_handler, self._pending = requeue_signal, handler, False
        signal.signal(requeue_signal, self._defer)

    def _defer(self, signum: int, frame: object) -> None:
        self._pending = True

    def _requeue_if_signalled(self, trainer: pl.Trainer) -> None:
        """Run Lightning's handler if the signal came; in ``fit`` on every rank if it came to any.

        ``validate``, ``test`` and ``predict`` act on each process's own signal, as Lightning's handler does (SLURM
        signals every task): their ranks may run different numbers of batches, so no collective there.
        """
        if self._lightning_handler is None:
            return
        if self._signal in signal.sigpending():  # held since the start (slurm_start): take it here
            signal.sigtimedwait({self._signal}, 0)
            self._pending = True
        signalled = self._pending
        if trainer.state.fn == "fit":
            signalled = trainer.strategy.reduce_boolean_decision(self._pending, all=False)
        if signalled:
            self._pending = False
            self._lightning_handler(self._signal, None)

    def _forget(self) -> None:
        """Lightning restores the process's own handlers at teardown; a held signal stays held."""
        self._lightning_handler = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``fit``: defer the requeue to batch boundaries."""
        self._take_over(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Requeue after a training batch if the signal came."""
        self._requeue_if_signalled(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        """``validate``: requeue after a validation batch if the signal came (``fit``: at the validation's end)."""
        if trainer.state.fn == "validate":
            self._requeue_if_signalled(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``fit`` has ended."""
        self._forget()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``validate``: defer the requeue to batch boundaries (``fit``'s validation is part of its stage)."""
        if trainer.state.fn == "validate":
            self._take_over(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``fit``: requeue after its validation if the signal came. ``validate`` has ended."""
        if trainer.state.fn == "fit":
            self._requeue_if_signalled(trainer)
        elif trainer.state.fn == "validate":
            self._forget()

    def _evaluation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``test`` or ``predict``: defer the requeue to batch boundaries."""
        self._take_over(trainer)

    def _evaluation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        """Requeue after a ``test`` or ``predict`` batch if the signal came."""
        self._requeue_if_signalled(trainer)

    def _evaluation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``test`` or ``predict`` has ended."""
        self._forget()

    on_test_start = on_predict_start = _evaluation_start
    on_test_batch_end = on_predict_batch_end = _evaluation_batch_end
    on_test_end = on_predict_end = _evaluation_end
