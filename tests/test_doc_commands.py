"""Every command that README.md, docs/*.md and the package and app READMEs show is one its program accepts.

Each command is parsed by its program's own parser without running anything (tests/command_support.py says how
commands are found and what placeholders stand for): an app command by the app's LightningCLI, so a renamed or
removed option, an unknown config key, a value of the wrong type, a missing ``-c`` file or an unknown subcommand
fails here; a ``kpca-experiment`` command by its parser, with the plan it names loaded and, for ``run`` and
``validate``, every step's arguments (the plan's and the command's ``--override``) parsed as ``kpca-experiment
validate`` parses them; a ``kpca-report`` command by its parser and its task list. The tests at the end prove that
each kind of drift is reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.command_support import (
    REPO,
    app_argument_lists,
    checkable,
    commands_in,
    commands_in_text,
    console_scripts,
    doc_pages,
    plain_argument_lists,
    problem,
)

PAGES = doc_pages()


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_command_of_the_page_parses(page: Path):
    refused = [f"{c.where}: {c.text}\n  {p}" for c in commands_in(page) if (p := problem(c)) is not None]
    assert not refused, f"{page_id(page)} shows commands their program refuses:\n" + "\n".join(refused)


def test_every_kpca_console_script_has_a_parser_here():
    """A new console script fails here until tests/command_support.py knows how to parse its commands."""
    assert {"vision-cls", "language-model", "segmentation", "kpca-experiment", "kpca-report"} <= set(console_scripts())
    assert [name for name in console_scripts() if not checkable(name)] == []


def test_the_readme_commands_are_found():
    """The README's fenced commands are all found, a continued line in one piece (else the page test passes empty)."""
    found = {(c.where, c.program, c.args[0]) for c in commands_in(REPO / "README.md") if not c.mention}
    programs = {(program, first) for _, program, first in found}
    assert {
        ("vision-cls", "fit"), ("language-model", "fit"), ("segmentation", "fit"), ("kpca-report", "runs/"),
        ("vision-cls", "check-data"), ("kpca-experiment", "run"), ("kpca-experiment", "status"),
    } <= programs  # fmt: skip
    (segmentation,) = [c for c in commands_in(REPO / "README.md") if c.program == "segmentation"]
    assert segmentation.args[-2:] == ("--data.root", "/data/ADEChallengeData2016")


def test_commands_are_read_as_a_shell_reads_them():
    text = "\n".join(
        [
            "Run `vision-cls export` or `language-model test -c <the configs> --ckpt_path <file>`.",
            "",
            "```bash",
            "# a comment naming vision-cls fit is no command",
            "NNODES=2 docker/launch_torchrun.sh vision_cls fit -c configs/trainer/cpu.yaml \\",
            "    -c configs/vision_cls/smoke.yaml --ckpt_path <the authors' file>   # it's a comment",
            "squeue; kpca-report runs/ --task vision_cls",
            'python -m kpca.language_model predict --data.predict_prompts=\'["a b", "c"]\'',
            "```",
            "```python",
            "# vision-cls fit in Python is not a shell command",
            "```",
        ]
    )
    commands = [(c.where, c.program, c.args, c.mention) for c in commands_in_text(text, "page.md")]
    assert commands == [
        ("page.md:1", "vision-cls", ("export",), True),
        ("page.md:1", "language-model", ("test", "-c", "<the_configs>", "--ckpt_path", "<file>"), False),
        ("page.md:5", "vision-cls",
         ("fit", "-c", "configs/trainer/cpu.yaml", "-c", "configs/vision_cls/smoke.yaml", "--ckpt_path",
          "<the_authors__file>"), False),
        ("page.md:7", "kpca-report", ("runs/", "--task", "vision_cls"), False),
        ("page.md:8", "language-model", ("predict", '--data.predict_prompts=["a b", "c"]'), False),
    ]  # fmt: skip


def test_placeholders_and_synopses_become_argument_lists():
    assert app_argument_lists(["fit", "...", "--kernel_pca.samples", "8"], "vision_cls") == [
        ["fit", "-c", "configs/trainer/cpu.yaml", "-c", "configs/vision_cls/smoke.yaml", "--kernel_pca.samples", "8"]
    ]
    assert app_argument_lists(["check-data", "-c", "<experiment>.yaml"], "segmentation") == [
        ["check-data", "-c", "configs/segmentation/smoke.yaml"]
    ]
    assert plain_argument_lists(["run", "PLAN", "[--executor", "local|slurm]", "[--override=--k=v", "...]"]) == [
        ["run", "PLAN", "--executor", "local", "--override=--k=v"],
        ["run", "PLAN", "--executor", "slurm", "--override=--k=v"],
    ]
    assert plain_argument_lists(["validate", "configs/experiments/demo_*.yaml"]) == [
        ["validate", "configs/experiments/demo_family.yaml", "configs/experiments/demo_lm.yaml",
         "configs/experiments/demo_seg.yaml", "configs/experiments/demo_vision.yaml"]
    ]  # fmt: skip


SMOKE = "-c configs/trainer/cpu.yaml -c configs/vision_cls/smoke.yaml"


@pytest.mark.parametrize(
    ("markdown", "reported"),
    [
        (f"```bash\nvision-cls fit {SMOKE} --model.nonexistent=1\n```", "--model.nonexistent=1"),
        (f"```bash\nvision-cls fit {SMOKE} \\\n    --data.nonexistent 1   # continued\n```", "--data.nonexistent"),
        (f"`python -m kpca.vision_cls test {SMOKE} --trainer.max_epochs many`", "trainer.max_epochs"),
        ("`vision-cls fit -c configs/trainer/cpu.yaml -c configs/vision_cls/smok.yaml`", "smok.yaml"),
        (f"`vision-cls fitt {SMOKE}`", "fitt"),
        ("`vision-cls exprt`", "no subcommand or option 'exprt'"),
        ("`kpca-report --refrence`", "no subcommand or option '--refrence'"),
        (
            "`language-model fit -c configs/trainer/cpu.yaml -c configs/language_model/smoke.yaml --model.nonexist 1`",
            "--model.nonexist",
        ),
        (
            "```bash\nsbatch docker/launch_slurm.sh segmentation fit -c configs/trainer/cpu.yaml "
            "-c configs/segmentation/smoke.yaml --data.nonexistent=1\n```",
            "--data.nonexistent=1",
        ),
        (
            "`kpca-experiment run configs/experiments/demo_vision.yaml --override=--model.nonexistent=1`",
            "--model.nonexistent=1",
        ),
        ("`kpca-experiment run configs/experiments/demo_vision.yaml --executor cloud`", "invalid choice: 'cloud'"),
        ("`kpca-experiment status configs/experiments/no_such_plan.yaml`", "does not exist"),
        ("`kpca-experiment exec configs/experiments/demo_vision.yaml --run nobody/seed0 --step fit`", "nobody"),
        ("`kpca-report runs/ --task vision`", "'vision' is not an installed report task"),
        ("`kpca-report --task vision_cls --name x`", "needs the runs folder"),
        ("```bash\npython -m kpca.no_such_app fit\n```", "no kpca console script runs kpca.no_such_app"),
        (
            "```bash\nsrun python -m kpca.training.slurm_start kpca.vision_cls fit --trainer.max_epochs many\n```",
            "trainer.max_epochs",
        ),
        ("```bash\nvision-cls fit --data.root 'unclosed\n```", "not a shell command"),
    ],
    ids=lambda value: value.split("\n")[1][:40] if value.startswith("```") else value[:40],
)
def test_a_wrong_command_is_reported(markdown: str, reported: str):
    """Each kind of drift the page test guards against is reported, with the parser's message."""
    (command,) = commands_in_text(markdown, "page.md")
    message = problem(command)
    assert message is not None, command
    assert reported in message


@pytest.mark.parametrize(
    "markdown",
    [
        f"`vision-cls test {SMOKE} --ckpt_path <ckpt>`",
        "```bash\nvision-cls fit ... --kernel_pca.every_n_epochs 1\n```",
        f"`vision-cls fit --print_config {SMOKE}`",
        "`kpca-experiment exec PLAN --run <run>/seed<k> --step NAME [--launcher CMD]`",
        "`kpca-experiment validate configs/experiments/demo_vis*.yaml`",
        "`kpca-report --task`",
    ],
)
def test_a_right_command_is_accepted(markdown: str):
    """Placeholders, elided configs and synopses stand for what a reader fills in, not for a refusal."""
    (command,) = commands_in_text(markdown, "page.md")
    assert problem(command) is None
