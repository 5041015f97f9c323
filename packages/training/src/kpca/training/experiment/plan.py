"""The plan file: which models, seeds and steps an experiment runs, read and checked before anything runs.

A plan (YAML, see docs/experiments.md) lists runs (a model each: its config files and overrides), seeds and steps
(``fit``, then ``test`` / ``analyze`` / ``predict`` / ``validate`` of the fit's checkpoint). Every run x seed x step
is one app command, ``python -m kpca.<app> <step_argv(...)>``, that logs into its own folder
``<out>/<run>/seed<k>/<step>``; rerunning a plan resumes what was left (see :mod:`kpca.training.experiment.steps`).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kpca.training.errors import OptionError

APPS = ("vision_cls", "language_model", "segmentation")
"""The apps a plan can run: its steps are ``python -m kpca.<app> ...``."""
STEP_NAMES = ("fit", "validate", "test", "analyze", "predict")
"""The app subcommands a plan step can be."""
CHECKPOINTS = ("best", "last")
"""Which checkpoint of a run's fit a later step evaluates."""
NAME = re.compile(r"[A-Za-z0-9._-]+")
"""Plan and run names: they become folder names."""
PLAN_KEYS = ("name", "app", "out", "seeds", "common", "runs", "steps", "report", "slurm")
REQUIRED_PLAN_KEYS = ("name", "app", "seeds", "runs", "steps")
COMMON_KEYS = ("configs", "overrides")
RUN_KEYS = ("name", "label", "configs", "overrides")
STEP_KEYS = ("name", "ckpt", "configs", "overrides")
REPORT_KEYS = ("task", "title", "headlines", "kernel_pca")
REPORT_JOB = "report"
"""The ``slurm`` key of the report job's resources (beside the step names)."""


class PlanError(OptionError):
    """A plan file that cannot run: the message names the file, the key and the fix."""


@dataclass(frozen=True)
class StepSpec:
    """One step of every run: an app subcommand with its extra config files and overrides.

    Attributes:
        name: the subcommand (one of :data:`STEP_NAMES`).
        ckpt: ``best`` or ``last`` checkpoint of the run's fit, or None (``fit`` itself, or no checkpoint).
        configs: extra ``-c`` files of this step (absolute).
        overrides: extra ``--key=value`` arguments of this step.
    """

    name: str
    ckpt: str | None = None
    configs: tuple[Path, ...] = ()
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlannedRun:
    """One run x seed of a plan.

    Attributes:
        name: the run's name in the plan.
        label: its display name (the name when the plan gives none).
        seed: the seed (``--seed_everything``).
        folder: ``<out>/<name>/seed<seed>``: the step folders, markers and logs of this run and seed.
        configs: the ``-c`` files of every step, the plan's ``common`` ones first (absolute).
        overrides: the ``--key=value`` arguments of every step, the plan's ``common`` ones first.
    """

    name: str
    label: str
    seed: int
    folder: Path
    configs: tuple[Path, ...] = ()
    overrides: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """``<name>/seed<seed>``: how commands and tables name this run."""
        return f"{self.name}/seed{self.seed}"


@dataclass(frozen=True)
class ReportSpec:
    """The plan's report: a ``kpca-report`` task, a title, headline metrics and the kernel-PCA section.

    Attributes:
        task: a ``kpca-report`` task (an installed app's report).
        title: the report's title.
        headlines: label -> metric regexes; a headline is the mean over the metrics that match.
        kernel_pca: merge the ``analyze`` steps' kernel-PCA tables into the report.
    """

    task: str
    title: str
    headlines: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    kernel_pca: bool = False


@dataclass(frozen=True)
class Plan:
    """A checked plan file.

    Attributes:
        path: the plan file (absolute).
        name: the plan's name.
        app: the app whose commands the steps are.
        out: the root folder of the plan's runs (absolute).
        runs: one per run x seed, run-major, seed-minor.
        steps: the steps of every run, in order.
        report: the report, or None.
        slurm: sbatch resources per step name and for ``report``.
        overrides: ``--key=value`` arguments appended to every step of every run (given with the command).
    """

    path: Path
    name: str
    app: str
    out: Path
    runs: tuple[PlannedRun, ...]
    steps: tuple[StepSpec, ...]
    report: ReportSpec | None = None
    slurm: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()

    def run(self, run_id: str) -> PlannedRun:
        """The run x seed named ``run_id`` (``<name>/seed<k>``); PlanError listing the plan's ids otherwise."""
        for run in self.runs:
            if run.id == run_id:
                return run
        ids = ", ".join(run.id for run in self.runs)
        raise PlanError(f"{self.path}: no run {run_id!r} in this plan; its runs are: {ids}")

    def step(self, name: str) -> StepSpec:
        """The step named ``name``; PlanError listing the plan's steps otherwise."""
        for step in self.steps:
            if step.name == name:
                return step
        names = ", ".join(step.name for step in self.steps)
        raise PlanError(f"{self.path}: no step {name!r} in this plan; its steps are: {names}")


def step_folder(plan: Plan, run: PlannedRun, step_name: str) -> Path:
    """``<run folder>/<step>``: the step's LightningCLI log folder (save_dir ``out/<run>``, name ``seed<k>``)."""
    return run.folder / step_name


def step_argv(plan: Plan, run: PlannedRun, step_name: str, checkpoint: Path | None) -> list[str]:
    """The app's command-line arguments of one step (what follows ``python -m kpca.<app>``).

    The subcommand, the ``-c`` files (common, run, step), the logger folder (``<out>/<run>/seed<k>/<step>``) and
    ``default_root_dir`` (the run folder, where SLURM's ``hpc_ckpt_*`` files go), ``--seed_everything``, the
    overrides (common, run, step, plan), then ``--ckpt_path auto`` for ``fit`` (rerunning resumes) or
    ``--ckpt_path=<checkpoint>`` for the others; ``analyze`` writes into its step folder (``--out_dir``).
    """
    step = plan.step(step_name)
    argv = [step_name]
    for config in (*run.configs, *step.configs):
        argv += ["-c", str(config)]
    argv += [
        f"--trainer.logger.init_args.save_dir={plan.out / run.name}",
        f"--trainer.logger.init_args.name=seed{run.seed}",
        f"--trainer.logger.init_args.version={step_name}",
        f"--trainer.default_root_dir={run.folder}",
        f"--seed_everything={run.seed}",
        *run.overrides,
        *step.overrides,
        *plan.overrides,
    ]
    if step_name == "fit":
        argv += ["--ckpt_path", "auto"]
    elif checkpoint is not None:
        argv.append(f"--ckpt_path={checkpoint}")
    if step_name == "analyze":
        argv.append(f"--out_dir={step_folder(plan, run, step_name)}")
    return argv


def exec_command(plan: Plan, run: PlannedRun, step_name: str, launcher: Sequence[str] = ()) -> list[str]:
    """The command that executes one step through :mod:`kpca.training.experiment.steps` (``kpca-experiment exec``).

    ``launcher`` (e.g. ``["srun"]``) prefixes the app's process, not this one.
    """
    return [
        sys.executable, "-m", "kpca.training.experiment", "exec", str(plan.path), "--run", run.id, "--step", step_name,
        *("--override=" + override for override in plan.overrides),
        *(["--launcher", shlex.join(launcher)] if launcher else []),
    ]  # fmt: skip


def load_plan(path: str | Path, overrides: Sequence[str] = ()) -> Plan:
    """Read and check the plan file at ``path``; ``overrides`` are appended to every step of every run.

    Relative paths in the plan (``out``, ``configs``) are relative to the working directory, as ``-c`` is.

    Raises:
        PlanError: for a missing or unreadable file, unknown or missing keys, bad names or values, missing config
            files, steps in an order that cannot run: the message names the file, the key and the fix.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise PlanError(f"plan file {path} does not exist; give the path of a plan YAML (e.g. configs/experiments/)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise PlanError(f"{path}: not a readable YAML file ({error}); fix its syntax") from error
    return _Reader(path).plan(data, overrides)


class _Reader:
    """Checks one plan file's values; every error names the file and the key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, key: str, problem: str, fix: str) -> PlanError:
        return PlanError(f"{self.path}: {key}: {problem}; {fix}")

    def plan(self, data: object, extra_overrides: Sequence[str]) -> Plan:
        mapping = self.mapping(data, "the plan", PLAN_KEYS, REQUIRED_PLAN_KEYS)
        name = self.name(mapping["name"], "name")
        app = mapping["app"]
        if app not in APPS:
            raise self.error("app", f"{app!r} is not an app", f"use one of {', '.join(APPS)}")
        out = Path(self.string(mapping.get("out", f"runs/{name}"), "out")).resolve()
        seeds = self.seeds(mapping["seeds"])
        common = self.mapping(mapping.get("common") or {}, "common", COMMON_KEYS)
        common_configs = self.configs(common.get("configs"), "common.configs")
        common_overrides = self.overrides(common.get("overrides"), "common.overrides")
        steps = self.steps(mapping["steps"])
        runs = []
        for run_name, label, configs, overrides in self.runs(mapping["runs"]):
            for seed in seeds:
                runs.append(
                    PlannedRun(
                        name=run_name, label=label, seed=seed, folder=out / run_name / f"seed{seed}",
                        configs=(*common_configs, *configs), overrides=(*common_overrides, *overrides),
                    )
                )  # fmt: skip
        report = self.report(mapping.get("report"), app)
        slurm = self.slurm(mapping.get("slurm"), steps)
        return Plan(
            path=self.path, name=name, app=app, out=out, runs=tuple(runs), steps=steps, report=report, slurm=slurm,
            overrides=self.overrides(list(extra_overrides), "--override"),
        )  # fmt: skip

    def mapping(
        self, value: object, key: str, allowed: Sequence[str], required: Sequence[str] = ()
    ) -> Mapping[str, object]:
        if not isinstance(value, Mapping):
            raise self.error(key, f"expected a mapping, got {value!r}", "see docs/experiments.md for the plan format")
        unknown = [k for k in value if k not in allowed]
        if unknown:
            raise self.error(
                key, f"unknown key(s) {', '.join(map(str, unknown))}", f"the allowed keys are {', '.join(allowed)}"
            )
        missing = [k for k in required if k not in value]
        if missing:
            raise self.error(key, f"missing key(s) {', '.join(missing)}", "add them (see docs/experiments.md)")
        return value

    def string(self, value: object, key: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(key, f"expected a non-empty string, got {value!r}", "write it as a YAML string")
        return value

    def name(self, value: object, key: str) -> str:
        if not isinstance(value, str) or not NAME.fullmatch(value):
            raise self.error(
                key, f"{value!r} is not a valid name", "use letters, digits, '.', '_' and '-' only (it names folders)"
            )
        return value

    def seeds(self, value: object) -> tuple[int, ...]:
        if not isinstance(value, list) or not value:
            raise self.error("seeds", f"expected a non-empty list of integers, got {value!r}", "e.g. seeds: [0, 1, 2]")
        for seed in value:
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise self.error("seeds", f"{seed!r} is not a non-negative integer", "e.g. seeds: [0, 1, 2]")
        if len(set(value)) != len(value):
            raise self.error("seeds", f"{value} repeats a seed", "list each seed once")
        return tuple(value)

    def configs(self, value: object, key: str) -> tuple[Path, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of config files, got {value!r}", "e.g. [configs/trainer/cpu.yaml]")
        files = []
        for i, entry in enumerate(value):
            config = Path(self.string(entry, f"{key}[{i}]"))
            if not config.is_file():
                raise self.error(
                    f"{key}[{i}]",
                    f"config file {entry} does not exist (relative paths are relative to the working directory "
                    f"{Path.cwd()})",
                    "fix the path or run from the folder it is relative to (the repository root)",
                )
            files.append(config.resolve())
        return tuple(files)

    def overrides(self, value: object, key: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of '--key=value' strings, got {value!r}", 'e.g. ["--seed=1"]')
        for i, entry in enumerate(value):
            if not isinstance(entry, str) or not entry.startswith("--") or len(entry) < 3:
                raise self.error(
                    f"{key}[{i}]", f"{entry!r} is not a '--key=value' argument", "write e.g. --trainer.max_epochs=3"
                )
        return tuple(value)

    def runs(self, value: object) -> list[tuple[str, str, tuple[Path, ...], tuple[str, ...]]]:
        if not isinstance(value, list) or not value:
            raise self.error("runs", f"expected a non-empty list of runs, got {value!r}", "add at least one run")
        runs, seen = [], set()
        for i, entry in enumerate(value):
            key = f"runs[{i}]"
            run = self.mapping(entry, key, RUN_KEYS, ("name",))
            name = self.name(run["name"], f"{key}.name")
            if name in seen:
                raise self.error(f"{key}.name", f"the run name {name!r} is used twice", "give each run its own name")
            seen.add(name)
            label = self.string(run.get("label", name), f"{key}.label")
            configs = self.configs(run.get("configs"), f"{key}.configs")
            runs.append((name, label, configs, self.overrides(run.get("overrides"), f"{key}.overrides")))
        return runs

    def steps(self, value: object) -> tuple[StepSpec, ...]:
        if not isinstance(value, list) or not value:
            raise self.error("steps", f"expected a non-empty list of steps, got {value!r}", "e.g. - name: fit")
        names = [entry.get("name") if isinstance(entry, Mapping) else None for entry in value]
        steps = []
        for i, entry in enumerate(value):
            key = f"steps[{i}]"
            step = self.mapping(entry, key, STEP_KEYS, ("name",))
            name = step["name"]
            if name not in STEP_NAMES:
                raise self.error(f"{key}.name", f"{name!r} is not a step", f"use one of {', '.join(STEP_NAMES)}")
            if names.count(name) > 1:
                raise self.error(f"{key}.name", f"the step {name!r} is listed twice", "list each step once")
            ckpt = self.fit_step(step, key, i) if name == "fit" else self.checkpoint(step, key, i, names)
            configs = self.configs(step.get("configs"), f"{key}.configs")
            steps.append(StepSpec(name, ckpt, configs, self.overrides(step.get("overrides"), f"{key}.overrides")))
        return tuple(steps)

    def fit_step(self, step: Mapping[str, object], key: str, index: int) -> None:
        if index != 0:
            raise self.error(f"{key}.name", "fit must be the first step", "move it to the top of steps")
        if step.get("ckpt") is not None:
            raise self.error(
                f"{key}.ckpt", "fit takes no ckpt (it always runs with --ckpt_path auto)", "remove the ckpt key"
            )

    def checkpoint(self, step: Mapping[str, object], key: str, index: int, names: Sequence[object]) -> str | None:
        ckpt = step.get("ckpt", "best" if "fit" in names else None)
        if ckpt is None:
            return None
        if ckpt not in CHECKPOINTS:
            raise self.error(
                f"{key}.ckpt", f"{ckpt!r} is not a checkpoint of the fit", "use best or last (or null for none)"
            )
        if "fit" not in names[:index]:
            raise self.error(
                f"{key}.ckpt",
                f"the {step['name']} step needs the {ckpt} checkpoint of this run's fit, but no fit step comes before",
                "add '- name: fit' as the first step, or set ckpt: null and pass --ckpt_path=<file> in its overrides",
            )
        return ckpt

    def report(self, value: object, app: str) -> ReportSpec | None:
        if value is None:
            return None
        report = self.mapping(value, "report", REPORT_KEYS)
        task = self.string(report.get("task", app), "report.task")
        title = self.string(report.get("title", self.path.stem), "report.title")
        headlines = report.get("headlines") or {}
        if not isinstance(headlines, Mapping):
            raise self.error(
                "report.headlines", f"expected a mapping of label -> metric regexes, got {headlines!r}",
                'e.g. {"clean accuracy": ["clean/acc1"]}',
            )  # fmt: skip
        patterns = {}
        for label, regexes in headlines.items():
            key = f"report.headlines.{label}"
            if isinstance(regexes, str):
                regexes = [regexes]
            if not isinstance(regexes, list) or not regexes:
                raise self.error(key, f"expected a list of metric regexes, got {regexes!r}", 'e.g. ["clean/acc1"]')
            for regex in regexes:
                try:
                    re.compile(self.string(regex, key))
                except re.error as error:
                    raise self.error(key, f"{regex!r} is not a regex ({error})", "fix the pattern") from error
            patterns[str(label)] = tuple(regexes)
        kernel_pca = report.get("kernel_pca", False)
        if not isinstance(kernel_pca, bool):
            raise self.error("report.kernel_pca", f"expected true or false, got {kernel_pca!r}", "write true or false")
        return ReportSpec(task, title, patterns, kernel_pca)

    def slurm(self, value: object, steps: Sequence[StepSpec]) -> dict[str, dict[str, object]]:
        if value is None:
            return {}
        jobs = (*(step.name for step in steps), REPORT_JOB)
        slurm = self.mapping(value, "slurm", jobs)
        resources = {}
        for job, options in slurm.items():
            if not isinstance(options, Mapping):
                raise self.error(
                    f"slurm.{job}", f"expected a mapping of sbatch options, got {options!r}",
                    'e.g. {nodes: 1, time: "4:00:00"}',
                )  # fmt: skip
            for option, setting in options.items():
                if not isinstance(option, str) or isinstance(setting, (Mapping, list)) or setting is None:
                    raise self.error(
                        f"slurm.{job}.{option}", f"{setting!r} is not an sbatch option value", "give a string or number"
                    )
            resources[job] = dict(options)
        return resources
