"""A refused command starts with one ``error: <option path>: <what is wrong>`` line, says where the value came from,
and prints no usage (kpca.training.parser).

The CLI tests run the real console script as a user types it; the unit tests feed :func:`reshape` jsonargparse's
real messages (jsonargparse 4.53, captured from ``vision-cls fit``).
"""

from __future__ import annotations

import subprocess
import sys
from argparse import ArgumentError
from dataclasses import dataclass
from pathlib import Path

import pytest
from jsonargparse import ArgumentParser

from kpca.attention.spec import kinds
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
from tests.cli_support import CONFIGS, CPU

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
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


# reshape: jsonargparse's messages


def test_a_nested_literal_gives_the_full_path_and_the_values():
    message = (
        'Parser key "model.net":\n'
        "  Problem with given class_path 'kpca.vision_cls.model.ViTClassifier':\n"
        '    Parser key "attention.kind":\n'
        f"      Expected a typing.Literal[{KINDS}]. Got value: rcp"
    )
    refusal = reshape(message)
    assert refusal.first_line() == BAD_KIND
    assert refusal.details is None


def test_a_wrong_type():
    refusal = reshape("Parser key \"trainer.max_steps\":\n  Expected a <class 'int'>. Got value: abc")
    assert refusal == Refusal("trainer.max_steps", "expected int, got 'abc'")


def test_a_plain_union_says_its_types():
    message = (
        'Parser key "data.eval.subset":\n'
        "  Does not validate against any of the Union subtypes\n"
        "  Subtypes: [<class 'int'>, <class 'NoneType'>]\n"
        "  Errors:\n"
        "    - Expected a <class 'int'>\n"
        "    - Expected a <class 'NoneType'>\n"
        "  Given value type: <class 'str'>\n"
        "  Given value: abc"
    )
    assert reshape(message) == Refusal("data.eval.subset", "expected int or None, got 'abc'")


def test_a_union_of_literals_says_its_values():
    message = (
        'Parser key "trainer.precision":\n'
        "  Does not validate against any of the Union subtypes\n"
        "  Subtypes: [typing.Literal[64, 32, 16], typing.Literal['16-mixed', 'bf16-mixed'], <class 'NoneType'>]\n"
        "  Errors:\n"
        "    - Expected a typing.Literal[64, 32, 16]\n"
        "    - Expected a typing.Literal['16-mixed', 'bf16-mixed']\n"
        "    - Expected a <class 'NoneType'>\n"
        "  Given value type: <class 'str'>\n"
        "  Given value: 33"
    )
    refusal = reshape(message)
    assert refusal.path == "trainer.precision"
    assert refusal.problem == "'33' is not one of 64, 32, 16, '16-mixed', 'bf16-mixed', None"
    assert refusal.details is None


def test_a_union_with_a_class_gives_the_class_problem_and_keeps_the_message():
    message = (
        'Parser key "lr_scheduler":\n'
        "  Does not validate against any of the Union subtypes\n"
        "  Subtypes: [<class 'torch.optim.lr_scheduler.LRScheduler'>, <class 'NoneType'>]\n"
        "  Errors:\n"
        "    - Problem with given class_path 'torch.optim.lr_scheduler.StepLR':\n"
        "        the following arguments are required: step_size\n"
        "    - Expected a <class 'NoneType'>\n"
        "  Given value type: <class 'jsonargparse._namespace.Namespace'>\n"
        "  Given value: Namespace(class_path='torch.optim.lr_scheduler.StepLR', init_args=Namespace(step_size=None))"
    )
    refusal = reshape(message)
    assert refusal.path == "lr_scheduler"
    assert refusal.problem == (
        "class_path 'torch.optim.lr_scheduler.StepLR': the following arguments are required: step_size"
    )
    assert "Subtypes:" in refusal.details


def test_a_callable_class_argument_gets_its_init_args_path():
    message = (
        'Parser key "model.optimizer":\n'
        "  Type typing.Callable[[collections.abc.Iterable], torch.optim.optimizer.Optimizer] expects a function or a "
        'callable class: Parser key "lr":\n'
        "\n"
        "    - Expected a path but abc either not accessible or invalid\n"
        "    - Does not validate against any of the Union subtypes\n"
        "    Subtypes: [<class 'float'>, <class 'torch.Tensor'>]\n"
        "    Errors:\n"
        "      - Expected a <class 'float'>\n"
        "      - Expected a dot import path string: abc\n"
        "    Given value type: <class 'str'>\n"
        "    Given value: abc. Got value: Namespace(class_path='torch.optim.AdamW', init_args=Namespace(lr='abc'))"
    )
    refusal = reshape(message)
    assert refusal.first_line() == "error: model.optimizer.init_args.lr: expected float or torch.Tensor, got 'abc'"
    assert refusal.details.startswith("- Expected a path but abc")  # the path alternative is news


def test_a_class_that_does_not_import():
    message = "Parser key \"model.net\":\n  Problem with given class_path 'foo.Bar':\n    No module named 'foo'"
    assert reshape(message) == Refusal("model.net", "class_path 'foo.Bar': No module named 'foo'")


@pytest.mark.parametrize(
    ("message", "path", "problem", "subcommand"),
    [
        ("Subcommand 'fit' does not accept option 'data.eval_subst'", "data.eval_subst",
         "Group 'data' does not accept option 'eval_subst'", "fit"),
        ("Subcommand 'fit' does not accept option 'foo'", "foo",
         "Subcommand 'fit' does not accept option 'foo'", "fit"),
        ("Group 'trainer' does not accept option 'max_step'", "trainer.max_step",
         "Group 'trainer' does not accept option 'max_step'", None),
        ("Option 'trainer.max_step' is not accepted before subcommand 'fit'", "trainer.max_step",
         "not accepted before subcommand 'fit'", "fit"),
    ],
)  # fmt: skip
def test_an_unknown_key(message: str, path: str, problem: str, subcommand: str | None):
    assert reshape(message) == Refusal(path, problem, unknown=(path,), subcommand=subcommand)


def test_an_unknown_key_of_a_class():
    message = (
        'Parser key "model.net":\n'
        "  Problem with given class_path 'kpca.vision_cls.model.ViTClassifier':\n"
        "    Option 'depthh' is not accepted"
    )
    refusal = reshape(message)
    assert refusal.path == "model.net.init_args.depthh"
    assert refusal.problem == "kpca.vision_cls.model.ViTClassifier does not accept option 'depthh'"


def test_unrecognized_arguments_keep_the_spelling_typed():
    assert reshape("unrecognized arguments: --trainer.max_step=3 extra") == Refusal(
        None, "unrecognized arguments: --trainer.max_step=3 extra", unknown=("--trainer.max_step",)
    )
    nested = (
        'Parser key "model.net":\n'
        "  Problem with given class_path 'kpca.vision_cls.model.ViTClassifier':\n"
        "    unrecognized arguments: --attention.kid=rcp"
    )
    assert reshape(nested).first_line() == "error: unrecognized arguments: --model.net.init_args.attention.kid=rcp"


def test_config_file_problems():
    syntax = (
        "Problems parsing config: while parsing a block mapping\n"
        '  in "<unicode string>", line 1, column 1\n'
        "did not find expected key\n"
        '  in "<unicode string>", line 3, column 2'
    )
    assert reshape(syntax) == Refusal("config", "not valid YAML: did not find expected key (line 3, column 2)")
    missing = "Parser key \"config\": File does not exist: '/tmp/nope.yaml'"
    assert reshape(missing) == Refusal("config", "file does not exist: '/tmp/nope.yaml'")
    scalar = "Unexpected config: just a string\n"
    assert reshape(scalar) == Refusal("config", "not a YAML mapping of options: 'just a string'")


def test_other_messages_keep_their_text():
    assert reshape("argument --trainer.max_steps: expected one argument") == Refusal(
        "trainer.max_steps", "expected one argument"
    )
    no_subcommand = 'expected "subcommand" to be one of {fit,validate}, but it was not provided.'
    assert reshape(no_subcommand) == Refusal(None, no_subcommand)


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
