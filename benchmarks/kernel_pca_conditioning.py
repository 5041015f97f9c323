"""How far the kernel-PCA statistics of a trained model move under tiny relative weight perturbations.

Loads a vision fit's best checkpoint (the ``fit_summary.json`` of its run folder), runs the kernel-PCA analysis
(:func:`kpca.training.analysis.analyze_network`) on the first validation images of its own data, then again after
multiplying every floating-point weight by ``1 + eps * N(0, 1)`` (seeded), and prints, per layer, the relative
change of the paper's eigenvector-test spread (mean |γ_i − γ_j|), the eigen-residual and J_proj. A statistic worth
reporting moves by about ``eps``; one that moves by orders of magnitude more is ill-conditioned.

    python benchmarks/kernel_pca_conditioning.py runs/demo/symmetric/seed0/fit
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml

from kpca.training.analysis import analyze_network
from kpca.training.moved_options import move_options
from kpca.training.trainer import first_inputs
from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.eval_data import EvalData
from kpca.vision_cls.input import TrainData
from kpca.vision_cls.module import ClassificationModule

METRICS = ("gamma_spread", "eigen_residual", "projection_loss")


def layer_summaries(net: torch.nn.Module, inputs: torch.Tensor) -> dict[str, dict[str, float]]:
    """``layer -> metric -> value`` (means over heads) of every attention layer."""
    return {layer.layer: layer.summary() for layer in analyze_network(net, inputs)}


def perturbed(state: dict[str, torch.Tensor], eps: float, seed: int) -> dict[str, torch.Tensor]:
    """Every floating-point tensor of ``state`` times ``1 + eps * N(0, 1)`` (a seeded relative perturbation)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: value * (1 + eps * torch.randn(value.shape, generator=generator, dtype=value.dtype))
        if value.is_floating_point()
        else value
        for name, value in state.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fit_folder", type=Path, help="a vision fit's run folder (holds fit_summary.json)")
    parser.add_argument("--samples", type=int, default=32, help="validation images analysed (the demo's 32)")
    parser.add_argument("--eps", type=float, nargs="+", default=[1e-6, 1e-4], help="relative perturbation sizes")
    parser.add_argument("--trials", type=int, default=2, help="perturbations (seeds) per size")
    args = parser.parse_args()
    summary = json.loads((args.fit_folder / "fit_summary.json").read_text(encoding="utf-8"))
    config = yaml.safe_load((args.fit_folder / "config.yaml").read_text(encoding="utf-8"))
    net = ClassificationModule.load_from_checkpoint(summary["best_model_path"], map_location="cpu").net.eval()
    saved, _ = move_options(config["data"], ImageNetDataModule.moved_options, "config")  # a run saved before data.train
    data = {**saved, "train": TrainData(**saved.get("train") or {}), "eval": EvalData(**saved.get("eval") or {})}
    inputs = first_inputs(ImageNetDataModule(**data), "val", args.samples)
    base = layer_summaries(net, inputs)
    state = {name: value.clone() for name, value in net.state_dict().items()}
    print(f"| eps | seed | layer | {' | '.join(f'{m} (rel. change)' for m in METRICS)} |")
    print("|" + " --- |" * (3 + len(METRICS)))
    for eps in args.eps:
        for seed in range(args.trials):
            net.load_state_dict(perturbed(state, eps, seed))
            moved = layer_summaries(net, inputs)
            for layer, before in base.items():
                cells = [
                    f"{before[m]:.6g} → {moved[layer][m]:.6g} ({abs(moved[layer][m] - before[m]) / abs(before[m]):.1e})"
                    for m in METRICS
                ]
                print(f"| {eps:g} | {seed} | {layer} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
