"""The robustness report's name: the schema kpca-report reads gives the writer's default, a config may rename it."""

from pathlib import Path

import pytest

from kpca.vision_cls.evaluation import ROBUSTNESS_REPORT, RobustnessEvaluator

RESULTS = {"clean/acc1": 0.5, "clean/acc5": 0.75, "clean/n_images": 4.0, "imagenet_a/acc1": float("nan")}


@pytest.mark.parametrize("report_name", [None, "attacks_only"])
def test_the_report_schema_reads_what_the_evaluator_writes(tmp_path: Path, report_name: str | None):
    evaluator = RobustnessEvaluator() if report_name is None else RobustnessEvaluator(report_name=report_name)
    paths = evaluator.write_report(RESULTS, tmp_path)
    stem = report_name or ROBUSTNESS_REPORT.stem
    assert [path.name for path in paths] == [f"{stem}.md", f"{stem}.csv"]
    assert ROBUSTNESS_REPORT.read(paths[1]) == {"clean/acc1": 0.5, "clean/acc5": 0.75}
