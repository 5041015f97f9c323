"""``kpca-report`` on a tree of real runs: two attention kinds x two seeds, fitted and tested through the CLI.

One test run renames its report (``--model.evaluator.report_name``): kpca-report follows its saved config. The
``kpca-report`` console script runs its own function in this process (tests/console_support.py).
"""

import csv
import statistics
from pathlib import Path

import pytest

from kpca.vision_cls.cli import VisionCLI, main
from tests.cli_support import CONFIGS, NEW_CHECKPOINT_DIR, run_cli, smoke_options
from tests.console_support import console

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
EMA_IN_EVAL_MODE = pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")


def run(*args: object) -> VisionCLI:
    return run_cli(main, "vision-cls", *args)


def _robustness(folder: Path, stem: str) -> dict[str, float]:
    with (folder / f"{stem}.csv").open() as stream:
        return {row["metric"]: float(row["value"]) for row in csv.DictReader(stream)}


@pytest.mark.slow
@EMA_IN_EVAL_MODE
@NEW_CHECKPOINT_DIR
def test_kpca_report_aggregates_seeds_and_lists_incomplete_runs(tmp_path: Path, digits_cache_dir: Path, capsys):
    tested: dict[str, list[dict[str, float]]] = {"symmetric": [], "rpc": []}
    for kind in tested:
        for seed in (1, 2):
            options = smoke_options(
                SMOKE, tmp_path, digits_cache_dir, f"--model.net.init_args.attention.kind={kind}",
                f"--seed_everything={seed}", f"--trainer.logger.init_args.name={kind}",
                "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1",
            )  # fmt: skip
            fit = run("fit", *options)
            stem = "rpc_seed2" if (kind, seed) == ("rpc", 2) else "robustness"
            ckpt = fit.trainer.checkpoint_callback.last_model_path
            test = run("test", *options, f"--ckpt_path={ckpt}", f"--model.evaluator.report_name={stem}")
            tested[kind].append(_robustness(Path(test.trainer.log_dir), stem))
    untested = smoke_options(SMOKE, tmp_path, digits_cache_dir, "--trainer.logger.init_args.name=untested")
    run(
        "fit",
        *untested,
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
        "--trainer.log_every_n_steps=1",
    )

    runs = tmp_path / "runs"
    done = console(capsys, "kpca-report", tmp_path, str(runs) + "/", "--task", "vision_cls")  # the README's command
    assert done.returncode == 0, done.stderr
    with (runs / "comparison.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    complete = {row["kind"]: row for row in rows if row["status"] == "complete"}
    assert sorted(complete) == ["rpc", "symmetric"] and len(rows) == 3
    for kind, results in tested.items():
        row = complete[kind]
        assert (row["seeds"], row["runs"]) == ("1 2", "2")
        for metric in ("clean/acc1", "corrupted/mean_acc1", "attack/pgd-pixel/eps2/acc1"):
            values = [r[metric] for r in results]
            assert float(row[metric]) == pytest.approx(statistics.fmean(values), abs=1e-12)
            assert float(row[f"{metric}_std"]) == pytest.approx(statistics.stdev(values), abs=1e-12)
    (incomplete,) = [row for row in rows if row["status"] != "complete"]
    assert "untested" in incomplete["status"] and incomplete["runs"] == "0"
    markdown = (runs / "comparison.md").read_text()
    assert "| rpc n_iter=2 lambd=4.0 layers=[0] | 1 2 |" in markdown and "untested" in markdown
    assert " ± " in markdown and (runs / "comparison.png").stat().st_size > 0
    assert markdown in done.stdout
