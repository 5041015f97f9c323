"""Plan files: what a valid one becomes (runs, steps, the app arguments of each step) and what an invalid one says.

Every plan shipped in configs/experiments/ loads, and (slow) its steps' arguments parse in the app's own parser.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
import yaml

from kpca.training.experiment.cli import ValidationError, main, validate_plan
from kpca.training.experiment.plan import PlanError, exec_command, load_plan, step_argv, step_folder

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "configs" / "experiments"
SHIPPED = sorted(EXPERIMENTS.glob("*.yaml"))
CPU = REPO / "configs" / "trainer" / "cpu.yaml"
SMOKE = REPO / "configs" / "vision_cls" / "smoke.yaml"
PUBLISHED = REPO / "configs" / "vision_cls" / "attacks" / "published.yaml"


def plan_dict(**changes: object) -> dict:
    """A valid two-run plan on the smoke configs (absolute paths), with top-level keys replaced by ``changes``."""
    plan = {
        "name": "tiny",
        "app": "vision_cls",
        "out": "runs/tiny",
        "seeds": [0, 1],
        "common": {"configs": [str(CPU)], "overrides": ["--trainer.limit_train_batches=2"]},
        "runs": [
            {
                "name": "symmetric",
                "label": "SymViT",
                "configs": [str(SMOKE)],
                "overrides": ["--model.net.init_args.attention.kind=symmetric"],
            },
            {"name": "rpc", "configs": [str(SMOKE)]},
        ],  # fmt: skip
        "steps": [
            {"name": "fit"},
            {"name": "test", "ckpt": "last", "configs": [str(PUBLISHED)], "overrides": ["--data.eval.subset=8"]},
            {"name": "analyze", "overrides": ["--samples=4"]},
        ],
        "report": {"task": "vision_cls", "title": "tiny", "headlines": {"clean": ["clean/acc1"]}},
        "slurm": {"fit": {"nodes": 1, "time": "1:00:00"}},
    }
    plan.update(changes)
    return plan


def write_plan(folder: Path, plan: dict, name: str = "plan.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(plan), encoding="utf-8")
    return path


def test_plan_has_a_run_per_model_and_seed_run_major(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = load_plan(write_plan(tmp_path, plan_dict()), overrides=["--trainer.max_steps=2"])
    assert plan.path == (tmp_path / "plan.yaml").resolve() and plan.out == tmp_path / "runs" / "tiny"
    assert [run.id for run in plan.runs] == ["symmetric/seed0", "symmetric/seed1", "rpc/seed0", "rpc/seed1"]
    assert [run.label for run in plan.runs] == ["SymViT", "SymViT", "rpc", "rpc"]
    assert plan.runs[1].folder == tmp_path / "runs" / "tiny" / "symmetric" / "seed1"
    assert plan.runs[0].configs == (CPU, SMOKE)  # common first
    assert plan.runs[0].overrides == (
        "--trainer.limit_train_batches=2",
        "--model.net.init_args.attention.kind=symmetric",
    )
    assert [(step.name, step.ckpt) for step in plan.steps] == [("fit", None), ("test", "last"), ("analyze", "best")]
    assert plan.report.headlines == {"clean": ("clean/acc1",)} and plan.slurm == {
        "fit": {"nodes": 1, "time": "1:00:00"}
    }
    assert plan.overrides == ("--trainer.max_steps=2",)
    assert plan.run("rpc/seed1") is plan.runs[3] and plan.step("test") is plan.steps[1]
    assert step_folder(plan, plan.runs[1], "test") == plan.runs[1].folder / "test"


def test_step_argv_orders_configs_folders_seed_overrides_and_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = load_plan(write_plan(tmp_path, plan_dict()), overrides=["--trainer.max_steps=2"])
    run = plan.runs[1]  # symmetric, seed 1
    save_dir = f"--trainer.logger.init_args.save_dir={plan.out / 'symmetric'}"
    assert step_argv(plan, run, "fit", None) == [
        "fit", "-c", str(CPU), "-c", str(SMOKE), save_dir, "--trainer.logger.init_args.name=seed1",
        "--trainer.logger.init_args.version=fit", f"--trainer.default_root_dir={run.folder}", "--seed_everything=1",
        "--trainer.limit_train_batches=2", "--model.net.init_args.attention.kind=symmetric", "--trainer.max_steps=2",
        "--ckpt_path", "auto",
    ]  # fmt: skip
    checkpoint = run.folder / "fit" / "checkpoints" / "last.ckpt"
    test = step_argv(plan, run, "test", checkpoint)
    assert test[:7] == ["test", "-c", str(CPU), "-c", str(SMOKE), "-c", str(PUBLISHED)]
    assert "--trainer.logger.init_args.version=test" in test
    assert test[-3:] == ["--data.eval.subset=8", "--trainer.max_steps=2", f"--ckpt_path={checkpoint}"]
    analyze = step_argv(plan, run, "analyze", checkpoint)
    assert analyze[-3:] == ["--trainer.max_steps=2", f"--ckpt_path={checkpoint}", f"--out_dir={run.folder / 'analyze'}"]
    assert analyze.index("--samples=4") < analyze.index("--trainer.max_steps=2")  # step overrides, then the plan's


def test_exec_command_runs_one_step_through_the_experiment_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = load_plan(write_plan(tmp_path, plan_dict()), overrides=["--data.root=/data x"])
    command = exec_command(plan, plan.runs[2], "test", launcher=["srun", "--cpu-bind=none"])
    assert command == [
        sys.executable, "-m", "kpca.training.experiment", "exec", str(plan.path), "--run", "rpc/seed0",
        "--step", "test", "--override=--data.root=/data x", "--launcher", "srun --cpu-bind=none",
    ]  # fmt: skip
    assert shlex.split(command[-1]) == ["srun", "--cpu-bind=none"]
    assert exec_command(plan, plan.runs[0], "fit")[-3:] == ["--step", "fit", "--override=--data.root=/data x"]


@pytest.mark.parametrize(
    ("changes", "key", "says", "fix"),
    [
        ({"colour": "red"}, "the plan", "unknown key(s) colour", "allowed keys are"),
        ({"app": "speech"}, "app", "'speech' is not an app", "vision_cls, language_model, segmentation"),
        ({"name": "my plan"}, "name", "not a valid name", "letters, digits"),
        ({"seeds": []}, "seeds", "non-empty list", "seeds: [0, 1, 2]"),
        ({"seeds": [0, 0]}, "seeds", "repeats a seed", "each seed once"),
        ({"seeds": [0, True]}, "seeds", "True is not a non-negative integer", "seeds: [0, 1, 2]"),
        ({"runs": []}, "runs", "non-empty list of runs", "add at least one run"),
        ({"runs": [{"name": "a"}, {"name": "a"}]}, "runs[1].name", "used twice", "its own name"),
        ({"runs": [{"name": "a/b"}]}, "runs[0].name", "not a valid name", "letters, digits"),
        ({"runs": [{"name": "a", "config": []}]}, "runs[0]", "unknown key(s) config", "configs, overrides"),
        ({"runs": [{"name": "a", "configs": ["configs/nope.yaml"]}]}, "runs[0].configs[0]", "does not exist",
         "fix the path"),
        ({"runs": [{"name": "a", "overrides": ["trainer.max_epochs=1"]}]}, "runs[0].overrides[0]",
         "not a '--key=value' argument", "--trainer.max_epochs=3"),
        ({"steps": [{"name": "test"}, {"name": "fit"}]}, "steps[0].ckpt", "no fit step comes before",
         "add '- name: fit' as the first step"),
        ({"steps": [{"name": "test", "ckpt": "best"}]}, "steps[0].ckpt", "no fit step comes before",
         "set ckpt: null and pass --ckpt_path"),
        ({"steps": [{"name": "test", "ckpt": None}, {"name": "fit"}]}, "steps[1].name", "fit must be the first step",
         "move it to the top"),
        ({"steps": [{"name": "fit", "ckpt": "last"}]}, "steps[0].ckpt", "fit takes no ckpt", "remove the ckpt key"),
        ({"steps": [{"name": "fit"}, {"name": "test", "ckpt": "newest"}]}, "steps[1].ckpt",
         "'newest' is not a checkpoint", "best or last"),
        ({"steps": [{"name": "fit"}, {"name": "export"}]}, "steps[1].name", "'export' is not a step",
         "fit, validate, test, analyze, predict"),
        ({"steps": [{"name": "fit"}, {"name": "test"}, {"name": "test"}]}, "steps[1].name", "listed twice",
         "each step once"),
        ({"report": {"task": "vision_cls", "headlines": {"acc": ["("]}}}, "report.headlines.acc", "not a regex",
         "fix the pattern"),
        ({"slurm": {"predict": {"nodes": 1}}}, "slurm", "unknown key(s) predict", "fit, test, analyze, report"),
        ({"slurm": {"fit": {"nodes": None}}}, "slurm.fit.nodes", "not an sbatch option value", "string or number"),
    ],
)  # fmt: skip
def test_invalid_plans_name_the_file_the_key_and_the_fix(tmp_path, monkeypatch, changes, key, says, fix):
    monkeypatch.chdir(tmp_path)
    path = write_plan(tmp_path, plan_dict(**changes))
    with pytest.raises(PlanError) as error:
        load_plan(path)
    message = str(error.value)
    assert message.startswith(f"{path}: {key}: ")
    assert says in message and fix in message


def test_missing_or_broken_plan_files_and_overrides_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlanError, match=r"plan file .*nope.yaml does not exist; give the path of a plan YAML"):
        load_plan(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(PlanError, match=r"(?s)broken.yaml: not a readable YAML file .*fix its syntax"):
        load_plan(broken)
    missing = write_plan(tmp_path, {key: value for key, value in plan_dict().items() if key != "steps"})
    with pytest.raises(PlanError, match=r"plan.yaml: the plan: missing key\(s\) steps; add them"):
        load_plan(missing)
    path = write_plan(tmp_path, plan_dict())
    with pytest.raises(PlanError, match=r"plan.yaml: --override\[0\]: 'data.root=x' is not a '--key=value' argument"):
        load_plan(path, overrides=["data.root=x"])
    plan = load_plan(path)
    with pytest.raises(PlanError, match=r"no run 'rpc/seed7' in this plan; its runs are: symmetric/seed0, "):
        plan.run("rpc/seed7")
    with pytest.raises(PlanError, match=r"no step 'predict' in this plan; its steps are: fit, test, analyze"):
        plan.step("predict")


def test_the_command_names_a_bad_plan_and_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write_plan(tmp_path, plan_dict(seeds=[]))
    for command in (["validate", str(path)], ["run", str(path)], ["status", str(path)]):
        with pytest.raises(SystemExit) as exit_info:
            main(command)
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert error.startswith(f"error: {path}: seeds: ") and error.count("\n") == 1, command
    with pytest.raises(SystemExit) as exit_info:
        main(["exec", str(write_plan(tmp_path, plan_dict())), "--run", "rpc/seed9", "--step", "fit"])
    assert exit_info.value.code == 2 and "no run 'rpc/seed9' in this plan" in capsys.readouterr().err


def test_relative_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    plan = load_plan(
        write_plan(tmp_path, plan_dict(common={"configs": ["configs/trainer/cpu.yaml"]}, out="runs/x")),
    )
    assert plan.runs[0].configs[0] == CPU and plan.out == REPO / "runs" / "x"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlanError, match=r"common.configs\[0\]: config file configs/trainer/cpu.yaml does not exist"):
        load_plan(tmp_path / "plan.yaml")


def test_a_plan_without_out_writes_under_runs_by_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = load_plan(write_plan(tmp_path, {key: v for key, v in plan_dict().items() if key != "out"}))
    assert plan.out == tmp_path / "runs" / "tiny"


def test_validate_names_plan_run_step_and_the_parsers_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = load_plan(write_plan(tmp_path, plan_dict()), overrides=["--trainer.no_such_option=1"])
    with pytest.raises(ValidationError) as error:
        validate_plan(plan)
    message = str(error.value)
    assert message.startswith(f"{plan.path}: run 'symmetric', step 'fit': the vision_cls app refuses its arguments")
    assert "unrecognized arguments: --trainer.no_such_option=1" in message and "usage:" not in message
    assert not plan.out.exists()  # nothing ran


@pytest.mark.slow
def test_validate_parses_each_run_once_and_refuses_a_bad_step_override(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    steps = [{"name": "fit"}, {"name": "test", "overrides": ["--data.batch_size=many"]}]
    plan = load_plan(write_plan(tmp_path, plan_dict(steps=steps)))
    with pytest.raises(ValidationError, match=r"(?s)run 'symmetric', step 'test': .*data.batch_size"):
        validate_plan(plan)
    good = load_plan(write_plan(tmp_path, plan_dict(steps=steps[:1]), "good.yaml"))
    assert validate_plan(good) == 2  # two runs x one step; the seeds are not parsed again


@pytest.mark.parametrize("path", SHIPPED, ids=[path.name for path in SHIPPED])
def test_shipped_plans_load(path, monkeypatch):
    monkeypatch.chdir(REPO)
    plan = load_plan(path)
    assert plan.runs and plan.steps and plan.report is not None
    assert plan.out.is_relative_to(REPO / "runs")


@pytest.mark.slow
@pytest.mark.parametrize("path", SHIPPED, ids=[path.name for path in SHIPPED])
def test_shipped_plans_validate(path, monkeypatch):
    monkeypatch.chdir(REPO)
    plan = load_plan(path)
    assert validate_plan(plan) == len({run.name for run in plan.runs}) * len(plan.steps)


def test_the_paper_plans_are_shipped():
    names = {path.name for path in SHIPPED}
    assert {
        "deit-tiny_published.yaml", "deit-tiny_scaled-attention.yaml", "lm_published.yaml",
        "segmenter_elliptical.yaml", "segmenter_default.yaml",
    } <= names  # fmt: skip
