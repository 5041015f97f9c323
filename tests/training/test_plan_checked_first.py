"""``kpca-experiment run`` checks the whole plan before it spends anything, and says what it does not write.

A plan whose second run has a typo is refused as ``kpca-experiment validate`` refuses it, before any step runs: the
console script, as a user types it, ends with one ``error:`` line and exit status 2, and nothing is written under
the plan's folder (the SLURM executor's side is in test_experiment_slurm.py). Only the steps still to run are
parsed, so a finished plan reruns without parsing anything; a plan without ``report:`` says how to get a report.

The console script runs its own function in this process (tests/console_support.py): a refused plan starts no step,
so no app process, and the seconds of importing Lightning and torch are spared.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kpca.training.experiment import cli, local
from kpca.training.experiment.cli import main, validate_plan
from kpca.training.experiment.plan import load_plan
from kpca.training.experiment.steps import marker
from tests.cli_support import CONFIGS, CPU
from tests.console_support import Done, console

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
TYPO = "--model.net.init_args.attention.kind=rcp"
"""The second run's typo: ``rcp`` for ``rpc``."""


def write_plan(folder: Path, *, second_run: tuple[str, ...] = (TYPO,), report: bool = True) -> Path:
    """Two runs x two seeds of the smoke model, fit then test; ``second_run``: the second run's overrides."""
    plan = {
        "name": "typo",
        "app": "vision_cls",
        "out": "runs/typo",
        "seeds": [0, 1],
        "common": {"configs": [str(CPU), str(SMOKE)]},
        "runs": [
            {"name": "symmetric", "overrides": ["--model.net.init_args.attention.kind=symmetric"]},
            {"name": "rpc", "overrides": list(second_run)},
        ],
        "steps": [{"name": "fit"}, {"name": "test", "ckpt": "last"}],
    }
    if report:
        plan["report"] = {"title": "typo"}
    path = folder / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False), encoding="utf-8")
    return path


def kpca_experiment(capsys: pytest.CaptureFixture, *args: str, cwd: Path) -> Done:
    """``kpca-experiment ARGS`` as a user types it in ``cwd`` (offline hubs), run in this process; output captured."""
    return console(capsys, "kpca-experiment", cwd, *args)


def assert_refused_before_anything_ran(done: Done, out: Path) -> None:
    """Exit status 2, one ``error:`` line naming the second run, its step and the bad value; nothing under ``out``."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "run 'rpc', step 'fit': the vision_cls app refuses its arguments" in errors[0]
    assert "attention.kind" in done.stderr and "rcp" in done.stderr.split(errors[0])[1]
    assert not out.exists()  # no step ran: no run folder, no marker, no log, no fit output


def mark_done(path: Path) -> None:
    """Every step of every run of the plan at ``path`` done (its ``.done`` marker)."""
    for run in load_plan(path).runs:
        for step in ("fit", "test"):
            marker(run, step, "done").parent.mkdir(parents=True, exist_ok=True)
            marker(run, step, "done").write_text("{}")


@pytest.mark.slow
def test_run_refuses_a_plan_whose_second_run_has_a_typo_before_any_step_runs(tmp_path, capsys):
    path = write_plan(tmp_path)
    done = kpca_experiment(capsys, "run", str(path), cwd=tmp_path)
    assert_refused_before_anything_ran(done, tmp_path / "runs" / "typo")


def test_run_parses_each_step_still_to_run_once_for_the_first_seed_that_has_not_done_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_plan(tmp_path, second_run=())
    plan = load_plan(path)
    marker(plan.runs[0], "fit", "done").parent.mkdir(parents=True)
    marker(plan.runs[0], "fit", "done").write_text("{}")  # symmetric/seed0's fit is done
    parsed = []
    monkeypatch.setattr(cli, "_parse_error", lambda _main, _app, argv: parsed.append(argv) and None)
    assert validate_plan(plan, skip_done=True) == 4
    assert [(argv[0], next(a for a in argv if a.startswith("--seed_everything="))) for argv in parsed] == [
        ("fit", "--seed_everything=1"), ("test", "--seed_everything=0"),
        ("fit", "--seed_everything=0"), ("test", "--seed_everything=0"),
    ]  # fmt: skip
    assert all("--trainer.logger.init_args.save_dir=" + str(plan.out / "symmetric") in argv for argv in parsed[:2])


def test_a_finished_plan_reruns_without_parsing_a_step(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write_plan(tmp_path)  # the typo is in steps that are done: they will not run again
    mark_done(path)

    def refuse(*_args: object) -> str:
        raise AssertionError("a step of a finished plan was parsed")

    monkeypatch.setattr(cli, "_parse_error", refuse)
    monkeypatch.setattr(local, "_run_step", refuse)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(path)])
    assert exit_info.value.code == 0, capsys.readouterr().err
    assert "report: " in capsys.readouterr().err and (tmp_path / "runs" / "typo" / "report.md").is_file()


def test_a_plan_without_report_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write_plan(tmp_path, second_run=(), report=False)
    mark_done(path)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 0, err
    assert not (tmp_path / "runs" / "typo" / "report.md").exists()
    [line] = [line for line in err.splitlines() if line.startswith("no report: ")]
    assert line == (
        "no report: plan.yaml has no report section, so runs/typo/report.md is not written; add one (e.g. report: "
        "{task: vision_cls}) and run `kpca-experiment report plan.yaml`, or compare the runs with "
        "`kpca-report runs/typo --task vision_cls`"
    )


CLASHES = {  # a run's overrides -> what the refusal names
    "a setting its kind does not read": (
        ("--model.net.init_args.attention.kind=twicing", "--model.net.init_args.attention.lambd=0.5"),
        "lambd=0.5 (from the command line): lambd does not apply to kind 'twicing'",
    ),
    "a block past the network's depth": (
        ("--model.net.init_args.attention.layers=[5]",),
        "layers [5] out of range for a model with 2 blocks",
    ),
    "a bad lambd": (
        ("--model.net.init_args.attention.kind=neutreno", "--model.net.init_args.attention.lambd=-1"),
        "lambd must be a finite float >= 0",
    ),
}


@pytest.mark.parametrize("clash", list(CLASHES))
def test_validate_builds_each_runs_network_before_any_step(tmp_path, monkeypatch, clash):
    """What the run's model would refuse at build time is refused by validate, naming the run (no data read)."""
    monkeypatch.chdir(tmp_path)
    overrides, named = CLASHES[clash]
    with pytest.raises(cli.ValidationError) as refused:
        validate_plan(load_plan(write_plan(tmp_path, second_run=overrides)))
    assert "run 'rpc', step 'fit'" in str(refused.value) and named in str(refused.value)
    assert not (tmp_path / "runs").exists()


def test_run_refuses_a_kind_setting_clash_before_any_step_runs(tmp_path, capsys):
    """The console script, as typed: a plan whose second run switches to twicing and types lambd."""
    overrides, named = CLASHES["a setting its kind does not read"]
    done = kpca_experiment(capsys, "run", str(write_plan(tmp_path, second_run=overrides)), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "run 'rpc', step 'fit'" in done.stderr and named in done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_plan_switching_kinds_by_one_word_validates(tmp_path, monkeypatch):
    """The RPC smoke config's n_iter does not stop a run that types another kind alone."""
    monkeypatch.chdir(tmp_path)
    path = write_plan(tmp_path, second_run=("--model.net.init_args.attention.kind=elliptical",))
    assert validate_plan(load_plan(path)) == 4


@pytest.mark.parametrize(("app", "group"), [("segmentation", "decoder_attention"), ("language_model", "attention")])
def test_validate_builds_the_network_of_every_app(tmp_path, monkeypatch, app, group):
    """Segmenter's decoder and the LM's blocks are built too (on the meta device): a block past the depth is refused."""
    monkeypatch.chdir(tmp_path)
    plan = {
        "name": "far", "app": app, "out": "runs/far", "seeds": [0],
        "common": {"configs": [str(CPU), str(CONFIGS / app / "smoke.yaml")]},
        "runs": [{"name": "far", "overrides": [f"--model.net.init_args.{group}.layers=[5]"]}],
        "steps": [{"name": "fit"}],
    }  # fmt: skip
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan), encoding="utf-8")
    with pytest.raises(cli.ValidationError, match=r"(?s)run 'far', step 'fit'.*layers \[5\] out of range"):
        validate_plan(load_plan(path))
