"""A refused command starts with one ``error: <option path>: <what is wrong>`` line, says where the value came from,
and prints no usage (kpca.training.parser).

The CLI tests run the real console script as a user types it; the others run the language model's own parser in
this process, so that a jsonargparse upgrade that changes its messages or types fails them.
"""

from __future__ import annotations

import subprocess
import sys
from argparse import ArgumentError
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from jsonargparse import ArgumentParser

from kpca.attention.spec import kinds
from kpca.language_model.cli import main as lm_main
from kpca.training.parser import (
    COMMAND_LINE,
    MAX_DETAIL_LINES,
    ProjectArgumentParser,
    Refusal,
    config_files,
    error_report,
    origin,
    reshape,
    suggestions,
)
from tests.cli_support import CONFIGS, CPU, refusal

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
LM_SMOKE = CONFIGS / "language_model" / "smoke.yaml"
KINDS = ", ".join(repr(kind) for kind in kinds())  # the registered attention kinds, as the parser lists them
BAD_KIND = f"error: model.net.init_args.attention.kind: 'rcp' is not one of {KINDS}"


def refused(cwd: Path, *options: object) -> list[str]:
    """The stderr lines of ``python -m kpca.vision_cls fit -c cpu.yaml -c smoke.yaml <options>``, which must be
    refused by the parser: exit status 2, a short message starting with ``error:``, no usage, no traceback."""
    command = [sys.executable, "-m", "kpca.vision_cls", "fit", "-c", CPU, "-c", SMOKE, *options]
    done = subprocess.run([str(arg) for arg in command], cwd=cwd, capture_output=True, text=True, timeout=300)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert lines and lines[0].startswith("error: "), done.stderr
    assert "usage:" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(lines) < 15 and lines[-1].startswith("see: ") and lines[-1].endswith(" fit --help"), done.stderr
    return lines


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return path


# The console script


@pytest.mark.slow
def test_a_bad_literal_on_the_command_line(tmp_path: Path):
    lines = refused(tmp_path, "--model.net.init_args.attention.kind=rcp")
    assert lines[0] == BAD_KIND
    assert lines[1].strip() == COMMAND_LINE


@pytest.mark.slow
def test_a_bad_literal_in_a_config_file_names_the_file(tmp_path: Path):
    mine = config(tmp_path, "model:\n  net:\n    init_args:\n      attention:\n        kind: rcp\n")
    lines = refused(tmp_path, "-c", mine)
    assert lines[0] == BAD_KIND
    assert lines[1].strip() == f"(set in {mine})"


@pytest.mark.slow
def test_an_unknown_option_gets_the_close_one(tmp_path: Path):
    lines = refused(tmp_path, "--trainer.max_step=3")
    assert lines[0] == "error: unrecognized arguments: --trainer.max_step=3"
    assert "did you mean --trainer.max_steps?" in lines


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "first_line", "close"),
    [
        ("data: {eval_subst: 3}\n", "error: data.eval_subst: Group 'data' does not accept option 'eval_subst'",
         "data.eval.subset"),
        ("trainer: {max_step: 3}\n", "error: trainer.max_step: Group 'trainer' does not accept option 'max_step'",
         "trainer.max_steps"),
    ],
)  # fmt: skip
def test_an_unknown_key_in_a_config_file_names_the_file_and_the_key(
    tmp_path: Path, text: str, first_line: str, close: str
):
    mine = config(tmp_path, text)
    lines = refused(tmp_path, "-c", mine)
    assert lines[0] == first_line
    assert lines[1].strip() == f"(set in {mine})"
    assert f"did you mean {close}?" in lines


@pytest.mark.slow
def test_a_yaml_syntax_error_names_the_file_and_the_line(tmp_path: Path):
    mine = config(tmp_path, "trainer:\n  max_steps: 3\n bad: [1, 2\n")
    lines = refused(tmp_path, "-c", mine)
    assert lines[0] == "error: config: not valid YAML: did not find expected key (line 3, column 2)"
    assert lines[1].strip() == f"(in {mine})"


@pytest.mark.slow
def test_a_missing_config_file_is_named(tmp_path: Path):
    lines = refused(tmp_path, "-c", "nope.yaml")
    assert lines[0] == f"error: config: file does not exist: '{tmp_path / 'nope.yaml'}'"


# The real parser: the language model's command, in this process


def lm_refused(capsys: pytest.CaptureFixture, *args: object, subcommand: str = "fit") -> list[str]:
    """The stderr lines of ``language-model fit -c cpu.yaml -c smoke.yaml <args>`` (``args`` before ``fit`` when
    ``subcommand`` is None), refused by the app's own parser: exit status 2, one ``error:`` line first, no usage."""
    command = (
        [subcommand, "-c", CPU, "-c", LM_SMOKE, *args] if subcommand else [*args, "fit", "-c", CPU, "-c", LM_SMOKE]
    )
    error = refusal(capsys, lm_main, "language-model", *command)
    lines = error.splitlines()
    assert lines[0].startswith("error: ") and "usage:" not in error and "Traceback" not in error, error
    assert lines[-1] == "see: language-model fit --help", error
    return lines


def test_a_nested_literal_gives_the_full_path_and_the_values(capsys: pytest.CaptureFixture):
    lines = lm_refused(capsys, "--model.net.init_args.attention.kind=rcp")
    assert lines[:2] == [BAD_KIND, f"  {COMMAND_LINE}"] and len(lines) == 3


@pytest.mark.parametrize(
    ("option", "problem"),
    [
        ("--data.context=abc", "data.context: expected int, got 'abc'"),
        ("--trainer.limit_train_batches=abc", "trainer.limit_train_batches: expected float, int or None, got 'abc'"),
        ("--model.net.init_args.attention.lambd=abc", "model.net.init_args.attention.lambd: expected float or None, "
         "got 'abc'"),
    ],
)  # fmt: skip
def test_a_wrong_type_says_the_types_the_option_takes(capsys: pytest.CaptureFixture, option: str, problem: str):
    assert lm_refused(capsys, option) == [f"error: {problem}", f"  {COMMAND_LINE}", "see: language-model fit --help"]


def test_a_union_of_literals_says_its_values(capsys: pytest.CaptureFixture):
    lines = lm_refused(capsys, "--trainer.precision=33")
    assert lines[0].startswith("error: trainer.precision: '33' is not one of 64, 32, 16, ")
    assert "'bf16-mixed'" in lines[0] and lines[0].endswith(", None") and len(lines) == 3


def test_a_union_with_a_class_gives_the_class_problem_and_keeps_the_message(capsys: pytest.CaptureFixture):
    lines = lm_refused(capsys, "--lr_scheduler=torch.optim.lr_scheduler.StepLR")
    step_size = "the following arguments are required: step_size"
    assert lines[0] == f"error: lr_scheduler: class_path 'torch.optim.lr_scheduler.StepLR': {step_size}"
    assert any(line.strip().startswith("Subtypes: [") for line in lines)


def test_a_callable_class_argument_gets_its_init_args_path(capsys: pytest.CaptureFixture):
    lines = lm_refused(capsys, "--model.optimizer.init_args.lr=abc")
    assert lines[0] == "error: model.optimizer.init_args.lr: expected float or torch.Tensor, got 'abc'"
    assert "  - Expected a path but abc either not accessible or invalid" in lines  # the path alternative is news


def test_a_class_that_does_not_import(capsys: pytest.CaptureFixture):
    lines = lm_refused(capsys, "--model.net=foo.Bar")
    assert lines[0] == "error: model.net: class_path 'foo.Bar': No module named 'foo'"


def test_an_unknown_key_in_a_config_file_is_the_group_s_with_the_close_one(tmp_path: Path, capsys):
    flat = config(tmp_path, "data: {contxt: 3}\n")
    scoped = tmp_path / "scoped.yaml"
    scoped.write_text("fit:\n  data: {contxt: 3}\n")
    for lines, file in (
        (lm_refused(capsys, "-c", flat), flat),
        (lm_refused(capsys, "-c", scoped, subcommand=None), scoped),
    ):
        assert lines[:3] == [
            "error: data.contxt: Group 'data' does not accept option 'contxt'",
            f"  (set in {file})",
            "did you mean data.context?",
        ]


def test_an_option_before_the_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture):
    root = config(tmp_path, "trainer: {max_step: 3}\n")
    lines = lm_refused(capsys, "-c", root, subcommand=None)
    assert lines[:3] == [
        "error: trainer.max_step: not accepted before subcommand 'fit'",
        f"  (set in {root})",
        "did you mean trainer.max_steps?",
    ]


def test_an_unknown_key_of_a_class(capsys: pytest.CaptureFixture):
    lines = lm_refused(capsys, "--model.net.init_args.depthh=3")
    model = "kpca.language_model.model.CausalTransformerLM"
    assert lines[0] == f"error: model.net.init_args.depthh: {model} does not accept option 'depthh'"


def test_unrecognized_arguments_keep_the_spelling_typed(capsys: pytest.CaptureFixture):
    assert lm_refused(capsys, "--trainer.max_step=3")[:2] == [
        "error: unrecognized arguments: --trainer.max_step=3",
        "did you mean --trainer.max_steps?",
    ]
    nested = lm_refused(capsys, "--model.net.init_args.attention.kid=rcp")
    assert nested[0] == "error: unrecognized arguments: --model.net.init_args.attention.kid=rcp"


def test_config_file_problems(tmp_path: Path, capsys: pytest.CaptureFixture):
    broken = config(tmp_path, "trainer: [\n")
    assert lm_refused(capsys, "-c", broken)[:2] == [
        "error: config: not valid YAML: did not find expected node content (line 2, column 1)",
        f"  (in {broken})",
    ]
    scalar = config(tmp_path, "just a string\n")
    assert lm_refused(capsys, "-c", scalar)[0] == "error: config: not a YAML mapping of options: 'just a string'"
    missing = tmp_path / "nope.yaml"
    assert lm_refused(capsys, "-c", missing)[:2] == [
        f"error: config: file does not exist: '{missing}'",
        f"  {COMMAND_LINE}",
    ]


def test_other_messages_keep_their_text(capsys: pytest.CaptureFixture):
    assert lm_refused(capsys, "--trainer.max_steps")[0] == "error: trainer.max_steps: expected one argument"
    error = refusal(capsys, lm_main, "language-model").splitlines()
    assert error[0].startswith('error: expected "subcommand" to be one of {fit,'), error


def test_what_a_bad_value_should_be_comes_from_the_parser_s_type():
    """The values listed are the parser's Literal, not the ones jsonargparse's message happens to print."""
    parser = ProjectArgumentParser(exit_on_error=False)
    parser.add_argument("--net", type=_Net)
    parser.add_argument("--mode", type=Literal["fast", "exact"])
    message = "Parser key \"mode\":\n  Expected a typing.Literal['other']. Got value: slow"
    assert reshape(message, parser) == Refusal("mode", "'slow' is not one of 'fast', 'exact'")
    nested = (
        'Parser key "net":\n'
        f"  Problem with given class_path '{__name__}._Net':\n"
        '    Parser key "settings.lambd":\n'
        "      Expected a <class 'str'>. Got value: x"
    )
    assert reshape(nested, parser) == Refusal("net.init_args.settings.lambd", "expected float or None, got 'x'")
    assert reshape(nested) == Refusal("net.init_args.settings.lambd", "'x' is not accepted: Expected a <class 'str'>. "
                                      "Got value: x")  # fmt: skip


# Where a value came from, close options, the whole report


def test_origin_is_the_last_place_that_sets_the_key(tmp_path: Path):
    first = tmp_path / "first.yaml"
    first.write_text("model:\n  net:\n    init_args:\n      attention: {kind: rcp}\n")
    dotted = tmp_path / "dotted.yaml"
    dotted.write_text("model.net:\n  attention:\n    kind: rcp\n")  # dotted keys, init_args left out
    scoped = tmp_path / "scoped.yaml"
    scoped.write_text("fit:\n  trainer: {max_step: 3}\n")
    key = "model.net.init_args.attention.kind"
    assert origin(key, ["fit", "-c", str(first)]) == f"(set in {first})"
    assert origin(key, ["fit", f"--config={dotted}"]) == f"(set in {dotted})"
    assert origin(key, ["fit", "-c", str(first), "--model.net.attention.kind=rcp"]) == COMMAND_LINE
    assert origin(key, ["fit", "--model.net.attention.kind=rcp", "-c", str(first)]) == f"(set in {first})"
    assert origin("model.net", ["fit", "-c", str(first), "--model.net.class_path=foo.Bar"]) == COMMAND_LINE
    assert origin("trainer.max_step", ["-c", str(scoped), "fit"], subcommand="fit") == f"(set in {scoped})"
    assert origin("trainer.max_steps", ["fit", "-c", str(first)]) is None


def test_origin_of_a_config_problem_is_the_file(tmp_path: Path):
    good = tmp_path / "good.yaml"
    good.write_text("trainer: {max_steps: 3}\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer: [\n")
    assert config_files(["-c", str(good), "fit", "--config", str(broken), "--trainer.max_steps=3"]) == [
        str(good),
        str(broken),
    ]
    assert origin("config", ["fit", "-c", str(good), "-c", str(broken)]) == f"(in {broken})"
    assert origin("config", ["fit", "-c", str(good), "-c", str(tmp_path / "nope.yaml")]) == COMMAND_LINE


def test_suggestions_are_close_options_only():
    options = ["-h", "--trainer.max_steps", "--trainer.max_epochs", "--data.eval.subset"]
    found = suggestions(["--trainer.max_step", "data.eval_subst"], options)
    assert found == ["--trainer.max_steps", "data.eval.subset"]
    assert suggestions(["--trainer.foo", "nothing.close"], options) == []


def test_the_report_cuts_a_long_message():
    message = 'Parser key "x":\n' + "\n".join(f"  line {i}" for i in range(40))
    lines = error_report(reshape(message), [], "app fit").splitlines()
    assert lines[0] == "error: x: line 0"
    assert len(lines) == 1 + MAX_DETAIL_LINES + 1 and lines[-2] == "  ..." and lines[-1] == "see: app fit --help"


@dataclass
class _Settings:
    lambd: float | None = 1.0


class _Net:
    def __init__(self, settings: _Settings = _Settings()) -> None:  # noqa: B008 (a dataclass default)
        self.settings = settings


def test_nested_null_still_needs_the_fix():
    """``--net.init_args.settings.lambd=null``: jsonargparse 4.53 hands the class's parser ``lambd=None`` (``str`` of
    the value it loaded), which no ``float | None`` takes; ProjectArgumentParser reads it back as null. When the
    first half fails, jsonargparse passes null on itself and ``ProjectArgumentParser.parse_args`` can go."""
    args = [f"--net={__name__}._Net", "--net.init_args.settings.lambd=null"]
    plain = ArgumentParser(exit_on_error=False)
    plain.add_subclass_arguments(_Net, "net")
    with pytest.raises(ArgumentError, match="Given value: None"):
        plain.parse_args(args)
    ours = ProjectArgumentParser(exit_on_error=False)
    ours.add_subclass_arguments(_Net, "net")
    assert ours.parse_args(args).net.init_args.settings.lambd is None
