"""kpca-report's parts on hand-made run folders: linking evaluations to training runs, each task's report."""

import csv
from pathlib import Path

import pytest
import yaml

from kpca.training.compare import TASKS, collect_runs, compare, group_runs, model_label


def _run(folder: Path, config: dict, *, checkpoint: bool = False, report: tuple[str, list[dict]] | None = None):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    if checkpoint:
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
    if report is not None:
        name, rows = report
        with (folder / name).open("w", newline="") as stream:
            writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def _config(kind: str, seed: int, ckpt_path: str | None = None, lr: float = 0.1) -> dict:
    attention = {"kind": kind, "n_iter": 2, "lambd": 4.0, "layers": "all"}
    return {
        "seed_everything": seed, "ckpt_path": ckpt_path,
        "model": {"net": {"init_args": {"attention": attention}}, "optimizer": {"init_args": {"lr": lr}}},
        "trainer": {"logger": {"init_args": {"version": seed}}},
    }  # fmt: skip


def _perplexity(valid: float, test: float) -> tuple[str, list[dict]]:
    rows = [{"set": "valid", "ppl_word": valid, "ppl_token": 1.0}, {"set": "test", "ppl_word": test, "ppl_token": 1.0}]
    return "perplexity.csv", rows


def test_language_model_runs_link_by_relative_checkpoint_paths_and_average_over_seeds(tmp_path: Path):
    for seed, (valid, test) in {1: (30.0, 31.0), 2: (34.0, 35.0)}.items():
        _run(tmp_path / "runs" / "rpc" / f"version_{seed}", _config("rpc", seed), checkpoint=True)
        ckpt = f"runs/rpc/version_{seed}/checkpoints/last.ckpt"  # as typed, relative to another folder
        _run(tmp_path / "runs" / "rpc" / f"test_{seed}", _config("rpc", seed, ckpt), report=_perplexity(valid, test))
    _run(tmp_path / "runs" / "softmax" / "version_0", _config("softmax", 1), checkpoint=True)  # never tested
    runs = collect_runs(tmp_path / "runs", TASKS["language_model"])
    models, incomplete = group_runs(runs)
    assert [(m.label, [r.seed for r in m.runs]) for m in models] == [("rpc n_iter=2 lambd=4.0", [1, 2])]
    assert [r.folder.name for r in models[0].runs] == ["version_1", "version_2"]  # the training folders
    assert [r.folder.parent.name for r in incomplete] == ["softmax"]
    compare(tmp_path / "runs", "language_model", tmp_path / "out")
    with (tmp_path / "out" / "comparison.csv").open() as stream:
        row = next(csv.DictReader(stream))
    assert float(row["valid/ppl"]) == 32.0 and float(row["test/ppl"]) == 33.0
    assert float(row["valid/ppl_std"]) == pytest.approx(2.8284271247, rel=1e-9)
    assert (
        "| rpc n_iter=2 lambd=4.0 | 1 2 | 32.0000 ± 2.8284 | 33.0000 ± 2.8284 |"
        in (tmp_path / "out" / "comparison.md").read_text()
    )


def test_other_settings_make_another_model_and_the_newest_evaluation_wins(tmp_path: Path):
    _run(tmp_path / "a" / "version_0", _config("rpc", 1, lr=0.1), checkpoint=True)
    _run(tmp_path / "b" / "version_0", _config("rpc", 1, lr=0.5), checkpoint=True)
    for name, folder, ppl in (("old", "a", 50.0), ("new", "a", 40.0), ("other", "b", 45.0)):
        ckpt = str(tmp_path / folder / "version_0" / "checkpoints" / "last.ckpt")
        _run(tmp_path / name, _config("rpc", 1, ckpt), report=_perplexity(ppl, ppl))
    models, incomplete = group_runs(collect_runs(tmp_path, TASKS["language_model"]))
    assert not incomplete and len(models) == 2
    assert sorted(m.label for m in models) == ["rpc n_iter=2 lambd=4.0 (a)", "rpc n_iter=2 lambd=4.0 (b)"]
    by_folder = {m.runs[0].folder.parent.name: m.runs[0].metrics["valid/ppl"] for m in models}
    assert by_folder == {"a": 40.0, "b": 45.0}


def test_segmentation_reports_give_clean_and_corrupted_means(tmp_path: Path):
    rows = [
        {"set": "clean", "severity": "", "sets": 1, "mIoU": 40.0, "mAcc": 50.0, "aAcc": 70.0},
        {"set": "fog", "severity": 1, "sets": 1, "mIoU": 30.0, "mAcc": 40.0, "aAcc": 60.0},
        {"set": "all corruptions", "severity": "mean", "sets": 1, "mIoU": 30.0, "mAcc": 40.0, "aAcc": 60.0},
    ]
    _run(tmp_path / "seg", _config("symmetric", 0), report=("segmentation.csv", rows))
    (model,), _ = group_runs(collect_runs(tmp_path, TASKS["segmentation"]))
    assert model.runs[0].metrics == {
        "clean/mIoU": 40.0, "clean/mAcc": 50.0, "clean/aAcc": 70.0,
        "corrupted/mIoU": 30.0, "corrupted/mAcc": 40.0, "corrupted/aAcc": 60.0,
    }  # fmt: skip


def test_labels_and_errors():
    assert model_label({"kind": "rpc", "n_iter": 4, "lambd": 4.0, "layers": [0]}) == "rpc n_iter=4 lambd=4.0 layers=[0]"
    assert model_label({"kind": "softmax", "layers": "all"}) == "softmax"
    with pytest.raises(ValueError, match="--task must be one of"):
        compare(".", "nope")


def test_a_folder_without_runs_is_an_error(tmp_path: Path):
    with pytest.raises(ValueError, match="no run under"):
        compare(tmp_path, "vision_cls")
