"""Robustness metrics on hand-made numbers (CPU, no downloads): mCE, the 200-class variants, OOD AUPR, report files."""

import csv
import math
from pathlib import Path

import pytest
import torch
from sklearn.metrics import average_precision_score

from kpca.vision_cls.data import ImageNetDataModule
from kpca.vision_cls.eval_data import EvalData
from kpca.vision_cls.evaluation import RobustnessEvaluator
from kpca.vision_cls.robustness import (
    ALEXNET_ERRORS,
    ALEXNET_ERRORS_BY_SEVERITY,
    IMAGENET_C_CORRUPTIONS,
    IMAGENET_C_GROUPS,
    IMAGENET_O_SYNSETS,
    anomaly_score,
    check_class_folders,
    corruption_errors,
    corruption_rows,
    masked_logits,
    ood_aupr,
    variant_indices,
    variant_synsets,
)
from tests.vision_cls.test_data import FAST, WNIDS, make_tree


def scaled_alexnet(factor: float) -> dict[tuple[str, int], float]:
    """Errors equal to ``factor`` times AlexNet's at every corruption and severity."""
    return {
        (c, s): factor * e for c, errors in ALEXNET_ERRORS_BY_SEVERITY.items() for s, e in enumerate(errors, start=1)
    }


def test_corruption_tables_are_consistent():
    assert len(IMAGENET_C_CORRUPTIONS) == 15
    assert [c for group in IMAGENET_C_GROUPS.values() for c in group] == list(IMAGENET_C_CORRUPTIONS)
    assert list(ALEXNET_ERRORS) == list(IMAGENET_C_CORRUPTIONS) == list(ALEXNET_ERRORS_BY_SEVERITY)
    for corruption, errors in ALEXNET_ERRORS_BY_SEVERITY.items():
        assert sum(errors) / 5 == pytest.approx(ALEXNET_ERRORS[corruption], abs=1e-9)
    assert ALEXNET_ERRORS["gaussian_noise"] == 0.886428 and ALEXNET_ERRORS["jpeg_compression"] == 0.6065


@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_mce_is_the_error_ratio_to_alexnet(factor):
    summary = corruption_errors(scaled_alexnet(factor))
    assert summary["mce_comparable"] and summary["note"] == ""
    assert summary["mCE"] == pytest.approx(factor)
    assert all(entry["ce"] == pytest.approx(factor) for entry in summary["corruptions"].values())
    mean_alexnet = sum(ALEXNET_ERRORS.values()) / 15
    assert summary["mean_error"] == pytest.approx(factor * mean_alexnet)
    assert summary["mean_accuracy"] == pytest.approx(1 - factor * mean_alexnet)
    assert summary["corruptions"]["fog"]["group"] == "weather"


def test_ce_uses_the_severity_mean_even_when_severities_differ():
    errors = {(c, s): ALEXNET_ERRORS[c] for c in IMAGENET_C_CORRUPTIONS for s in range(1, 6)}
    errors |= {("snow", s): e for s, e in zip(range(1, 6), (0.2, 0.4, 0.6, 0.8, 1.0), strict=True)}
    summary = corruption_errors(errors)
    expected_snow = 0.6 / 0.866816
    assert summary["corruptions"]["snow"]["ce"] == pytest.approx(expected_snow)
    assert summary["mCE"] == pytest.approx((14 + expected_snow) / 15)


def test_partial_or_extra_corruptions_make_mce_not_comparable():
    errors = {("gaussian_noise", 1): 0.2, ("gaussian_noise", 3): 0.4, ("speckle_noise", 2): 0.5}
    summary = corruption_errors(errors)
    assert math.isnan(summary["mCE"]) and not summary["mce_comparable"]
    assert "incomplete severities: gaussian_noise" in summary["note"] and "missing: shot_noise" in summary["note"]
    assert list(summary["corruptions"]) == ["gaussian_noise", "speckle_noise"]
    noise = summary["corruptions"]["gaussian_noise"]
    assert noise["ce"] is None and noise["error"] == pytest.approx(0.3) and noise["severities"] == (1, 3)
    assert summary["corruptions"]["speckle_noise"]["group"] == "extra"
    assert summary["mean_accuracy"] == pytest.approx(1 - 0.3)  # the extra speckle_noise is not averaged in


def test_extra_corruptions_keep_mce_and_the_mean_over_the_standard_fifteen():
    extras = ("gaussian_blur", "saturate", "spatter", "speckle_noise")
    errors = scaled_alexnet(0.5) | {(c, s): 0.9 for c in extras for s in range(1, 6)}
    summary = corruption_errors(errors)
    assert summary["mCE"] == pytest.approx(0.5)
    assert summary["mean_error"] == pytest.approx(0.5 * sum(ALEXNET_ERRORS.values()) / 15)
    assert list(summary["corruptions"])[-4:] == list(extras)
    assert all(
        summary["corruptions"][c]["ce"] is None and summary["corruptions"][c]["group"] == "extra" for c in extras
    )


def test_only_extra_corruptions_give_no_mean():
    summary = corruption_errors({("speckle_noise", 1): 0.4})
    assert math.isnan(summary["mean_error"]) and math.isnan(summary["mean_accuracy"])
    rows = corruption_rows(summary)
    assert rows[0] == {"corruption": "speckle_noise", "group": "extra", "error": 0.4, "accuracy": 0.6, "ce": None}
    assert rows[-1] == {"corruption": "mean", "group": None, "error": None, "accuracy": None, "ce": None}


@pytest.mark.parametrize(
    ("errors", "error", "match"),
    [
        ({}, ValueError, "non-empty mapping"),
        ({("fog", 6): 0.3}, ValueError, "severity must be an integer in 1..5, got 6"),
        ({("fog", 1): 30.0}, ValueError, r"in \[0, 1\] \(not a percentage\), got 30.0"),
        ({"fog": 0.3}, TypeError, "keys must be .*'fog'"),
    ],
)
def test_corruption_errors_rejects_bad_input(errors, error, match):
    with pytest.raises(error, match=match):
        corruption_errors(errors)


def test_corruption_rows():
    rows = corruption_rows(corruption_errors(scaled_alexnet(0.5)))
    assert [row["corruption"] for row in rows] == [*IMAGENET_C_CORRUPTIONS, "mean"]
    assert rows[0] == {
        "corruption": "gaussian_noise",
        "group": "noise",
        "error": pytest.approx(0.443214),
        "accuracy": pytest.approx(0.556786),
        "ce": pytest.approx(0.5),
    }
    assert rows[-1]["ce"] == pytest.approx(0.5) and rows[-1]["group"] is None
    partial = corruption_rows(corruption_errors({("fog", 1): 0.5}))
    assert partial[-1]["ce"] is None


@pytest.mark.parametrize("name", ["imagenet_a", "imagenet_r", "imagenet_o"])
def test_variant_indices_match_synsets_in_label_order(name):
    indices = variant_indices(name)
    synsets = variant_synsets(name)
    assert indices.dtype == torch.long and indices.shape == (200,)
    assert torch.all(indices[1:] > indices[:-1]) and list(synsets) == sorted(synsets)
    assert len(set(synsets)) == 200


def test_known_variant_entries():
    assert variant_indices("imagenet_a")[:3].tolist() == [6, 11, 13]
    assert variant_synsets("imagenet_a")[0] == "n01498041"
    assert variant_indices("imagenet_o")[:3].tolist() == [1, 51, 70]
    assert IMAGENET_O_SYNSETS[0] == "n01443537" and IMAGENET_O_SYNSETS[-1] == "n13052670"
    # ImageNet-O has its own classes: it shares only 59 of its 200 wnids with ImageNet-A.
    assert len(set(IMAGENET_O_SYNSETS) & set(variant_synsets("imagenet_a"))) == 59


def test_check_class_folders(tmp_path):
    for wnid in variant_synsets("imagenet_r"):
        (tmp_path / wnid).mkdir()
    (tmp_path / "README.txt").write_text("files are not classes")
    assert check_class_folders(tmp_path, "imagenet_r") == variant_synsets("imagenet_r")
    with pytest.raises(ValueError, match=r"holds 114 class folders that are not imagenet_a wnids"):
        check_class_folders(tmp_path, "imagenet_a")  # ImageNet-R shares 86 of its 200 wnids with ImageNet-A
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        check_class_folders(tmp_path / "missing", "imagenet_r")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no class folders"):
        check_class_folders(tmp_path / "empty", "imagenet_r")
    partial = tmp_path / "partial"
    for wnid in variant_synsets("imagenet_r")[5:2:-1]:
        (partial / wnid).mkdir(parents=True)
    assert check_class_folders(partial, "imagenet_r") == variant_synsets("imagenet_r")[3:6]  # sorted: label order
    message = "variant='imagenet_c' is not one of 'imagenet_a', 'imagenet_r', 'imagenet_o'; choose one of the 200-class"
    with pytest.raises(ValueError, match=message):
        variant_indices("imagenet_c")
    with pytest.raises(ValueError, match=message):
        variant_synsets("imagenet_c")


def test_masked_logits_by_hand():
    logits = torch.arange(20.0).view(2, 10)  # (B, K)
    logits[1, 7] = 100.0
    out = masked_logits(logits, torch.tensor([3, 1, 7]))
    assert out.tolist() == [[3.0, 1.0, 7.0], [13.0, 11.0, 100.0]]
    assert out.argmax(1).tolist() == [2, 2]
    full = torch.zeros(4, 1000)
    indices = variant_indices("imagenet_a")
    full[torch.arange(4), indices[[0, 5, 199, 42]]] = 5.0
    assert masked_logits(full, indices).argmax(1).tolist() == [0, 5, 199, 42]
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\)"):
        masked_logits(logits, torch.tensor([10]))
    with pytest.raises(TypeError, match="indices must be a 1-D int64"):
        masked_logits(logits, torch.tensor([1.0]))
    with pytest.raises(TypeError, match=r"logits must be .*\(B, K\)"):
        masked_logits(logits[0], torch.tensor([1]))


def test_anomaly_score_by_hand():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [0.0, 0.0]])
    torch.testing.assert_close(anomaly_score(logits), torch.tensor([-0.5, -0.75, -0.5]))
    assert anomaly_score(logits.half()).dtype == torch.float32


def test_ood_aupr_by_hand_and_against_sklearn():
    assert ood_aupr(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 0.9])) == pytest.approx(1.0)
    # Ranked: 0.9 (OOD), 0.6 (in), 0.4 (OOD), 0.1 (in): AP = 1/2 * 1 + 1/2 * 2/3.
    assert ood_aupr(torch.tensor([0.6, 0.1]), torch.tensor([0.9, 0.4])) == pytest.approx(5 / 6, abs=1e-6)
    # Scores far outside [0, 1] would saturate a sigmoid in float32; ranks keep the order.
    assert ood_aupr(torch.tensor([55.0]), torch.tensor([60.0, 50.0])) == pytest.approx(5 / 6, abs=1e-6)
    gen = torch.Generator().manual_seed(0)
    scores_in = torch.randint(0, 6, (40,), generator=gen).float() / 5  # many ties
    scores_out = torch.randint(2, 8, (25,), generator=gen).float() / 5
    labels = [1] * 25 + [0] * 40
    expected = average_precision_score(labels, torch.cat([scores_out, scores_in]).numpy())
    assert ood_aupr(scores_in, scores_out) == pytest.approx(expected, abs=1e-6)


def test_ood_aupr_rejects_bad_scores():
    with pytest.raises(ValueError, match="scores_out must be a non-empty 1-D tensor"):
        ood_aupr(torch.tensor([0.1]), torch.tensor([]))
    with pytest.raises(ValueError, match="scores_in contains NaN"):
        ood_aupr(torch.tensor([math.nan]), torch.tensor([0.1]))


class ConstantClassifier(torch.nn.Module):
    """Predicts class 0 for every image, so a set's accuracy is its share of class-0 images."""

    num_classes = 3
    mean = torch.zeros(1, 3, 1, 1)
    std = torch.ones(1, 3, 1, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.tensor([1.0, 0.0, 0.0]).expand(images.shape[0], 3)  # (B, K)


def test_imagenet_c_folder_with_extras_averages_the_benchmark_corruptions_only(tmp_path: Path):
    root = tmp_path / "imagenet"
    for split in ("train", "val"):
        make_tree(root / split, WNIDS, per_class=1)
    make_tree(tmp_path / "c" / "fog" / "1", WNIDS, per_class=1)  # class 0 is 1 image of 3
    make_tree(tmp_path / "c" / "speckle_noise" / "1", WNIDS, per_class=1)
    make_tree(tmp_path / "c" / "speckle_noise" / "1", WNIDS[:1], per_class=3)  # class 0 is 3 images of 5
    dm = ImageNetDataModule(root=str(root), eval=EvalData(imagenet_c=str(tmp_path / "c"), severities=(1,)), **FAST)
    dm.setup("test")
    evaluator = RobustnessEvaluator()
    evaluator.start(dm.eval_sets, 3, torch.device("cpu"))
    for index, loader in enumerate(dm.test_dataloader()):
        for batch_idx, batch in enumerate(loader):
            evaluator.step(ConstantClassifier(), batch, index, batch_idx)
    results = evaluator.compute()
    assert results["imagenet_c/fog/s1/acc1"] == pytest.approx(1 / 3)
    assert results["imagenet_c/speckle_noise/s1/acc1"] == pytest.approx(3 / 5)  # the extra keeps its own row
    assert results["imagenet_c/mean_acc1"] == pytest.approx(1 / 3)  # not (1/3 + 3/5) / 2
    evaluator.write_report(results, tmp_path / "report")
    with open(tmp_path / "report" / "robustness_imagenet_c.csv", newline="") as f:
        rows = {row["corruption"]: row for row in csv.DictReader(f)}
    assert list(rows) == ["fog", "speckle_noise", "mean"]
    assert (rows["fog"]["group"], rows["speckle_noise"]["group"]) == ("weather", "extra")
    assert float(rows["mean"]["accuracy"]) == pytest.approx(1 / 3)
