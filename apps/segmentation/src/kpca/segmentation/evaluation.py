"""Clean and corrupted ADE20K evaluation: metrics per corruption and severity, their means, and the reports.

Reports (Markdown and CSV, written atomically with ``kpca.training.results.tables.write_report``) in the log dir:

* ``segmentation.{md,csv}``: one row per evaluation set (clean, then each corruption at each severity), one mean
  row per corruption over its severities, and the mean over all corrupted sets; aAcc, mAcc and mIoU in %, and
  ``sets``, the number of evaluation sets a row averages. The means are over exactly the chosen sets
  (``ADE20KDataModule.eval_sets``: the corruption preset, or the corruptions and severities given).
* ``per_class_clean.{md,csv}``: IoU and accuracy of each of the 150 classes on the clean set (empty where a class
  is absent from both predictions and labels, as mmseg's NaN).

:data:`SEGMENTATION_REPORT` declares ``segmentation.csv`` for ``kpca-report`` (the ``segmentation`` report task), with
the protocol rules of its clean and corrupted columns (:data:`SEGMENTATION_PROTOCOLS`, docs/protocols.md); ``test``
records the run's protocol next to the report (``protocol.json`` and a "Protocol" section of ``segmentation.md``).
The rules read the ``data.eval`` group, and a config saved before the group at the flat keys it replaced
(``data.eval_subset``, ``data.corruption_preset``, ``data.corruptions``, ``data.severities``).
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from kpca.segmentation.corruption_sets import ELLIPTICAL_SET
from kpca.training.errors import OptionError
from kpca.training.eval_subset import EVAL_SUBSET
from kpca.training.results.protocol import WHOLE_TEST_SET, ProtocolRule, Setting, record_protocol
from kpca.training.results.schema import ReportSchema
from kpca.training.results.tables import markdown_table, write_report

METRICS = ("aAcc", "mAcc", "mIoU")
EvalSets = Sequence[tuple[str, str | None, int | None]]


def read_segmentation_report(path: Path) -> dict[str, float]:
    """``segmentation.csv``: the clean set's and the corrupted mean's metrics (in %), as ``clean/mIoU``, ..."""
    names = {"clean": "clean", "all corruptions": "corrupted"}
    metrics = {}
    with path.open(newline="") as stream:
        for row in csv.DictReader(stream):
            if row["set"] in names:
                prefix = names[row["set"]]
                metrics |= {f"{prefix}/{m}": float(row[m]) for m in ("mIoU", "mAcc", "aAcc") if row.get(m)}
    return metrics


SLIDING_WINDOW_PROTOCOL = (
    Setting("model.window", 512),
    Setting("model.stride", 512),
    Setting("data.scale", (2048, 512), name="test_scale"),
    EVAL_SUBSET,
    *WHOLE_TEST_SET,
)
"""The authors' test inference (SEGM config.yml:123-131, model/utils.py:92-178): 512 windows with stride 512."""

KEEP_RATIO_RESIZE = (
    "test images resized keep-ratio within data.scale as mmseg does (published: short side brought to 512 as "
    "Segmenter does; at (2048, 512) the two differ only for images more than 4 times wider than high)"
)
"""The clean-evaluation difference no setting removes (docs/protocols.md, "Seg: crop / window / stride")."""

ON_THE_FLY_CORRUPTIONS = (
    "corruptions applied on the fly to the RGB image, not saved as JPEG, by imagecorruptions-imaug (published: made "
    "offline from the BGR image, saved as JPEG quality 95, by upstream imagecorruptions)"
)
"""The ADE20K-C differences no setting removes (docs/protocols.md, "ADE20K-C: how the corrupted images are made")."""


SEGMENTATION_PROTOCOLS = (
    ProtocolRule("clean", r"clean/(mIoU|mAcc|aAcc)", SLIDING_WINDOW_PROTOCOL, fixed=(KEEP_RATIO_RESIZE,)),
    ProtocolRule(
        "corrupted",
        r"corrupted/(mIoU|mAcc|aAcc)",
        (
            *SLIDING_WINDOW_PROTOCOL,
            Setting("data.eval.corruption_preset", "elliptical", old_key="data.corruption_preset"),
            Setting(
                "data.eval.corruptions",
                None,
                published_text="null (the elliptical preset's 19)",
                matches=lambda value: value is None or sorted(value) == sorted(ELLIPTICAL_SET.corruptions),
                old_key="data.corruptions",
            ),
            Setting(
                "data.eval.severities",
                None,
                published_text="null (the elliptical preset's 1-3)",
                matches=lambda value: value is None or sorted(value) == sorted(ELLIPTICAL_SET.severities),
                old_key="data.severities",
            ),
        ),
        fixed=(KEEP_RATIO_RESIZE, ON_THE_FLY_CORRUPTIONS),
    ),
)
"""The protocol rules of ``segmentation.csv``'s column groups. Neither is ever ``published``: docs/protocols.md lists
differences that no setting removes; the corrupted group's settings match the group's ADE20K-C harness with
``data.eval.corruption_preset: elliptical``."""

SEGMENTATION_REPORT = ReportSchema(
    stem="segmentation",
    read=read_segmentation_report,
    columns=(r"clean/mIoU", r"clean/mAcc", r"clean/aAcc", r"corrupted/mIoU", r"corrupted/mAcc", r"corrupted/aAcc"),
    protocols=SEGMENTATION_PROTOCOLS,
)
"""The ``segmentation`` report task of ``kpca-report``: the summary :func:`write_reports` writes."""


def corruption_results(per_set: Mapping[str, Mapping[str, object]], eval_sets: EvalSets) -> dict[str, float]:
    """Flat ``{key: fraction}`` for logging, for each of aAcc, mAcc and mIoU.

    Keys: ``clean/mIoU``, ``corrupted/fog/s3/mIoU``, ``corrupted/fog/mIoU`` (mean over severities) and
    ``corrupted/mean_mIoU`` (mean over all corrupted sets of ``eval_sets``, and only those).

    Args:
        per_set: ``SegmentationMetrics.compute()`` of each evaluation set, by name (other names are ignored).
        eval_sets: ``(name, corruption, severity)`` of each set (``ADE20KDataModule.eval_sets``).

    Raises:
        ValueError: If a set of ``eval_sets`` has no metrics in ``per_set``.
    """
    missing = [name for name, _, _ in eval_sets if name not in per_set]
    if missing:
        raise OptionError(f"no metrics for the evaluation set(s) {missing}; per_set has {sorted(per_set)}")
    results: dict[str, float] = {}
    by_corruption: dict[str, list[str]] = {}
    for name, corruption, _ in eval_sets:
        prefix = "clean" if corruption is None else f"corrupted/{name}"
        results.update({f"{prefix}/{m}": float(per_set[name][m]) for m in METRICS})
        if corruption is not None:
            by_corruption.setdefault(corruption, []).append(name)
    for corruption, names in by_corruption.items():
        for m in METRICS:
            results[f"corrupted/{corruption}/{m}"] = _mean(float(per_set[n][m]) for n in names)
    corrupted = [n for names in by_corruption.values() for n in names]
    if corrupted:
        for m in METRICS:
            results[f"corrupted/mean_{m}"] = _mean(float(per_set[n][m]) for n in corrupted)
    return results


def summary_rows(per_set: Mapping[str, Mapping[str, object]], eval_sets: EvalSets) -> list[dict[str, object]]:
    """Rows of ``segmentation.md``: per set, per-corruption means and the corrupted mean, metrics in %."""
    results = corruption_results(per_set, eval_sets)
    rows = []
    for name, corruption, severity in eval_sets:
        prefix = "clean" if corruption is None else f"corrupted/{name}"
        rows.append(_row("clean" if corruption is None else corruption, severity or "", 1, results, f"{prefix}/"))
    counts = Counter(c for _, c, _ in eval_sets if c is not None)  # corruption -> number of severities
    for corruption, count in counts.items():
        rows.append(_row(corruption, "mean", count, results, f"corrupted/{corruption}/"))
    if counts:
        rows.append(_row("all corruptions", "mean", counts.total(), results, "corrupted/mean_"))
    return rows


def per_class_rows(metrics: Mapping[str, object], classes: Sequence[str]) -> list[dict[str, object]]:
    """Rows of ``per_class_clean.md``: class index, name, IoU and Acc in % (None where undefined)."""
    iou, acc = (torch.as_tensor(metrics[k]).tolist() for k in ("IoU", "Acc"))
    return [
        {"class": i, "name": name.strip(), "IoU": _percent(iou[i]), "Acc": _percent(acc[i])}
        for i, name in enumerate(classes)
    ]


def write_reports(
    per_set: Mapping[str, Mapping[str, object]], eval_sets: EvalSets, classes: Sequence[str], out_dir: str | Path
) -> list[Path]:
    """Write ``segmentation.{md,csv}`` (:data:`SEGMENTATION_REPORT`) and ``per_class_clean.{md,csv}`` into ``out_dir``.

    The run's protocol, from the ``config.yaml`` in ``out_dir``, goes into ``protocol.json`` and a "Protocol" section
    of ``segmentation.md``.

    Returns:
        The four report paths.
    """
    rows = summary_rows(per_set, eval_sets)
    groups = {"clean" if corruption is None else "corrupted" for _, corruption, _ in eval_sets}
    section = record_protocol(
        SEGMENTATION_REPORT.protocols, out_dir, [f"{group}/{m}" for group in groups for m in METRICS]
    )
    markdown = markdown_table(rows) + section
    paths = list(write_report(rows, out_dir, SEGMENTATION_REPORT.stem, show=True, markdown=markdown))
    if "clean" in per_set:
        paths += write_report(per_class_rows(per_set["clean"], classes), out_dir, "per_class_clean")
    return paths


def _row(name: str, severity: object, sets: int, results: Mapping[str, float], prefix: str) -> dict[str, object]:
    return {"set": name, "severity": severity, "sets": sets} | {m: 100 * results[f"{prefix}{m}"] for m in METRICS}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def _percent(value: float) -> float | None:
    return None if math.isnan(value) else 100 * value
