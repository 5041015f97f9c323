"""Kernel-PCA analysis of a trained network: per layer and head, on a fixed sample of data.

:func:`analyze_network` runs the network once on a batch, records every attention layer's input
(:mod:`kpca.attention.capture`) and computes :func:`kpca.attention.kernel_pca.kernel_pca_diagnostics`
per layer; :func:`write_analysis` writes the Markdown / CSV tables and a PNG, :func:`read_analysis` reads
such a CSV back (to merge several runs' tables); :class:`KernelPCAMonitor` logs the same numbers to the
loggers (scalars) and TensorBoard (figures) every N epochs during ``fit``, on one batch fixed at the start,
as the paper tracks J_proj over training.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from kpca.attention.capture import attention_layers, project_qkv, record_attention_inputs
from kpca.attention.kernel_pca import kernel_pca_diagnostics
from kpca.training.callbacks import layer_tag, tensorboard_writer
from kpca.training.errors import OptionError
from kpca.training.files import write_atomic
from kpca.training.results.tables import markdown_table, write_report

logger = logging.getLogger(__name__)

SUMMARY_METRICS = (
    "projection_loss",
    "gamma_spread",
    "gamma_spread_std",
    "eigen_residual",
    "gamma_scale",
    "value_alignment",
)
"""The per-head metrics of :class:`LayerAnalysis` that its summary, the tables and the monitor carry, in order."""


@dataclass(frozen=True)
class LayerAnalysis:
    """The kernel-PCA diagnostics of one attention layer, averaged over the samples (one value per head).

    Attributes:
        layer: the layer's path in the network without ``.attn`` (e.g. ``vit.blocks.0``).
        symmetric: whether the layer's queries are its keys.
        projection_loss: (H,) J_proj.
        gamma_spread: (H,) mean over value dims of the mean |γ_{d,i} − γ_{d,j}| (0 for eigenvectors).
        gamma_spread_std: (H,) mean over value dims of the std of |γ_{d,i} − γ_{d,j}|.
        eigen_residual: (H,) mean over value dims of the eigen-residual r_d in [0, 1] (0 for eigenvectors), the
            well-conditioned eigenvector test (the γ spread divides by â's entries).
        gamma_scale: (H,) mean over value dims of |mean_i γ_{d,i}|, the eigenvalue / N each â_d implies.
        value_alignment: (H,) share of the centred G V inside the top-Dv kernel principal axes.
        eigenvalues: (H, N) spectrum of the centred feature Gram matrix, descending.
    """

    layer: str
    symmetric: bool
    projection_loss: torch.Tensor
    gamma_spread: torch.Tensor
    gamma_spread_std: torch.Tensor
    eigen_residual: torch.Tensor
    gamma_scale: torch.Tensor
    value_alignment: torch.Tensor
    eigenvalues: torch.Tensor

    def summary(self) -> dict[str, float]:
        """The per-layer means over heads, by metric name (the names of :data:`SUMMARY_METRICS`, in order)."""
        return {name: float(getattr(self, name).mean()) for name in SUMMARY_METRICS}


def network_inputs(batch: Any) -> torch.Tensor:
    """The network input of a batch: the first tensor of ``(inputs, targets)`` or the ``images`` of a dict batch."""
    if isinstance(batch, (tuple, list)):
        inputs = batch[0]
    elif isinstance(batch, Mapping):
        inputs = batch.get("images")
    else:
        inputs = batch
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(
            f"kernel-PCA analysis needs a batch whose inputs are one tensor, got {type(inputs).__name__}; "
            "analyse a split whose batches stack equal-size samples (e.g. --split train)"
        )
    return inputs


@torch.no_grad()
def analyze_network(net: nn.Module, inputs: torch.Tensor) -> list[LayerAnalysis]:
    """Kernel-PCA diagnostics of every attention layer of ``net`` on one forward of ``inputs``.

    The network runs in eval mode (no dropout) and is put back in its former mode. Causal layers
    (``is_causal``) get the causal J_proj. Layers are in the order of ``net.named_modules()``.

    Raises:
        ValueError: when ``net`` has no attention layer with timm's layout.
    """
    layers = attention_layers(net)
    if not layers:
        raise OptionError(f"{type(net).__name__} has no attention layer with timm's layout (qkv, num_heads)")
    was_training = net.training
    net.eval()
    try:
        with record_attention_inputs(net) as recorded:
            net(inputs)
    finally:
        net.train(was_training)
    results = []
    for name, layer in layers.items():
        q, k, v, symmetric = project_qkv(layer, recorded[name])
        scale = getattr(layer, "scale", None)
        diagnostics = kernel_pca_diagnostics(
            q, k, v, scale=float(scale) if scale is not None else None, is_causal=getattr(layer, "is_causal", False)
        )
        test = diagnostics.eigenvector
        results.append(
            LayerAnalysis(
                layer=layer_tag(name),
                symmetric=symmetric,
                projection_loss=diagnostics.projection_loss.mean(0).cpu(),
                gamma_spread=test.spread_mean.mean((0, 2)).cpu(),
                gamma_spread_std=test.spread_std.mean((0, 2)).cpu(),
                eigen_residual=test.residual.mean((0, 2)).cpu(),
                gamma_scale=test.gamma_mean.abs().mean((0, 2)).cpu(),
                value_alignment=diagnostics.value_alignment.mean(0).cpu(),
                eigenvalues=diagnostics.eigenvalues.mean(0).cpu(),
            )
        )
    return results


def analysis_rows(results: Sequence[LayerAnalysis], **columns: object) -> list[dict[str, object]]:
    """One table row per layer (means over heads), each starting with ``columns`` (e.g. ``model=...``)."""
    return [
        {**columns, "layer": r.layer, "heads": len(r.projection_loss), "symmetric": r.symmetric, **r.summary()}
        for r in results
    ]


def analysis_figure(results_by_model: Mapping[str, Sequence[LayerAnalysis]]):
    """A matplotlib figure: J_proj per layer, the eigenvector test and each layer's Gram spectrum (colour: model).

    Layers from :func:`read_analysis` have no spectrum (an empty curve).
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for index, (model, results) in enumerate(results_by_model.items()):
        color = f"C{index}"
        layers = range(len(results))
        axes[0].plot(layers, [float(r.projection_loss.mean()) for r in results], marker="o", color=color, label=model)
        scale = torch.cat([r.gamma_scale for r in results]).numpy()
        spread = torch.cat([r.gamma_spread for r in results]).numpy()
        axes[1].scatter(scale, spread, s=14, color=color, label=model)
        for layer, result in enumerate(results):  # layers may differ in N (e.g. an encoder and a decoder)
            spectrum = result.eigenvalues.mean(0)[:-1].clamp_min(1e-30).numpy()  # the last is 0: C 1 = 0
            axes[2].semilogy(
                range(1, len(spectrum) + 1), spectrum, color=color, alpha=0.5, label=None if layer else model
            )
    axes[0].set(title="Projection loss J_proj per layer", xlabel="layer", ylabel="J_proj (mean over heads)")
    axes[0].xaxis.get_major_locator().set_params(integer=True)
    axes[1].set(title="Eigenvector test per layer and head", xlabel="|mean γ| (eigenvalue / N)")
    axes[1].set(ylabel="mean |γ_i − γ_j|", xscale="log", yscale="log")
    axes[2].set(title="Centred Gram spectrum per layer (mean over heads)", xlabel="index", ylabel="eigenvalue")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plt_close(fig) -> None:
    """Release a figure made by :func:`analysis_figure` (pyplot keeps every open figure alive)."""
    from matplotlib import pyplot as plt

    plt.close(fig)


def write_analysis(
    results_by_model: Mapping[str, Sequence[LayerAnalysis]], out_dir: str | os.PathLike[str], name: str = "kernel_pca"
) -> tuple[Path, Path, Path]:
    """Write ``<name>.md`` / ``<name>.csv`` (one row per model and layer) and ``<name>.png``, atomically.

    Returns:
        ``(markdown_path, csv_path, png_path)``.
    """
    rows = [row for model, results in results_by_model.items() for row in analysis_rows(results, model=model)]
    md_path, csv_path = write_report(rows, out_dir, name)
    fig = analysis_figure(results_by_model)
    png_path = Path(out_dir) / f"{name}.png"
    write_atomic(png_path, lambda stream: fig.savefig(stream, format="png", dpi=110))
    plt_close(fig)
    logger.info("wrote %s", png_path)
    return md_path, csv_path, png_path


def read_analysis(path: Path, *, model: str | None = None) -> list[LayerAnalysis]:
    """The layers of a ``<name>.csv`` written by :func:`write_analysis`, in its row order.

    The CSV keeps only the means over heads: each per-head tensor read back holds its layer's mean repeated
    over the layer's ``heads`` (float64), so :meth:`LayerAnalysis.summary` gives the CSV's values (to the last
    bit of rounding) and :func:`analysis_rows`, :func:`analysis_markdown`, :func:`analysis_figure` and
    :func:`write_analysis` take the result. The CSV has no Gram spectrum: ``eigenvalues`` is (H, 0).

    Args:
        path: the CSV file.
        model: the ``model`` whose rows to read; None when the file holds one model only.

    Raises:
        ValueError: when a column is missing (a table written before the column existed: run ``analyze``
            again), a cell does not parse, the file has no rows, or ``model`` is None for a file of several
            models or not one of them.
    """
    with Path(path).open(newline="", encoding="utf-8") as stream:
        reader = csv.DictReader(stream)
        columns = ("model", "layer", "heads", "symmetric", *SUMMARY_METRICS)
        missing = [column for column in columns if column not in (reader.fieldnames or ())]
        if missing:
            raise OptionError(
                f"{path} lacks the kernel-PCA column(s) {missing}; it is not a table of write_analysis or was "
                "written by an older version: run analyze again to rewrite it"
            )
        rows = list(reader)
    models = list(dict.fromkeys(row["model"] for row in rows))
    if not models:
        raise OptionError(f"{path} has no rows; write it with write_analysis from at least one layer")
    if model is None and len(models) > 1:
        raise OptionError(f"{path} holds the models {models}; pass model= one of them")
    chosen = models[0] if model is None else model
    if chosen not in models:
        raise OptionError(f"model {chosen!r} is not in {path}, which holds {models}")
    return [_layer_from_row(row, path) for row in rows if row["model"] == chosen]


def _layer_from_row(row: Mapping[str, str], path: Path) -> LayerAnalysis:
    """One :class:`LayerAnalysis` from a CSV row of :func:`analysis_rows` (each per-head tensor: the mean, H times)."""
    try:
        heads = int(row["heads"])
        values = {name: float(row[name]) for name in SUMMARY_METRICS}
    except ValueError as error:
        raise OptionError(f"{path}, layer {row['layer']!r}: a cell is not a number ({error})") from error
    if heads < 1 or row["symmetric"] not in ("True", "False"):
        raise OptionError(
            f"{path}, layer {row['layer']!r}: heads must be a positive int and symmetric True or False, "
            f"got heads={row['heads']!r}, symmetric={row['symmetric']!r}"
        )
    return LayerAnalysis(
        layer=row["layer"],
        symmetric=row["symmetric"] == "True",
        **{name: torch.full((heads,), value, dtype=torch.float64) for name, value in values.items()},
        eigenvalues=torch.zeros(heads, 0, dtype=torch.float64),
    )


def analysis_markdown(results_by_model: Mapping[str, Sequence[LayerAnalysis]]) -> str:
    """The Markdown table of :func:`write_analysis`, for embedding in another report."""
    return markdown_table([r for m, res in results_by_model.items() for r in analysis_rows(res, model=m)])


class KernelPCAMonitor(pl.Callback):
    """Every every_n_epochs training epochs, log the kernel-PCA diagnostics on one fixed batch.

    The batch (its first ``samples`` inputs) is taken from the first validation dataloader when
    ``fit`` starts and kept, so the curves compare like with like, as in the paper's J_proj plot.
    Process 0 computes and writes; keys ``kpca/<layer>/<metric>`` for the metrics of
    :meth:`LayerAnalysis.summary`, at the global step; TensorBoard also gets the figure of
    :func:`analysis_figure` under ``kpca/analysis``. ``every_n_epochs: 0`` turns it off.

    Args:
        every_n_epochs: period in epochs (0: off).
        samples: how many inputs of the batch are analysed.
    """

    def __init__(self, every_n_epochs: int = 0, samples: int = 8) -> None:
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 0:
            raise OptionError(f"every_n_epochs must be an int >= 0 (0 turns the monitor off), got {every_n_epochs!r}")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise OptionError(f"samples must be a positive int, got {samples!r}")
        self.every_n_epochs = every_n_epochs
        self.samples = samples
        self._inputs: torch.Tensor | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Fix the analysed batch: the first ``samples`` inputs of the first validation batch (process 0)."""
        if not self.every_n_epochs or not trainer.is_global_zero:
            return
        loaders = trainer.datamodule.val_dataloader() if trainer.datamodule is not None else None
        if loaders is None:
            raise OptionError("KernelPCAMonitor needs a datamodule with a val_dataloader to fix its batch")
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        self._inputs = network_inputs(next(iter(loader)))[: self.samples].clone()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Analyse and log on the epochs the period selects."""
        if self._inputs is None or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        net = getattr(pl_module, "net", pl_module)
        results = analyze_network(net, self._inputs.to(pl_module.device))
        metrics = {f"kpca/{r.layer}/{key}": value for r in results for key, value in r.summary().items()}
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=trainer.global_step)
        writer = tensorboard_writer(trainer)
        if writer is not None:  # add_figure closes the figure
            writer.add_figure("kpca/analysis", analysis_figure({type(net).__name__: results}), trainer.global_step)
