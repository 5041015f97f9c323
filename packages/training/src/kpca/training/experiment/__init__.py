"""Experiment plans: run a paper comparison (models x seeds x steps) from one YAML file, locally or on SLURM.

``kpca-experiment run configs/experiments/<plan>.yaml`` runs every step of every run and seed that is not done yet
(:mod:`.local`, or :mod:`.slurm` with ``--executor slurm``), then writes the plan's report; ``status`` shows where
each run stands. The plan file is read by :mod:`.plan`; one step runs through :mod:`.steps`.
"""

from kpca.training.experiment.plan import (
    Plan,
    PlanError,
    PlannedRun,
    ReportSpec,
    StepSpec,
    exec_command,
    load_plan,
    step_argv,
    step_folder,
)

__all__ = [
    "Plan",
    "PlanError",
    "PlannedRun",
    "ReportSpec",
    "StepSpec",
    "exec_command",
    "load_plan",
    "step_argv",
    "step_folder",
]
