"""Robustness metrics: ImageNet-C mCE, the ImageNet-A/R/O variants, OOD AUPR, per-corruption report rows.

Legend: B batch, K classes of the model (1000), M classes of a variant (200).
The variants are ImageNet-A, -R and -O: test sets of 200 of ImageNet's classes each (:data:`VariantName`).

Sources, checked against each other:

* ``ALEXNET_ERRORS`` are AlexNet's (torchvision weights) top-1 errors on ImageNet-C averaged over
  severities 1-5, the normaliser of Hendrycks & Dietterich's mCE (ICLR 2019), as in
  google-research/augmix ``imagenet.py`` (``ALEXNET_ERR``, "taken from hendrycks/robustness") and
  mmcls/mmpretrain's ImageNet-C metric. ``ALEXNET_ERRORS_BY_SEVERITY`` (the per-severity table a
  timm validation script imports as ``imagenetc_alexnet_error_rates_list``) averages to the same
  numbers within 1e-9. Both are keyed by name: some copies pair a reordered corruption list with
  ``ALEXNET_ERR`` by position, which silently mixes up the normalisers.
* ImageNet-A's and ImageNet-R's classes are timm's ``timm/data/_info/imagenet_{a,r}_{indices,synsets}.txt``;
  they agree with ``thousand_k_to_200`` / ``imagenet_a_wnids`` in hendrycks/natural-adv-examples.
* ImageNet-O uses **its own** 200 classes, not ImageNet-A's (the two lists share 59 wnids): in
  hendrycks/natural-adv-examples ``eval_many_models.py`` the logits are masked with
  ``imagenet_o_mask`` (``IMAGENET_O_SYNSETS`` here), the in-distribution set is ImageNet-val
  restricted to the class folders of ``imagenet-o/``, the score is minus the max softmax
  probability over the 200 masked logits, and AUPR is sklearn's ``average_precision_score`` with
  ImageNet-O as the positive class. timm ships no ImageNet-O list, so it is stored here.

Label mapping for the variants: their folders hold 200 wnid sub-folders; torchvision's
``ImageFolder`` numbers them in sorted order, which is the order of ``variant_synsets(name)`` and
of ``variant_indices(name)`` (``check_class_folders`` checks that a folder holds the variant's wnids).
So the ImageFolder label ``i`` is the 1000-class index ``variant_indices(name)[i]``, and
``masked_logits(logits, indices)`` gives (B, 200) logits whose argmax is directly comparable with that label.
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import math
import os
from collections.abc import Mapping
from numbers import Real
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torchmetrics.functional.classification import binary_average_precision

from kpca.training.choices import check_choice
from kpca.training.errors import MissingPathError, OptionError
from kpca.training.images.corruptions import IMAGENET_C_CORRUPTIONS, IMAGENET_C_GROUPS, IMAGENET_C_SEVERITIES

logger = logging.getLogger(__name__)

ALEXNET_ERRORS: dict[str, float] = {
    "gaussian_noise": 0.886428,
    "shot_noise": 0.894468,
    "impulse_noise": 0.922640,
    "defocus_blur": 0.819880,
    "glass_blur": 0.826268,
    "motion_blur": 0.785948,
    "zoom_blur": 0.798360,
    "snow": 0.866816,
    "frost": 0.826572,
    "fog": 0.819324,
    "brightness": 0.564592,
    "contrast": 0.853204,
    "elastic_transform": 0.646056,
    "pixelate": 0.717840,
    "jpeg_compression": 0.606500,
}
ALEXNET_ERRORS_BY_SEVERITY: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.69528, 0.82542, 0.93554, 0.98138, 0.99452),
    "shot_noise": (0.71224, 0.85108, 0.93574, 0.98182, 0.99146),
    "impulse_noise": (0.78374, 0.89808, 0.9487, 0.9872, 0.99548),
    "defocus_blur": (0.65624, 0.73202, 0.85036, 0.91364, 0.94714),
    "glass_blur": (0.64308, 0.75054, 0.88806, 0.91622, 0.93344),
    "motion_blur": (0.5843, 0.70048, 0.82108, 0.8975, 0.92638),
    "zoom_blur": (0.70008, 0.76992, 0.80784, 0.84198, 0.87198),
    "snow": (0.71726, 0.88392, 0.86468, 0.9187, 0.94952),
    "frost": (0.6139, 0.79734, 0.8879, 0.89942, 0.9343),
    "fog": (0.67474, 0.7605, 0.84378, 0.8726, 0.945),
    "brightness": (0.4514, 0.48502, 0.54048, 0.62166, 0.7244),
    "contrast": (0.64548, 0.7615, 0.88874, 0.9776, 0.9927),
    "elastic_transform": (0.52596, 0.70116, 0.55686, 0.64076, 0.80554),
    "pixelate": (0.52218, 0.5462, 0.73728, 0.87092, 0.91262),
    "jpeg_compression": (0.51002, 0.54718, 0.57294, 0.65458, 0.74778),
}

VariantName = Literal["imagenet_a", "imagenet_r", "imagenet_o"]
"""The ImageNet variants, test sets of 200 classes each (ImageNet-A, -R and -O), named as their ``data.eval`` options
and log prefixes."""

# The 200 ImageNet-O class wnids, sorted (hendrycks/natural-adv-examples eval_many_models.py, imagenet_o_wnids).
_IMAGENET_O_WNIDS = """
n01443537 n01704323 n01770081 n01784675 n01819313 n01820546 n01910747 n01917289 n01968897 n02074367 n02317335
n02319095 n02395406 n02454379 n02606052 n02655020 n02666196 n02672831 n02730930 n02777292 n02783161 n02786058
n02787622 n02791270 n02808304 n02817516 n02841315 n02865351 n02877765 n02892767 n02906734 n02910353 n02916936
n02948072 n02965783 n03000134 n03000684 n03017168 n03026506 n03032252 n03075370 n03109150 n03126707 n03134739
n03160309 n03196217 n03207743 n03218198 n03223299 n03240683 n03271574 n03291819 n03297495 n03314780 n03325584
n03344393 n03347037 n03372029 n03376595 n03388043 n03388183 n03400231 n03445777 n03457902 n03467068 n03482405
n03483316 n03494278 n03530642 n03544143 n03584829 n03590841 n03598930 n03602883 n03649909 n03661043 n03666591
n03676483 n03692522 n03706229 n03717622 n03720891 n03721384 n03724870 n03729826 n03733131 n03733281 n03742115
n03786901 n03788365 n03794056 n03804744 n03814639 n03814906 n03825788 n03840681 n03843555 n03854065 n03857828
n03868863 n03874293 n03884397 n03891251 n03908714 n03920288 n03929660 n03930313 n03937543 n03942813 n03944341
n03961711 n03970156 n03982430 n03991062 n03995372 n03998194 n04005630 n04023962 n04033901 n04040759 n04067472
n04074963 n04116512 n04118776 n04125021 n04127249 n04131690 n04141975 n04153751 n04154565 n04201297 n04204347
n04209133 n04209239 n04228054 n04235860 n04243546 n04252077 n04254120 n04258138 n04265275 n04270147 n04275548
n04330267 n04332243 n04336792 n04347754 n04371430 n04371774 n04372370 n04376876 n04409515 n04417672 n04418357
n04423845 n04429376 n04435653 n04442312 n04482393 n04501370 n04507155 n04525305 n04542943 n04554684 n04557648
n04562935 n04579432 n04591157 n04597913 n04599235 n06785654 n06874185 n07615774 n07693725 n07695742 n07697537
n07711569 n07714990 n07715103 n07716358 n07717410 n07718472 n07720875 n07742313 n07745940 n07747607 n07749582
n07753275 n07753592 n07754684 n07768694 n07836838 n07871810 n07873807 n07880968 n09229709 n09472597 n12144580
n12267677 n13052670
"""
IMAGENET_O_SYNSETS: tuple[str, ...] = tuple(_IMAGENET_O_WNIDS.split())

_GROUP_OF = {c: group for group, members in IMAGENET_C_GROUPS.items() for c in members}
EXTRA_GROUP = "extra"
"""The ``group`` of a corruption outside the 15 benchmark ones (speckle_noise, gaussian_blur, spatter, saturate)."""


def corruption_errors(errors: Mapping[tuple[str, int], float]) -> dict[str, object]:
    """Summarise top-1 errors on corrupted data: per-corruption means, Corruption Errors and mCE.

    For corruption ``c`` with all five severities, ``CE_c = sum_s E(c, s) / sum_s E_AlexNet(c, s)``,
    which equals ``mean_s E(c, s) / ALEXNET_ERRORS[c]`` because ``ALEXNET_ERRORS`` are means over
    severities 1-5; ``mCE`` is the mean of ``CE_c`` over the 15 standard corruptions. A corruption
    that is not one of the 15 (e.g. the extra ``speckle_noise``) or misses a severity gets
    ``ce=None``, and when any of the 15 is missing or incomplete ``mCE`` is NaN with
    ``mce_comparable=False`` and a ``note`` saying why, because such a number is not comparable with
    published mCEs. The mean corruption error/accuracy average the per-corruption mean errors with
    equal weight over the standard corruptions passed in, never the extras (as the benchmark's and
    the RPC authors' means over 15); they are NaN when only extras were evaluated. Extras keep their
    own entries, with group ``"extra"``.

    Args:
        errors: top-1 error in [0, 1] for each evaluated ``(corruption, severity)``, severity in 1..5.

    Returns:
        ``{"corruptions": {c: {"group", "severities", "error", "ce"}}, "mean_error", "mean_accuracy",
        "mCE", "mce_comparable", "note"}``; ``corruptions`` follows the standard order, then extras
        sorted by name; ``group`` is ``noise``/``blur``/``weather``/``digital``, or ``extra`` for a
        corruption outside the 15.
    """
    by_corruption = _group_errors(errors)
    corruptions: dict[str, dict[str, object]] = {}
    order = [c for c in IMAGENET_C_CORRUPTIONS if c in by_corruption] + sorted(
        c for c in by_corruption if c not in ALEXNET_ERRORS
    )
    for name in order:
        per_severity = by_corruption[name]
        error = sum(per_severity.values()) / len(per_severity)
        complete = name in ALEXNET_ERRORS and set(per_severity) == set(IMAGENET_C_SEVERITIES)
        corruptions[name] = {
            "group": _GROUP_OF.get(name, EXTRA_GROUP),
            "severities": tuple(sorted(per_severity)),
            "error": error,
            "ce": error / ALEXNET_ERRORS[name] if complete else None,
        }
    missing = [c for c in IMAGENET_C_CORRUPTIONS if c not in corruptions]
    partial = [c for c in IMAGENET_C_CORRUPTIONS if c in corruptions and corruptions[c]["ce"] is None]
    comparable = not missing and not partial
    note = ""
    if not comparable:
        note = "mCE not comparable (needs the 15 standard corruptions at severities 1-5): " + "; ".join(
            part for part in (_listed("missing", missing), _listed("incomplete severities", partial)) if part
        )
    mce = sum(corruptions[c]["ce"] for c in IMAGENET_C_CORRUPTIONS) / 15 if comparable else math.nan
    standard = [corruptions[c]["error"] for c in IMAGENET_C_CORRUPTIONS if c in corruptions]
    mean_error = sum(standard) / len(standard) if standard else math.nan
    return {
        "corruptions": corruptions,
        "mean_error": mean_error,
        "mean_accuracy": 1.0 - mean_error,
        "mCE": mce,
        "mce_comparable": comparable,
        "note": note,
    }


def corruption_rows(summary: Mapping[str, object]) -> list[dict[str, object]]:
    """Turn a ``corruption_errors`` result into report rows (one per corruption, then a ``mean`` row).

    Args:
        summary: the dict returned by ``corruption_errors``.

    Returns:
        Rows with keys ``corruption``, ``group`` (``extra`` for a corruption outside the 15),
        ``error``, ``accuracy``, ``ce`` (``None`` where undefined); the last row, ``mean``, holds
        the mean error and accuracy over the standard corruptions evaluated, extras left out (``None``
        if only extras were), and the mCE (``None`` if not comparable).
    """
    rows: list[dict[str, object]] = []
    for name, entry in summary["corruptions"].items():
        rows.append(
            {
                "corruption": name,
                "group": entry["group"],
                "error": entry["error"],
                "accuracy": 1.0 - entry["error"],
                "ce": entry["ce"],
            }
        )
    standard_evaluated = not math.isnan(summary["mean_error"])
    rows.append(
        {
            "corruption": "mean",
            "group": None,
            "error": summary["mean_error"] if standard_evaluated else None,
            "accuracy": summary["mean_accuracy"] if standard_evaluated else None,
            "ce": summary["mCE"] if summary["mce_comparable"] else None,
        }
    )
    return rows


def variant_synsets(name: VariantName) -> tuple[str, ...]:
    """Return the 200 sorted wnids of ImageNet-A, ImageNet-R or ImageNet-O (the order of their class folders).

    Args:
        name: ``imagenet_a``, ``imagenet_r`` or ``imagenet_o``.

    Returns:
        200 wnids such as ``"n01498041"``, sorted, i.e. in ``ImageFolder`` label order.
    """
    _check_variant(name)
    if name == "imagenet_o":
        return IMAGENET_O_SYNSETS
    return _timm_info(f"{name}_synsets.txt")


def variant_indices(name: VariantName) -> torch.Tensor:
    """Return the ImageNet-1K class indices of a variant's 200 classes, in its label order.

    Args:
        name: ``imagenet_a``, ``imagenet_r`` or ``imagenet_o``.

    Returns:
        (200,) int64 tensor, increasing; entry ``i`` is the 1000-class index of ``variant_synsets(name)[i]``.
    """
    _check_variant(name)
    return torch.tensor(_variant_indices(name), dtype=torch.long)


def check_class_folders(root: str | os.PathLike[str], name: VariantName) -> tuple[str, ...]:
    """The class folders of an ImageNet-A, -R or -O root, checked to be the variant's wnids.

    ImageFolder labels the images by the position of their folder in the sorted folder names; the datamodule maps
    the same names to logit columns, so labels stay right for any of the variant's wnids (all 200 on the released
    sets). A folder that is not one of them means the root belongs to another set (ImageNet-R given as
    ImageNet-A, say), which would otherwise be evaluated silently under the wrong name.

    Args:
        root: dataset folder (``imagenet-a/``, ``imagenet-r/`` or ``imagenet-o/``), ``<root>/<wnid>/<image>``.
        name: ``imagenet_a``, ``imagenet_r`` or ``imagenet_o``.

    Returns:
        The folder names, sorted: ImageFolder's label order (``variant_synsets(name)`` on the released sets).

    Raises:
        FileNotFoundError: If ``root`` is not a folder.
        ValueError: If ``root`` has no class folders, or folders that are not the variant's wnids.
    """
    expected = variant_synsets(name)
    path = Path(root)
    layout = f"{path}/<wnid>/<image> with {name}'s wnids (e.g. {expected[0]})"
    if not path.is_dir():
        raise MissingPathError(f"{name} root {str(path)!r} is not a folder; expected {layout}")
    found = tuple(sorted(entry.name for entry in os.scandir(path) if entry.is_dir()))
    if not found:
        raise OptionError(f"{name} root {str(path)!r} has no class folders; expected {layout}")
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        raise OptionError(
            f"{str(path)!r} holds {len(unexpected)} class folders that are not {name} wnids (e.g. {unexpected[:3]}); "
            f"point data.eval.{name} at the extracted {name.replace('_', '-')} folder"
        )
    return found


def masked_logits(logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Restrict 1000-class logits to some classes (a variant's), so that argmax is a position among them.

    Args:
        logits: (B, K) logits over the full label space.
        indices: (M,) int64 class indices, e.g. ``variant_indices("imagenet_a")``.

    Returns:
        (B, M) logits; column ``i`` is ``logits[:, indices[i]]``.
    """
    _check_logits(logits)
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1 or indices.dtype != torch.long:
        raise TypeError(f"indices must be a 1-D int64 tensor such as variant_indices('imagenet_a'), got {indices!r}")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= logits.shape[1]):
        raise OptionError(f"indices must lie in [0, {logits.shape[1]}) (the logits' classes), got {indices.tolist()}")
    return logits.index_select(1, indices.to(logits.device))  # (B, M)


def anomaly_score(logits: torch.Tensor) -> torch.Tensor:
    """Maximum-softmax-probability anomaly score (Hendrycks & Gimpel 2017): higher means more anomalous.

    For ImageNet-O pass the 200-class ``masked_logits``: the softmax is taken over those columns only,
    as in hendrycks/natural-adv-examples.

    Args:
        logits: (B, K) logits (any float dtype; computed in float32).

    Returns:
        (B,) float32 scores ``-max_k softmax(logits)_k`` in [-1, -1/K].
    """
    _check_logits(logits)
    return -F.softmax(logits.float(), dim=1).amax(dim=1)


def ood_aupr(scores_in: torch.Tensor, scores_out: torch.Tensor) -> float:
    """Area under the precision-recall curve for OOD detection, with the OOD examples as the positive class.

    Computed with torchmetrics' ``binary_average_precision`` (no thresholds binning), which equals
    sklearn's ``average_precision_score``. Scores are replaced by their dense ranks scaled to [0, 1]
    first: the AP depends only on the order, and torchmetrics would otherwise pass scores outside
    [0, 1] through a sigmoid, which saturates in float32 and would create ties.

    Args:
        scores_in: (N_in,) anomaly scores of in-distribution examples (e.g. ``anomaly_score``).
        scores_out: (N_out,) anomaly scores of OOD examples.

    Returns:
        AUPR in [0, 1].
    """
    for arg, scores in (("scores_in", scores_in), ("scores_out", scores_out)):
        if not isinstance(scores, torch.Tensor) or scores.dim() != 1 or scores.numel() == 0:
            raise OptionError(f"{arg} must be a non-empty 1-D tensor of scores, got {scores!r}")
        if not bool(torch.isfinite(scores).all()):
            raise OptionError(f"{arg} contains NaN or inf; compute scores from finite logits")
    scores = torch.cat([scores_out.double().cpu(), scores_in.double().cpu()])  # (N_out + N_in,)
    target = torch.cat([torch.ones(scores_out.numel()), torch.zeros(scores_in.numel())]).long()
    _, ranks = torch.unique(scores, return_inverse=True)
    preds = ranks.double() / max(1, int(ranks.max()))
    return float(binary_average_precision(preds, target))


def _group_errors(errors: Mapping[tuple[str, int], float]) -> dict[str, dict[int, float]]:
    """Validate ``{(corruption, severity): error}`` and regroup it as ``{corruption: {severity: error}}``."""
    if not isinstance(errors, Mapping) or not errors:
        raise OptionError("errors must be a non-empty mapping {(corruption, severity): top-1 error}")
    grouped: dict[str, dict[int, float]] = {}
    for key, error in errors.items():
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str)):
            raise TypeError(f"errors keys must be (corruption, severity) tuples, got {key!r}")
        corruption, severity = key
        if isinstance(severity, bool) or severity not in IMAGENET_C_SEVERITIES:
            raise OptionError(f"severity must be an integer in 1..5, got {severity!r} for {corruption!r}")
        if isinstance(error, bool) or not isinstance(error, Real) or not 0.0 <= error <= 1.0:
            raise OptionError(f"error for {key!r} must be a top-1 error in [0, 1] (not a percentage), got {error!r}")
        grouped.setdefault(corruption, {})[int(severity)] = float(error)
    return grouped


def _listed(label: str, names: list[str]) -> str:
    return f"{label}: {', '.join(names)}" if names else ""


def _check_variant(name: object) -> None:
    check_choice("variant", name, VariantName, "choose one of the 200-class ImageNet test sets")


def _check_logits(logits: object) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        got = f"{tuple(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a floating-point tensor of shape (B, K), got {got}")


@functools.cache
def _timm_info(filename: str) -> tuple[str, ...]:
    """Whitespace-separated entries of one of timm's ``timm/data/_info`` files."""
    return tuple((importlib.resources.files("timm.data") / "_info" / filename).read_text(encoding="utf-8").split())


@functools.cache
def _variant_indices(name: str) -> tuple[int, ...]:
    synsets_1k = _timm_info("imagenet_synsets.txt")
    synsets = variant_synsets(name)
    if name == "imagenet_o":
        position = {wnid: i for i, wnid in enumerate(synsets_1k)}
        indices = tuple(position[wnid] for wnid in synsets)
    else:
        indices = tuple(int(i) for i in _timm_info(f"{name}_indices.txt"))
    # The label-order contract: 200 classes, increasing indices, matching wnids.
    assert len(indices) == 200 and list(indices) == sorted(indices), name
    assert tuple(synsets_1k[i] for i in indices) == synsets, name
    return indices
