"""Which attention settings a kind typed by one word keeps: where each came from decides (attention_options)."""

from pathlib import Path

import pytest
from jsonargparse import Namespace

from kpca.training.attention_options import (
    DroppedSetting,
    attention_groups,
    drop_settings,
    settle_attention_groups,
    sources,
)

GROUP = ("model", "net", "init_args", "attention")
RPC_FILE = "model:\n  net:\n    init_args:\n      attention: {kind: rpc, n_iter: 2, layers: [0]}\n"


def parsed(kind: str, **settings) -> Namespace:
    """A parsed subcommand config with one attention group (every AttentionSpec field present, as parsed)."""
    fields = {"n_iter": None, "lambd": None, "convention": None, "num_tokens": None, "layers": "all"}
    attention = Namespace(kind=kind, backend="auto", **{**fields, **settings})
    return Namespace(model=Namespace(net=Namespace(class_path="Net", init_args=Namespace(attention=attention))))


@pytest.fixture
def rpc_file(tmp_path: Path) -> str:
    path = tmp_path / "rpc.yaml"
    path.write_text(RPC_FILE)
    return str(path)


def test_a_kind_typed_alone_drops_what_an_earlier_file_set_for_another_kind(rpc_file: str):
    config = parsed("twicing", n_iter=2)
    args = ["fit", "-c", rpc_file, "--model.net.init_args.attention.kind=twicing"]
    dropped = settle_attention_groups(config, args, "fit")
    assert dropped == [DroppedSetting(GROUP, "n_iter", 2, rpc_file, "twicing")]
    assert dropped[0].text == f"attention.n_iter=2 from {rpc_file} does not apply to twicing: dropped"
    assert config.model.net.init_args.attention.n_iter is None


@pytest.mark.parametrize(
    "switch",
    [
        ["--model.net.init_args.attention.kind", "twicing"],  # the value as the next word
        ["--model.net.init_args.attention={kind: twicing}"],  # the group, typed
        ["--model.net={init_args: {attention: {kind: twicing}}}"],  # a group above it
    ],
)
def test_every_spelling_of_the_switch_is_one(rpc_file: str, switch: list[str]):
    config = parsed("twicing", n_iter=2)
    assert [s.name for s in settle_attention_groups(config, ["fit", "-c", rpc_file, *switch], "fit")] == ["n_iter"]


def test_a_later_config_file_switches_too(rpc_file: str, tmp_path: Path):
    later = tmp_path / "neutreno.yaml"
    later.write_text("model:\n  net:\n    attention:\n      kind: neutreno\n")
    config = parsed("neutreno", n_iter=2)
    dropped = settle_attention_groups(config, ["fit", "-c", rpc_file, "-c", str(later)], "fit")
    assert [(s.name, s.where) for s in dropped] == [("n_iter", rpc_file)]


def test_a_setting_typed_on_the_command_line_for_a_kind_that_does_not_read_it_is_refused(rpc_file: str):
    config = parsed("twicing", lambd=0.5)
    args = [
        "fit",
        "-c",
        rpc_file,
        "--model.net.init_args.attention.kind=twicing",
        "--model.net.init_args.attention.lambd=0.5",
    ]
    with pytest.raises(ValueError) as refused:
        settle_attention_groups(config, args, "fit")
    message = str(refused.value)
    assert message.startswith("model.net.init_args.attention.lambd=0.5 (from the command line): lambd does not apply")
    assert "lambd is read by rpc, neutreno" in message and "Remove --model.net.init_args.attention.lambd" in message


def test_a_setting_in_the_file_that_chose_the_kind_is_a_mistake_in_that_file(tmp_path: Path):
    path = tmp_path / "twicing.yaml"
    path.write_text("model:\n  net:\n    init_args:\n      attention: {kind: twicing, lambd: 0.6}\n")
    with pytest.raises(ValueError, match=f"lambd=0.6 \\(from {path}\\).*Remove lambd from {path}"):
        settle_attention_groups(parsed("twicing", lambd=0.6), ["fit", "-c", str(path)], "fit")


def test_a_saved_config_of_before_each_kind_owned_its_settings_loads(tmp_path: Path):
    """A run's config.yaml saved when every kind held every setting: its former defaults are dropped."""
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  net:\n    init_args:\n      attention: {kind: symmetric, n_iter: 4, lambd: 4.0}\n")
    config = parsed("symmetric", n_iter=4, lambd=4.0, convention="reference")
    dropped = settle_attention_groups(config, ["fit", "-c", str(path)], "fit")
    assert [s.name for s in dropped] == ["n_iter", "lambd", "convention"]
    assert dropped[-1].where == "the defaults"  # convention: no argument set it


def test_each_attention_group_follows_the_rule_on_its_own(rpc_file: str):
    """Segmenter's decoder_attention is a group of its own: switching the encoder leaves it as it is."""
    config = parsed("twicing", n_iter=2)
    decoder = Namespace(**vars(config.model.net.init_args.attention))
    decoder.kind = "rpc"
    config.model.net.init_args.decoder_attention = decoder
    assert [g for g, _ in attention_groups(config)] == [GROUP, (*GROUP[:-1], "decoder_attention")]
    dropped = settle_attention_groups(
        config, ["fit", "-c", rpc_file, "--model.net.init_args.attention.kind=twicing"], "fit"
    )
    assert [s.group[-1] for s in dropped] == ["attention"]
    assert config.model.net.init_args.decoder_attention.n_iter == 2


def test_arguments_given_as_a_dict_are_one_source():
    given = {"fit": {"model": {"net": {"init_args": {"attention": {"kind": "twicing", "n_iter": 2}}}}}}
    with pytest.raises(ValueError, match="n_iter=2 \\(from the given arguments\\)"):
        settle_attention_groups(parsed("twicing", n_iter=2), given, "fit")


def test_a_config_file_before_the_subcommand_is_read_at_its_key(tmp_path: Path):
    path = tmp_path / "main.yaml"
    path.write_text("fit:\n" + "".join(f"  {line}\n" for line in RPC_FILE.splitlines()))
    (found,) = sources(["-c", str(path), "fit"], "fit")
    assert found.sets(GROUP, "n_iter") and not found.sets(GROUP, "lambd")


def test_drop_settings_repeats_the_drops_on_another_parse(rpc_file: str):
    config = parsed("twicing", n_iter=2)
    dropped = settle_attention_groups(
        config, ["fit", "-c", rpc_file, "--model.net.init_args.attention.kind=twicing"], "fit"
    )
    typed = parsed("twicing", n_iter=2)
    drop_settings(typed, dropped)
    assert typed.model.net.init_args.attention.n_iter is None


def test_a_kind_switched_at_a_checkpoint_drops_the_checkpoints_settings_even_those_the_new_kind_reads():
    """NeuTRENO's lambd 0.4 is no PAP sparsity weight: typing kind=rpc over the checkpoint leaves rpc's default."""
    trained = {"net": {"init_args": {"attention": {"kind": "neutreno", "lambd": 0.4, "layers": "all"}}}}
    config = parsed("rpc", lambd=0.4)
    dropped = settle_attention_groups(config, ["test", "--model.net.init_args.attention.kind=rpc"], "test", trained)
    assert [(s.name, s.where) for s in dropped] == [("lambd", "the checkpoint")]
    assert config.model.net.init_args.attention.lambd is None
    typed = parsed("rpc", lambd=2.0)  # a setting typed for the new kind stays
    args = ["test", "--model.net.init_args.attention.kind=rpc", "--model.net.init_args.attention.lambd=2.0"]
    assert settle_attention_groups(typed, args, "test", trained) == []
    same = parsed("neutreno", lambd=0.4)  # no switch: the checkpoint's settings run
    assert settle_attention_groups(same, ["test"], "test", trained) == []


def test_an_elliptical_config_saved_before_it_read_convention_runs_as_it_ran(tmp_path: Path):
    """Then every kind held ``convention: reference`` (the field's default); Elliptical read none and ran ours."""
    path = tmp_path / "config.yaml"
    path.write_text(
        "model:\n  net:\n    init_args:\n      attention: {kind: elliptical, n_iter: 4, convention: reference}\n"
    )
    config = parsed("elliptical", n_iter=4, convention="reference")
    dropped = settle_attention_groups(config, ["test", "-c", str(path)], "test")
    assert {s.name for s in dropped} == {"n_iter", "convention"}
    assert config.model.net.init_args.attention.convention is None  # ours, as it ran
    (saved_before,) = [s for s in dropped if s.saved_before]
    assert saved_before.text.endswith(
        "is the former default of a config saved before elliptical read convention: dropped"
    )
    chosen = parsed("elliptical", convention="reference")  # saved now: no unread setting, a choice
    assert settle_attention_groups(chosen, ["test"], "test") == []
    assert chosen.model.net.init_args.attention.convention == "reference"
