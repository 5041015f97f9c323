"""kpca-report's parts on hand-made run folders: linking evaluations to training runs, each task's report.

The report schemas come from the installed apps' ``kpca.reports`` entry points, as ``kpca-report`` finds them.
"""

import csv
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kpca.language_model.perplexity import PERPLEXITY_REPORT
from kpca.segmentation.evaluation import SEGMENTATION_REPORT
from kpca.training.results.collect import (
    collect_runs,
    group_runs,
    installed_tasks,
    model_label,
    report_schema,
    resolved_attention,
)
from kpca.training.results.compare import compare, main
from kpca.training.results.render import figure_description
from kpca.training.results.schema import ReportSchema
from kpca.vision_cls.evaluation import ROBUSTNESS_REPORT

APP_REPORTS = {
    "language_model": ("kpca.language_model.perplexity:PERPLEXITY_REPORT", PERPLEXITY_REPORT, "perplexity"),
    "segmentation": ("kpca.segmentation.evaluation:SEGMENTATION_REPORT", SEGMENTATION_REPORT, "segmentation"),
    "vision_cls": ("kpca.vision_cls.evaluation:ROBUSTNESS_REPORT", ROBUSTNESS_REPORT, "robustness"),
}


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


def _robustness(acc1: float, stem: str = "robustness") -> tuple[str, list[dict]]:
    return f"{stem}.csv", [{"metric": "clean/acc1", "value": acc1, "n": 8}]


def _renamed(config: dict, report_name: str) -> dict:
    """A vision test config whose evaluator writes its report as ``<report_name>.csv``, as LightningCLI saves it."""
    evaluator = "kpca.vision_cls.evaluation.RobustnessEvaluator"
    config["model"]["evaluator"] = {"class_path": evaluator, "init_args": {"report_name": report_name}}
    return config


def test_the_installed_apps_register_their_report_schemas():
    tasks = installed_tasks()  # the real importlib.metadata lookup of the kpca.reports entry points
    for task, (target, schema, stem) in APP_REPORTS.items():
        assert tasks[task] == target
        assert report_schema(task) is schema and schema.stem == stem


def test_language_model_runs_link_by_relative_checkpoint_paths_and_average_over_seeds(tmp_path: Path):
    for seed, (valid, test) in {1: (30.0, 31.0), 2: (34.0, 35.0)}.items():
        _run(tmp_path / "runs" / "rpc" / f"version_{seed}", _config("rpc", seed), checkpoint=True)
        ckpt = f"runs/rpc/version_{seed}/checkpoints/last.ckpt"  # as typed, relative to another folder
        _run(tmp_path / "runs" / "rpc" / f"test_{seed}", _config("rpc", seed, ckpt), report=_perplexity(valid, test))
    _run(tmp_path / "runs" / "softmax" / "version_0", _config("softmax", 1), checkpoint=True)  # never tested
    runs = collect_runs(tmp_path / "runs", report_schema("language_model"))
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


def test_a_plans_labels_and_order_name_the_models_in_the_table_and_the_figure(tmp_path: Path):
    folders = {}
    for kind, acc1 in (("symmetric", 0.5), ("rpc", 0.6)):
        for seed in (0, 1):
            folder = tmp_path / "runs" / kind / f"seed{seed}"
            _run(folder, _config(kind, seed), report=_robustness(acc1 + seed / 100))
            folders[folder] = {"symmetric": "SymViT", "rpc": "RPC-SymViT (2 PAP iterations)"}[kind]
    labels = dict(reversed(list(folders.items())))  # the plan lists RPC first here
    compare(tmp_path / "runs", "vision_cls", tmp_path / "out", labels=labels)
    with (tmp_path / "out" / "comparison.csv").open() as stream:
        models = [row["model"] for row in csv.DictReader(stream)]
    assert models == ["RPC-SymViT (2 PAP iterations)", "SymViT"]
    table = (tmp_path / "out" / "comparison.md").read_text()
    assert table.index("| RPC-SymViT (2 PAP iterations) |") < table.index("| SymViT |")
    compare(tmp_path / "runs", "vision_cls", tmp_path / "plain")  # without a plan: labelled by their settings
    with (tmp_path / "plain" / "comparison.csv").open() as stream:
        plain = sorted(row["model"] for row in csv.DictReader(stream))
    assert plain == ["rpc n_iter=2 lambd=4.0", "symmetric n_iter=2 lambd=4.0"]


def test_a_compiled_seed_is_a_seed_of_the_same_model(tmp_path: Path):
    for seed, compiled in ((1, False), (2, True)):
        config = _config("rpc", seed)
        config["model"]["compile"] = compiled
        _run(tmp_path / f"version_{seed}", config, report=_perplexity(30.0 + seed, 31.0))
    models, _ = group_runs(collect_runs(tmp_path, report_schema("language_model")))
    assert [[r.seed for r in m.runs] for m in models] == [[1, 2]]


def test_other_settings_make_another_model_and_the_newest_evaluation_wins(tmp_path: Path):
    _run(tmp_path / "a" / "version_0", _config("rpc", 1, lr=0.1), checkpoint=True)
    _run(tmp_path / "b" / "version_0", _config("rpc", 1, lr=0.5), checkpoint=True)
    for name, folder, lr, ppl in (("old", "a", 0.1, 50.0), ("new", "a", 0.1, 40.0), ("other", "b", 0.5, 45.0)):
        ckpt = str(tmp_path / folder / "version_0" / "checkpoints" / "last.ckpt")
        _run(tmp_path / name, _config("rpc", 1, ckpt, lr=lr), report=_perplexity(ppl, ppl))  # the same model options
    models, incomplete = group_runs(collect_runs(tmp_path, report_schema("language_model")))
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
    (model,), _ = group_runs(collect_runs(tmp_path, report_schema("segmentation")))
    assert model.runs[0].metrics == {
        "clean/mIoU": 40.0, "clean/mAcc": 50.0, "clean/aAcc": 70.0,
        "corrupted/mIoU": 30.0, "corrupted/mAcc": 40.0, "corrupted/aAcc": 60.0,
    }  # fmt: skip


def test_a_renamed_report_is_read_under_the_name_the_run_config_sets(tmp_path: Path):
    for seed, stem in ((1, "attacks_only"), (2, "foo")):
        _run(tmp_path / "fit" / f"version_{seed}", _config("rpc", seed), checkpoint=True)
        ckpt = str(tmp_path / "fit" / f"version_{seed}" / "checkpoints" / "last.ckpt")
        config = _renamed(_config("rpc", seed, ckpt), stem)
        _run(tmp_path / "test" / f"version_{seed}", config, report=_robustness(0.75, "attacks_only"))
    _run(tmp_path / "fit" / "version_3", _config("rpc", 3), checkpoint=True)  # saved configs name the default too
    ckpt = str(tmp_path / "fit" / "version_3" / "checkpoints" / "last.ckpt")
    _run(tmp_path / "test" / "version_3", _renamed(_config("rpc", 3, ckpt), "robustness"))
    (model,), (renamed, default) = group_runs(collect_runs(tmp_path, report_schema("vision_cls")))
    assert [run.seed for run in model.runs] == [1] and model.runs[0].metrics == {"clean/acc1": 0.75}
    assert renamed.seed == 2 and renamed.reason == (
        f"the evaluation folder {tmp_path / 'test' / 'version_2'} has config.yaml but no foo.csv, the report its "
        "config names (model.evaluator.report_name=foo)"
    )
    assert default.seed == 3 and default.reason.endswith("no robustness.csv (did its run stop before the end?)")


def test_runs_without_their_report_are_listed_with_the_reason(tmp_path: Path):
    runs = tmp_path / "runs"
    for name, seed in (("untested", 1), ("stopped", 2), ("broken", 3), ("done", 4)):
        _run(runs / name / "version_0", _config("rpc", seed), checkpoint=True)
    checkpoint = "runs/{}/version_0/checkpoints/last.ckpt"
    _run(runs / "stopped" / "version_1", _config("rpc", 2, checkpoint.format("stopped")))  # died before its report
    unreadable = ("perplexity.csv", [{"set": "valid", "ppl": 30.0}])  # no ppl_word column
    _run(runs / "broken" / "version_1", _config("rpc", 3, checkpoint.format("broken")), report=unreadable)
    _run(runs / "done" / "version_1", _config("rpc", 4, checkpoint.format("done")), report=_perplexity(30.0, 31.0))
    compare(runs, "language_model", tmp_path / "out")
    with (tmp_path / "out" / "comparison.csv").open() as stream:
        status = {row["seeds"]: row["status"] for row in csv.DictReader(stream)}
    assert status["4"] == "complete"
    assert status["1"].startswith(f"incomplete: {runs / 'untested' / 'version_0'}: no evaluation run found for its")
    assert status["2"] == (
        f"incomplete: {runs / 'stopped' / 'version_0'}: the evaluation folder {runs / 'stopped' / 'version_1'} "
        "has config.yaml but no perplexity.csv (did its run stop before the end?)"
    )
    assert status["3"] == (
        f"incomplete: {runs / 'broken' / 'version_0'}: {runs / 'broken' / 'version_1' / 'perplexity.csv'} "
        "is unreadable (KeyError: 'ppl_word')"
    )
    markdown = (tmp_path / "out" / "comparison.md").read_text()
    assert f"- `{runs / 'untested' / 'version_0'}` (seed 1): no evaluation run found for its checkpoints" in markdown
    assert f"- `{runs / 'stopped' / 'version_0'}` (seed 2): the evaluation folder" in markdown


def test_kpca_report_task_without_a_value_lists_the_installed_tasks(capsys: pytest.CaptureFixture[str]):
    main(["--task"])
    listing = capsys.readouterr().out
    for task, (target, _, _) in APP_REPORTS.items():
        assert re.search(rf"^  {task} +{re.escape(target)}$", listing, re.MULTILINE), listing


def test_kpca_report_names_the_installed_tasks_for_an_unknown_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), "--task", "nope"])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and error.startswith("error: --task must be one of") and error.count("\n") == 1
    assert "['language_model', 'segmentation', 'vision_cls'], got 'nope'" in error


def test_the_kpca_report_command_ends_a_user_error_with_one_error_line(tmp_path: Path):
    command = [str(Path(sys.executable).parent / "kpca-report"), str(tmp_path), "--task", "nope"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (2, "")
    assert (
        done.stderr.startswith("error: --task must be one of the installed report tasks ")
        and "got 'nope'" in done.stderr
    )
    assert done.stderr.count("\n") == 1  # no traceback, no usage


def test_kpca_report_names_the_files_it_writes_and_what_its_figure_shows(tmp_path: Path, caplog):
    runs = tmp_path / "runs"
    for seed in (1, 2):
        _run(runs / f"version_{seed}", _lm_config(seed, published=True), report=_perplexity(30.0 + seed, 31.0))
    with caplog.at_level(logging.INFO, logger="kpca.training.results.compare"):
        main([str(runs), "--task", "language_model"])
    assert (runs / "comparison.png").is_file()
    assert caplog.messages[-1] == (
        f"kpca-report: 1 models from 2 runs -> {runs / 'comparison.md'} and comparison.csv; figure "
        f"{runs / 'comparison.png'}: a panel per metric with each model's mean over its seeds and the std as error "
        "bars, its axis spanning the values"
    )
    attacks = figure_description(["clean/acc1", "attack/pgd/eps1", "attack/fgsm/eps1", "attack/fgsm/eps2"])
    assert attacks.endswith("spanning the values; accuracy against ε for each attack (fgsm, pgd)")
    assert figure_description(["attack/fgsm/eps1"]) == "accuracy against ε for each attack (fgsm)"


def test_kpca_report_help_is_plain_text_saying_what_it_does(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0 and "``" not in text and ":func:" not in text
    assert "Collect the evaluation reports of every run under ROOT into one side-by-side comparison." in text
    assert "installed tasks: language_model, segmentation, vision_cls" in text


def test_a_report_schema_refuses_a_path_as_stem_and_a_broken_pattern():
    with pytest.raises(ValueError, match="plain file stem like 'robustness', got 'runs/robustness'"):
        ReportSchema("runs/robustness", ROBUSTNESS_REPORT.read, ("clean/acc1",))
    with pytest.raises(ValueError, match=r"pattern 'clean/\(acc1' is not a regular expression"):
        ReportSchema("robustness", ROBUSTNESS_REPORT.read, ("clean/(acc1",))


def test_labels_and_errors():
    assert model_label({"kind": "rpc", "n_iter": 4, "lambd": 4.0, "layers": [0]}) == "rpc n_iter=4 lambd=4.0 layers=[0]"
    assert model_label({"kind": "softmax", "layers": "all"}) == "softmax"


def test_a_label_names_the_settings_left_null_by_the_kinds_default_for_the_apps_task():
    rpc = resolved_attention({"kind": "rpc", "n_iter": 2, "lambd": None, "layers": [0]})
    assert model_label(rpc) == "rpc n_iter=2 lambd=4.0 layers=[0]"
    neutreno = {"kind": "neutreno", "lambd": None, "layers": "all"}
    assert model_label(resolved_attention(neutreno)) == "neutreno lambd=0.6"  # images
    assert model_label(resolved_attention(neutreno, "language")) == "neutreno lambd=0.4"  # the language model
    saved = {"kind": "twicing", "n_iter": 4, "lambd": None, "convention": "reference", "layers": "all"}
    assert resolved_attention(saved) == {"kind": "twicing", "layers": "all", "backend": "auto"}  # an older config
    assert (
        model_label(resolved_attention({"kind": "rpc", "convention": "pcp"})) == "rpc n_iter=4 lambd=4.0 convention=pcp"
    )
    with pytest.raises(ValueError, match="--task must be one of"):
        compare(".", "nope")


def test_a_folder_without_runs_is_an_error(tmp_path: Path):
    with pytest.raises(ValueError, match="no run under"):
        compare(tmp_path, "vision_cls")
    with pytest.raises(FileNotFoundError, match=r"missing is not a folder: give the folder the runs were written to"):
        compare(tmp_path / "missing", "vision_cls")


def test_kpca_report_of_another_apps_runs_names_their_task_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    config = _config("rpc", 0)
    config["model"]["net"]["class_path"] = "kpca.language_model.model.CausalTransformerLM"
    _run(tmp_path / "lm" / "version_0", config, checkpoint=True)  # a language model's fit
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), "--task", "vision_cls"])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and error.count("\n") == 1
    assert error == (
        f"error: no vision_cls run under {tmp_path}: the runs there are language_model runs; "
        "pass --task language_model\n"
    )
    compare(tmp_path, "vision_cls")  # a plan's report before its evaluations: "No complete runs."
    assert "No complete runs." in (tmp_path / "comparison.md").read_text()


def _lm_config(seed: int, ckpt_path: str | None = None, *, published: bool) -> dict:
    """A language-model config with every setting of the perplexity protocol recorded: the authors' or ours."""
    config = _config("rpc", seed, ckpt_path)
    config["trainer"] |= {"limit_test_batches": None, "fast_dev_run": False}
    config["data"] = {
        "text_files": "tokens" if published else "raw", "context": 256, "eval_stride": 1 if published else None,
        "score_first_token": not published,
        "tokenizer": {"kind": "word" if published else "sentencepiece", "min_freq": 0},
        "word_swap": {"protocol": "textattack" if published else "uniform", "rate": 0.015, "replacement": "AAA"},
    }  # fmt: skip
    return config


def _read_csv(path: Path) -> list[dict]:
    with path.open() as stream:
        return list(csv.DictReader(stream))


OURS_CLEAN = (
    "ours: text_files=raw (published: tokens); tokenizer=sentencepiece (published: word); "
    "eval_stride=context / 2 (published: 1); score_first_token=true (published: false)"
)


def test_seeds_evaluated_under_other_protocols_are_other_rows_each_saying_its_protocol(tmp_path: Path):
    for seed, published in ((1, True), (2, False)):
        _run(tmp_path / "fit" / f"version_{seed}", _config("rpc", seed), checkpoint=True)
        ckpt = str(tmp_path / "fit" / f"version_{seed}" / "checkpoints" / "last.ckpt")
        config = _lm_config(seed, ckpt, published=published)
        _run(tmp_path / "test" / f"version_{seed}", config, report=_perplexity(30.0 * seed, 31.0 * seed))
    compare(tmp_path, "language_model", tmp_path / "out")
    rows = _read_csv(tmp_path / "out" / "comparison.csv")
    assert [(row["seeds"], row["runs"], row["valid/ppl"]) for row in rows] == [("1", "1", "30.0"), ("2", "1", "60.0")]
    assert [row["protocol:clean"] for row in rows] == ["published", OURS_CLEAN]
    markdown = (tmp_path / "out" / "comparison.md").read_text()
    label = "rpc n_iter=2 lambd=4.0"
    assert f"| {label} (test: test/version_1) | 1 | 30.0000 † | 31.0000 † |" in markdown
    assert f"| {label} (test: test/version_2) | 2 | 60.0000 | 62.0000 |" in markdown
    assert "† measured under the authors' published protocol of its column group" in markdown
    assert (
        f"- `clean`:\n  - {label} (test: test/version_1): published\n  - {label} (test: test/version_2): {OURS_CLEAN}\n"
    ) in markdown


def test_a_training_run_tested_with_other_settings_gives_a_row_per_setting(tmp_path: Path):
    _run(tmp_path / "fit" / "version_0", _config("rpc", 1), checkpoint=True)
    ckpt = str(tmp_path / "fit" / "version_0" / "checkpoints" / "last.ckpt")
    for name, ppl, window in (("a", 30.0, 256), ("b", 40.0, 128), ("c", 35.0, 128)):  # c retests b's settings
        config = _lm_config(1, ckpt, published=True)
        config["data"]["context"] = window
        _run(tmp_path / "test" / name, config, report=_perplexity(ppl, ppl))
    runs = collect_runs(tmp_path, report_schema("language_model"))
    assert [run.evaluation.name for run in runs] == ["a", "c"]  # the newest evaluation of the folder last
    models, _ = group_runs(runs)
    assert sorted((m.label, m.runs[0].metrics["valid/ppl"], len(m.runs)) for m in models) == [
        ("rpc n_iter=2 lambd=4.0 (test: test/a)", 30.0, 1),
        ("rpc n_iter=2 lambd=4.0 (test: test/c)", 35.0, 1),  # the newest evaluation with these settings
    ]
    assert [m.protocols["clean"].text for m in sorted(models, key=lambda m: m.label)] == [
        "published",
        "ours: window=128 (published: 256)",
    ]


def _references(path: Path, header: str, *lines: str) -> Path:
    path.write_text("\n".join((header, *lines)) + "\n")
    return path


def test_reference_rows_are_shown_apart_and_never_averaged_in(tmp_path: Path):
    for seed in (1, 2):
        _run(tmp_path / "runs" / f"version_{seed}", _lm_config(seed, published=True), report=_perplexity(30.0, 31.0))
    paper = _references(
        tmp_path / "paper.csv", "model,source,protocol,valid/ppl,test/ppl,test/ppl_std",
        "RPC (paper),Teo & Nguyen 2024 Table 3,published,32.5,33.5,0.1",
    )  # fmt: skip
    other = _references(tmp_path / "other.csv", "model,source,protocol,test/ppl", "softmax,https://x.org/t,ours,40")
    main([str(tmp_path / "runs"), "--task", "language_model", "--reference", str(paper), "--reference", str(other)])
    rows = _read_csv(tmp_path / "runs" / "comparison.csv")
    assert [row["status"] for row in rows] == [
        "complete", "reference (Teo & Nguyen 2024 Table 3)", "reference (https://x.org/t)",
    ]  # fmt: skip
    assert (rows[0]["valid/ppl"], rows[0]["runs"]) == ("30.0", "2")  # the references are not in the mean
    assert (rows[1]["test/ppl"], rows[1]["test/ppl_std"], rows[1]["protocol:clean"]) == ("33.5", "0.1", "published")
    assert (rows[2]["valid/ppl"], rows[2]["protocol:clean"]) == ("", "ours")
    markdown = (tmp_path / "runs" / "comparison.md").read_text()
    block = markdown.split("Reference (not measured here; never averaged with the rows above):\n\n")[1]
    assert block.splitlines()[0] == "| model | source | protocol | valid/ppl | test/ppl |"
    assert "| RPC (paper) | Teo & Nguyen 2024 Table 3 | published | 32.5000 | 33.5000 ± 0.1000 |" in block
    assert "| softmax | https://x.org/t | ours |  | 40.0000 |" in block


@pytest.mark.parametrize(
    ("header", "line", "error"),
    [
        ("model,source,protocol,valid/ppl,top1", "a,b,published,1,2",
         r"unknown metric column\(s\) \['top1'\]; the perplexity report's metric columns are valid/ppl, "
         r"valid_wordswap/ppl, test/ppl, test_wordswap/ppl"),
        ("model,protocol,valid/ppl", "a,published,1", "has no column source; a reference file has the columns"),
        ("model,source,protocol,valid/ppl", "a, ,published,1", "line 2: the source is empty"),
        ("model,source,protocol,valid/ppl", "a,b,published,n/a", r"line 2, column valid/ppl is 'n/a', not a number"),
        ("model,source,protocol,valid/ppl", "", "has a header but no rows"),
    ],
)  # fmt: skip
def test_a_reference_file_that_does_not_fit_the_report_is_refused_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], header: str, line: str, error: str
):
    _run(tmp_path / "runs" / "version_0", _lm_config(1, published=True), report=_perplexity(30.0, 31.0))
    references = _references(tmp_path / "refs.csv", header, *([line] if line else []))
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "runs"), "--task", "language_model", "--reference", str(references)])
    assert exit_info.value.code == 2 and re.search(error, capsys.readouterr().err)


def test_seeds_whose_tests_differ_only_in_the_report_name_are_one_row(tmp_path: Path):
    for seed, stem in ((1, "robustness"), (2, "renamed")):
        _run(tmp_path / "fit" / f"version_{seed}", _config("rpc", seed), checkpoint=True)
        ckpt = str(tmp_path / "fit" / f"version_{seed}" / "checkpoints" / "last.ckpt")
        config = _renamed(_config("rpc", seed, ckpt), stem)  # the name under init_args, as LightningCLI saves it
        _run(tmp_path / "test" / f"version_{seed}", config, report=_robustness(0.5 + seed / 10, stem))
    (model,), _ = group_runs(collect_runs(tmp_path, report_schema("vision_cls")))
    assert [run.metrics["clean/acc1"] for run in model.runs] == [0.6, 0.7]


def test_an_evaluation_with_other_model_options_is_labelled_by_what_ran_and_what_was_trained(tmp_path: Path):
    _run(tmp_path / "a" / "version_0", _config("rpc", 1), checkpoint=True)
    ckpt = str(tmp_path / "a" / "version_0" / "checkpoints" / "last.ckpt")
    for name, n_iter, ppl in (("as_trained", 2, 40.0), ("n_iter6", 6, 41.0)):
        config = _config("rpc", 1, ckpt)
        config["model"]["net"]["init_args"]["attention"]["n_iter"] = n_iter
        _run(tmp_path / name, config, report=_perplexity(ppl, ppl))
    # what the test run recorded (record_protocol): its n_iter differs from the checkpoint's training
    difference = {"option": "model.net.init_args.attention.n_iter", "trained": 2, "used": 6}
    checkpoint = {"checkpoint": {"path": ckpt, "differences": [difference]}}
    (tmp_path / "n_iter6" / "protocol.json").write_text(json.dumps(checkpoint))
    models, _ = group_runs(collect_runs(tmp_path, report_schema("language_model")))
    labels = {m.label: m.runs[0].metrics["valid/ppl"] for m in models}
    assert labels == {"rpc n_iter=2 lambd=4.0": 40.0, "rpc n_iter=6 lambd=4.0 (trained with n_iter=2)": 41.0}
