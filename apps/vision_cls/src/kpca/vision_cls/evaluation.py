"""RobustnessEvaluator: the test stage's metrics over every evaluation set, plus adversarial attacks.

The test dataloaders are the datamodule's ``eval_sets`` in order (clean first); each batch is routed
to the metric its set needs. Metrics are torchmetrics objects, so DDP ranks are reduced on compute,
image counts included (summed over ranks). The report (``robustness.csv``, ``metric,value[,n]`` rows) is
declared for ``kpca-report`` by :data:`ROBUSTNESS_REPORT`, registered as the ``vision_cls`` report task, with the
protocol rules of its column groups (:func:`robustness_protocols`, docs/protocols.md); ``test`` records the run's
protocol next to the report (``protocol.json`` and a "Protocol" section).
Legend: B batch, K classes (1000 for ImageNet), M classes of a variant (200: ImageNet-A, -R, -O).
"""

from __future__ import annotations

import csv
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from torch import nn
from torchmetrics import CatMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from kpca.training.choices import choices
from kpca.training.errors import OptionError
from kpca.training.eval_subset import EVAL_SUBSET
from kpca.training.results.protocol import WHOLE_TEST_SET, ProtocolRule, Setting, config_entry, record_protocol
from kpca.training.results.schema import ReportSchema
from kpca.training.results.tables import markdown_table, write_report
from kpca.vision_cls.attacks import AttackSpec, predicted_labels, run_attack
from kpca.vision_cls.eval_data import EvalSet
from kpca.vision_cls.robustness import (
    VariantName,
    anomaly_score,
    corruption_errors,
    corruption_rows,
    masked_logits,
    ood_aupr,
    variant_indices,
)

logger = logging.getLogger(__name__)

_VARIANT_OF = {
    "imagenet_a": "imagenet_a",
    "imagenet_r": "imagenet_r",
    "imagenet_o": "imagenet_o",
    "imagenet_o_in": "imagenet_o",
}


def read_robustness_report(path: Path) -> dict[str, float]:
    """A ``metric,value`` report (``robustness.csv``) as ``metric -> value``, skipping empty values."""
    with path.open(newline="") as stream:
        return {row["metric"]: float(row["value"]) for row in csv.DictReader(stream) if row["value"] != ""}


FP16_AUTOCAST_CLASSIFICATION = Setting(
    "trainer.precision", "16-mixed", name="precision", default="32-true",
    matches=lambda value: str(value) in ("16-mixed", "16", "32-true", "32"),
    published_text="16-mixed or 32-true",
)  # fmt: skip
"""The authors classify clean, ImageNet-C and adversarial images under fp16 autocast (KPCA Robust/engine.py:115,
Attack/engine.py:110-112); fp32 (the one-command published evaluation of docs/protocols.md) counts as the same, bf16
does not."""

FP32_CLASSIFICATION = Setting(
    "trainer.precision", "32-true", name="precision", default="32-true",
    matches=lambda value: str(value) in ("32-true", "32"),
)  # fmt: skip
"""The authors classify ImageNet-A, -R and -O in fp32 (KPCA eval_OOD.py:205-212)."""

EVAL_TRANSFORM = (
    Setting("data.crop_pct", 0.875),
    Setting("data.interpolation", "bicubic"),
    EVAL_SUBSET,
    *WHOLE_TEST_SET,
)
"""The authors' evaluation images: Resize(image_size / 0.875, bicubic) + CenterCrop, every image of each set."""

ON_THE_FLY_CORRUPTIONS = (
    "imagecorruptions applied on the fly after a bicubic resize, without the JPEG q85 step, a proxy (published: the "
    "released ImageNet-C files, data.eval.imagenet_c)"
)
"""Why ``corrupted/*`` is never the published protocol (docs/protocols.md, "On-the-fly corruptions")."""

PUBLISHED_ATTACK_STEPS = {"pgd": 20, "spsa": 10}
"""The authors' iterations (KPCA Attack/engine.py:96, 104); FGSM takes one step."""


ELLIPTICAL_ATTACKED_AS_TRAINED = (
    "Elliptical attacked as it trains: the mean estimator, no gradient through its scale m (the authors' attack "
    "scripts use a median over tokens, Elliptical-Attention ImageAttack/models.py 205-206, and also hold m constant)"
)
"""Which Elliptical the attacks see (docs/protocols.md, "The robust family"): a difference from the Elliptical paper's
attacks that no setting removes, in every attack group of a model with ``attention.kind: elliptical``."""


def attacked_model_differences(config: Mapping) -> tuple[str, ...]:
    """The fixed differences of every attack group that the attacked model's attention brings (a saved config)."""
    kind = config_entry(config, "model.net.attention.kind")
    return (ELLIPTICAL_ATTACKED_AS_TRAINED,) if kind == "elliptical" else ()


def attack_protocol(index: int, attack: Mapping, fixed: tuple[str, ...] = ()) -> ProtocolRule:
    """The protocol rule of the ``index``-th attack of ``model.evaluator.attacks`` (a saved config's entry).

    Its group is ``attack/<tag>`` (the attack's result name); the authors attack the normalised tensor with their
    model's clean prediction as label, on every image, with cleverhans' SPSA gradient (attacks/published.yaml).
    ``fixed``: differences no setting removes (:func:`attacked_model_differences`).
    """
    spec = AttackSpec(**attack)
    key = f"model.evaluator.attacks.{index}"
    settings = [
        Setting(f"{key}.space", "reference", name="space", default="pixel"),
        Setting(f"{key}.labels", "predicted", name="labels", default="ground_truth"),
    ]
    if spec.name in PUBLISHED_ATTACK_STEPS:
        settings.append(Setting(f"{key}.steps", PUBLISHED_ATTACK_STEPS[spec.name], name="steps", default=20))
    if spec.name == "spsa":
        settings.append(Setting(f"{key}.spsa_gradient", "cleverhans", name="spsa_gradient", default="iterate"))
    settings.append(Setting("model.evaluator.attack_batches", None, published_text="null (every batch)"))
    return ProtocolRule(
        f"attack/{spec.tag}",
        rf"attack/{re.escape(spec.tag)}/eps[^/]+/acc1",
        (*settings, *EVAL_TRANSFORM, FP16_AUTOCAST_CLASSIFICATION),
        fixed=fixed,
    )


def robustness_protocols(config: Mapping) -> tuple[ProtocolRule, ...]:
    """The protocol rules of each column group of ``robustness.csv`` for a run's saved config (docs/protocols.md).

    Groups: ``clean``, ``imagenet_c`` (published only when all 15 x 5 sets ran: ``imagenet_c/mCE`` is reported),
    ``corrupted`` (never published: a proxy of ImageNet-C), ``imagenet_a`` / ``_r`` / ``_o`` (fp32) and one
    ``attack/<tag>`` per configured attack (an Elliptical model's with :data:`ELLIPTICAL_ATTACKED_AS_TRAINED`).
    """
    attacks = config_entry(config, "model.evaluator.attacks")
    return (
        ProtocolRule("clean", r"clean/acc[15]", (*EVAL_TRANSFORM, FP16_AUTOCAST_CLASSIFICATION)),
        ProtocolRule(
            "imagenet_c",
            r"imagenet_c/.+",
            (
                Setting("data.image_size", 224, published_text="224 (the released files are 224x224 crops)"),
                Setting("data.eval.severities", (1, 2, 3, 4, 5), old_key="data.severities"),
                EVAL_SUBSET,
                *WHOLE_TEST_SET,
                FP16_AUTOCAST_CLASSIFICATION,
            ),
            complete_when="imagenet_c/mCE",
            incomplete="not all 15 corruptions x 5 severities ran (no imagenet_c/mCE), the mean is over those found",
        ),
        ProtocolRule("corrupted", r"corrupted/.+", fixed=(ON_THE_FLY_CORRUPTIONS,)),
        *(
            ProtocolRule(kind, rf"{kind}/(acc1|aupr)", (*EVAL_TRANSFORM, FP32_CLASSIFICATION))
            for kind in choices(VariantName)
        ),
        *(
            attack_protocol(i, attack, attacked_model_differences(config))
            for i, attack in enumerate(attacks if isinstance(attacks, list) else [])
        ),
    )


ROBUSTNESS_REPORT = ReportSchema(
    stem="robustness",
    read=read_robustness_report,
    columns=(
        r"clean/acc1",
        r"clean/acc5",
        r"imagenet_c/mCE",
        r"imagenet_c/mean_acc1",
        r"corrupted/mean_acc1",
        r"imagenet_a/acc1",
        r"imagenet_r/acc1",
        r"imagenet_o/aupr",
        r"attack/[^/]+/eps[^/]+/acc1",
    ),
    name_setting="model.evaluator.report_name",
    protocols=robustness_protocols,
)
"""The ``vision_cls`` report task of ``kpca-report``: what :meth:`RobustnessEvaluator.write_report` writes."""


def eps_label(eps: float) -> str:
    """A radius as a metric-name fragment in 1/255 units: 2/255 -> ``eps2``, 0.5/255 -> ``eps0.5``."""
    return f"eps{round(eps * 255, 3):g}"


class RobustnessEvaluator:
    """Test-stage evaluation: clean top-1/top-5, corruptions (mCE), ImageNet-A/R/O and attacks.

    Attacks run on the clean set, by default on all of it (as the authors do: KPCA
    Attack/engine.py:87-119). Each attack's forward and backward passes run in float32 with
    autocast off; the adversarial images are then classified like the clean ones, under the
    trainer's precision (the authors likewise evaluate them under autocast, engine.py:110-112).
    Accuracy is measured against the true labels, whichever labels an attack raises the loss of.
    ``compute`` reports how many images were attacked (``attack/n_images``) and how many clean
    images were seen (``clean/n_images``), both summed over DDP ranks; the reports show them in
    an ``n`` column.

    Args:
        attacks: attacks run on the clean set, each at its radii.
        attack_batches: attack only the first ``attack_batches`` clean batches of each rank, a
            subset (the val folders are sorted by class, so it is a class-biased one); None (the
            default) attacks every clean batch.
        report_name: file stem of the Markdown / CSV reports written into the run's log dir (default
            ``ROBUSTNESS_REPORT.stem``; ``kpca-report`` follows a run's config when it names another).
    """

    def __init__(
        self,
        attacks: list[AttackSpec] | None = None,
        attack_batches: int | None = None,
        report_name: str = ROBUSTNESS_REPORT.stem,
    ) -> None:
        if attack_batches is not None and attack_batches < 1:
            raise OptionError(f"attack_batches must be >= 1 or None (all batches), got {attack_batches}")
        self.attacks = list(attacks or [])
        tags = [a.tag for a in self.attacks]
        repeated = sorted({tag for tag in tags if tags.count(tag) > 1})
        if repeated:
            raise OptionError(
                f"attacks {repeated} appear more than once (same name, space, labels and SPSA gradient); "
                "list every radius of one attack in a single entry's eps"
            )
        self.attack_batches = attack_batches
        self.report_name = report_name
        self.eval_sets: list[EvalSet] = []

    def start(
        self,
        eval_sets: Sequence[EvalSet],
        num_classes: int,
        device: torch.device,
        class_indices: Mapping[str, Sequence[int] | None] | None = None,
    ) -> None:
        """Create fresh metrics for ``eval_sets`` (the test dataloaders, in order) on ``device``.

        Args:
            eval_sets: the evaluation sets, in the order of the test dataloaders.
            num_classes: K, the classifier's number of classes.
            device: where the metrics live.
            class_indices: per set name, the logit columns its labels refer to (the datamodule's
                ``class_indices``); None uses the standard 200-class lists in ImageNet-1K order.
        """
        self.eval_sets = list(eval_sets)
        self.num_classes = num_classes
        self.device = device
        self._columns = {
            s.name: torch.as_tensor(
                class_indices[s.name] if class_indices is not None else variant_indices(_VARIANT_OF[s.kind]),
                dtype=torch.long,
                device=device,
            )
            for s in self.eval_sets
            if s.kind in _VARIANT_OF
        }
        # micro: the fraction of correct images, as published (torchmetrics defaults to a macro class mean).
        self.accuracy: dict[str, MulticlassAccuracy] = {}
        for s in self.eval_sets:
            if s.kind in ("imagenet_o", "imagenet_o_in"):
                continue
            classes = len(self._columns[s.name]) if s.name in self._columns else num_classes
            self.accuracy[s.name] = MulticlassAccuracy(classes, top_k=1, average="micro").to(device)
        self.top5 = MulticlassAccuracy(num_classes, top_k=min(5, num_classes), average="micro").to(device)
        self.ood_scores = {"in": CatMetric().to(device), "out": CatMetric().to(device)}
        self.clean_images = SumMetric().to(device)
        self.attacked_images = SumMetric().to(device)
        self.attack_accuracy = {
            (a.tag, eps): MulticlassAccuracy(num_classes, top_k=1, average="micro").to(device)
            for a in self.attacks
            for eps in a.eps
        }

    def step(self, net: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], dataloader_idx: int, batch_idx: int):
        """Update the metrics of set ``dataloader_idx`` with one (B, 3, H, W) batch and its (B,) labels."""
        images, labels = batch
        eval_set = self.eval_sets[dataloader_idx]
        logits = net(images)  # (B, K)
        if eval_set.kind in ("imagenet_a", "imagenet_r"):
            self.accuracy[eval_set.name](masked_logits(logits, self._columns[eval_set.name]), labels)  # (B, M)
        elif eval_set.kind in ("imagenet_o", "imagenet_o_in"):
            scores = anomaly_score(masked_logits(logits, self._columns[eval_set.name]))  # (B,)
            self.ood_scores["out" if eval_set.kind == "imagenet_o" else "in"].update(scores)
        else:
            self.accuracy[eval_set.name](logits, labels)
        if eval_set.kind == "clean":
            self.top5(logits, labels)
            self.clean_images.update(float(len(labels)))
            if self.attacks and (self.attack_batches is None or batch_idx < self.attack_batches):
                self.attacked_images.update(float(len(labels)))
                self._attack(net, images, labels)

    def _attack(self, net: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> None:
        """Attack a clean batch; Lightning's test loop runs in inference mode, so leave it here.

        ``reference``-space attacks normalise with the network's own ``mean`` / ``std`` buffers.
        The predicted labels come from one float32 forward pass per batch, shared by the attacks
        that use them. The adversarial images are classified under the caller's autocast, like
        the clean ones, and scored against the true labels.
        """
        stats = {"mean": net.mean.flatten(), "std": net.std.flatten()}
        with torch.inference_mode(False), torch.enable_grad():
            images, labels = images.clone(), labels.clone()
            predicted = None
            if any(a.labels == "predicted" for a in self.attacks):
                predicted = predicted_labels(net, images)  # (B,)
            for attack in self.attacks:
                targets = predicted if attack.labels == "predicted" else labels
                for eps in attack.eps:
                    adversarial = run_attack(attack.name, eps, net, images, targets, **attack.attack_kwargs(), **stats)
                    with torch.no_grad():
                        self.attack_accuracy[attack.tag, eps](net(adversarial), labels)

    def compute(self) -> dict[str, float]:
        """All results as flat ``<evaluation>/<setting>/<metric>`` names (accuracies in [0, 1]).

        Image counts are ``clean/n_images`` and, when attacks ran, ``attack/n_images``, summed over ranks.
        """
        results: dict[str, float] = {}
        errors: dict[str, dict[tuple[str, int], float]] = {"corrupted": {}, "imagenet_c": {}}
        for s in self.eval_sets:
            if s.name not in self.accuracy:
                continue
            acc = float(self.accuracy[s.name].compute())
            if s.kind in errors:
                errors[s.kind][s.corruption, s.severity] = 1.0 - acc
                results[f"{s.kind}/{s.corruption}/s{s.severity}/acc1"] = acc
            else:
                results[f"{s.kind}/acc1"] = acc
        results["clean/acc5"] = float(self.top5.compute())
        results["clean/n_images"] = float(self.clean_images.compute())
        for kind, per_set in errors.items():
            if per_set:
                summary = corruption_errors(per_set)
                results[f"{kind}/mean_acc1"] = summary["mean_accuracy"]
                if summary["mce_comparable"]:
                    results[f"{kind}/mCE"] = summary["mCE"]
                else:
                    _log_once(f"{kind}: {summary['note']}")
        if any(s.kind == "imagenet_o" for s in self.eval_sets):
            scores_in, scores_out = (self.ood_scores[k].compute().flatten() for k in ("in", "out"))
            results["imagenet_o/aupr"] = ood_aupr(scores_in, scores_out)
        if self.attacks:
            results["attack/n_images"] = float(self.attacked_images.compute())
            for (tag, eps), metric in self.attack_accuracy.items():
                results[f"attack/{tag}/{eps_label(eps)}/acc1"] = float(metric.compute())
            if self.attack_batches is not None:
                _log_attacked_subset(self.attack_batches, results["attack/n_images"], results["clean/n_images"])
        return results

    def write_report(self, results: dict[str, float], out_dir: str | Path) -> list[Path]:
        """Write the results (and the per-corruption table, when corruptions ran) as Markdown and CSV.

        Clean and attack rows carry their image count in an ``n`` column (``clean/n_images`` and
        ``attack/n_images``, which are not rows of their own). The run's protocol, from the ``config.yaml`` in
        ``out_dir``, goes into ``protocol.json`` and a "Protocol" section of the Markdown (the CSV is unchanged).
        """
        counts = {kind: results.get(f"{kind}/n_images") for kind in ("clean", "attack")}
        rows = []
        for name, value in results.items():
            if name.endswith("/n_images") or math.isnan(value):
                continue
            row: dict[str, object] = {"metric": name, "value": value}
            count = counts.get(name.partition("/")[0])
            if count is not None:
                row["n"] = int(count)
            rows.append(row)
        section = record_protocol(ROBUSTNESS_REPORT.protocols, out_dir, [row["metric"] for row in rows])
        paths = list(write_report(rows, out_dir, self.report_name, show=True, markdown=markdown_table(rows) + section))
        for kind in ("corrupted", "imagenet_c"):
            per_set = {
                (s.corruption, s.severity): 1.0 - results[f"{kind}/{s.corruption}/s{s.severity}/acc1"]
                for s in self.eval_sets
                if s.kind == kind
            }
            if per_set:
                paths += write_report(
                    corruption_rows(corruption_errors(per_set)), out_dir, f"{self.report_name}_{kind}"
                )
        logger.info("robustness report: %s", ", ".join(str(p) for p in paths))
        return paths


@rank_zero_only
def _log_once(text: str) -> None:
    """One INFO line, from rank 0 only."""
    logger.info("%s", text)


@rank_zero_only
def _log_attacked_subset(attack_batches: int, attacked: float, clean: float) -> None:
    """One INFO line saying that the attack results cover a subset of the clean set."""
    logger.info(
        "attack_batches=%d: the attacks ran on the first %d clean batches of each rank only, %d of %d clean "
        "images (the attack rows' n); set model.evaluator.attack_batches: null to attack them all",
        attack_batches,
        attack_batches,
        int(attacked),
        int(clean),
    )
