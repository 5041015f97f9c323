"""AttentionSpec: building modules, and use as a LightningCLI argument type."""

import re
import sys
from typing import Literal, get_args, get_type_hints

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.cli import LightningCLI

from kpca.attention import (
    AlphaAsymAttention,
    AttentionSpec,
    EllipticalAttention,
    NeuTRENOAttention,
    RPCAttention,
    ScaledAttention,
    SoftmaxAttention,
    TwicingAttention,
    register_attention_kind,
)
from kpca.attention import spec as spec_module
from kpca.attention.spec import kinds


def test_build_each_kind():
    assert not AttentionSpec().build(24, 3).symmetric
    assert AttentionSpec(kind="symmetric").build(24, 3, qkv_bias=True).symmetric
    rpc = AttentionSpec(kind="rpc", n_iter=2, lambd=3.0, convention="pcp").build(24, 3)
    assert isinstance(rpc, RPCAttention) and (rpc.n_iter, rpc.lambd, rpc.convention) == (2, 3.0, "pcp")
    assert isinstance(AttentionSpec(kind="softmax").build(24, 3), SoftmaxAttention)
    assert AttentionSpec(layers=[3, 1]).block_indices(4) == [1, 3]
    assert AttentionSpec().block_indices(3) == [0, 1, 2]


def test_every_kind_builds_its_module():
    expected = {
        "softmax": (SoftmaxAttention, False),
        "symmetric": (SoftmaxAttention, True),
        "rpc": (RPCAttention, True),
        "scaled_s": (ScaledAttention, False),
        "scaled_alpha": (AlphaAsymAttention, False),
        "twicing": (TwicingAttention, False),
        "neutreno": (NeuTRENOAttention, False),
        "elliptical": (EllipticalAttention, False),
    }
    assert set(kinds()) == set(expected)  # a new kind gets a row here
    for kind, (cls, symmetric) in expected.items():
        module = AttentionSpec(kind=kind, num_tokens=5 if kind == "scaled_s" else None).build(24, 3, qkv_bias=True)
        assert type(module) is cls and module.symmetric == symmetric and module.qkv.bias is not None, kind


def test_each_kind_has_its_settings_and_refuses_the_others():
    assert AttentionSpec(kind="neutreno").lambd is None  # what was chosen: nothing; the kind's default at build
    assert AttentionSpec(kind="neutreno").resolved().lambd == 0.6  # the papers' vision setting
    assert AttentionSpec(kind="neutreno").resolved("language").lambd == 0.4  # and their language setting
    assert AttentionSpec(kind="neutreno").build(24, 3).lambd == 0.6
    assert AttentionSpec(kind="neutreno").build(24, 3, task="language").lambd == 0.4
    assert AttentionSpec(kind="neutreno", lambd=0.5).build(24, 3, task="language").lambd == 0.5  # chosen wins
    assert AttentionSpec(kind="neutreno", lambd=0.0).resolved().lambd == 0.0  # softmax attention
    rpc = AttentionSpec(kind="rpc", n_iter=2)
    assert (rpc.n_iter, rpc.lambd, rpc.convention) == (2, None, None)  # never written back
    assert (rpc.resolved().n_iter, rpc.resolved().lambd, rpc.resolved().convention) == (2, 4.0, "reference")
    for kind in ("softmax", "symmetric", "scaled_alpha", "twicing"):  # they read no setting
        assert AttentionSpec(kind=kind).resolved() == AttentionSpec(kind=kind)
    assert AttentionSpec(kind="elliptical").resolved().convention == "causal"  # ours; "reference": the authors'
    with pytest.raises(ValueError, match="Elliptical's convention must be one of"):
        AttentionSpec(kind="elliptical", convention="pcp")
    with pytest.raises(ValueError, match="convention must be one of \\('reference', 'pcp'\\), got 'causal'"):
        AttentionSpec(kind="rpc", convention="causal")
    with pytest.raises(ValueError, match=r"lambd=0.6: lambd does not apply to kind 'twicing' .*read by rpc, neutreno"):
        AttentionSpec(kind="twicing", lambd=0.6)
    with pytest.raises(ValueError, match=r"n_iter=6: n_iter does not apply to kind 'neutreno' \(it reads lambd;"):
        AttentionSpec(kind="neutreno", n_iter=6)
    with pytest.raises(ValueError, match=r"n_iter=6: n_iter does not apply to kind 'symmetric'.*leave n_iter unset"):
        AttentionSpec(kind="symmetric", n_iter=6)
    with pytest.raises(ValueError, match="convention='pcp': convention does not apply to kind 'twicing'.*rpc, ellip"):
        AttentionSpec(kind="twicing", convention="pcp")
    with pytest.raises(ValueError, match="num_tokens=5: num_tokens does not apply to kind 'twicing'.*read by scaled_s"):
        AttentionSpec(kind="twicing", num_tokens=5)
    with pytest.raises(ValueError, match="lambd must be a finite float >= 0"):
        AttentionSpec(kind="neutreno", lambd=-0.1)
    with pytest.raises(ValueError, match="n_iter must be >= 1"):
        AttentionSpec(kind="rpc", n_iter=0)
    with pytest.raises(ValueError, match="task must be one of .*'vision', 'language'.*got 'audio'"):
        AttentionSpec(kind="neutreno").resolved("audio")


def test_saved_attention_of_older_configs_upgrades():
    """Configs and checkpoints saved when every kind held every setting load: unread former defaults are dropped."""
    saved_twicing = {"kind": "twicing", "n_iter": 4, "lambd": None, "layers": "all", "convention": "reference"}
    assert AttentionSpec(**spec_module.upgrade_saved_attention(saved_twicing)) == AttentionSpec(kind="twicing")
    saved_softmax = {"kind": "softmax", "n_iter": 4, "lambd": 4.0, "convention": "reference", "num_tokens": None}
    assert AttentionSpec(**spec_module.upgrade_saved_attention(saved_softmax)) == AttentionSpec()
    saved_rpc = {"kind": "rpc", "n_iter": 2, "lambd": 4.0, "convention": "reference", "layers": [0]}
    assert spec_module.upgrade_saved_attention(saved_rpc) == saved_rpc  # rpc reads them all: kept as saved
    chosen = {"kind": "symmetric", "n_iter": 6}  # not a former default: a choice, refused by the spec by name
    assert spec_module.upgrade_saved_attention(chosen) == chosen
    with pytest.raises(ValueError, match="n_iter does not apply to kind 'symmetric'"):
        AttentionSpec(**spec_module.upgrade_saved_attention(chosen))


def test_register_refuses_task_settings_of_no_setting_or_task(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(spec_module, "_REGISTRY", dict(spec_module._REGISTRY))
    build = spec_module.registered_kind("softmax").build
    with pytest.raises(ValueError, match="task_settings for kind 'odd' must be keyed by a task"):
        register_attention_kind("odd", task_settings={"language": {"lambd": 0.4}})(build)
    with pytest.raises(ValueError, match="task_settings for kind 'odd' must be keyed by a task"):
        register_attention_kind("odd", settings={"lambd": 1.0}, task_settings={"audio": {"lambd": 0.4}})(build)
    assert "odd" not in kinds()


@pytest.mark.parametrize("kind", ["neutreno", "elliptical"])
def test_per_block_neutreno_and_elliptical_give_the_other_blocks_softmax(kind):
    spec = AttentionSpec(kind=kind, layers=[2], backend="torch")
    assert spec.per_block(3) == [AttentionSpec(kind="softmax", backend="torch")] * 2 + [spec]


@pytest.mark.parametrize("layers", ["all", [2, 0]])
def test_per_block_rpc_makes_the_other_blocks_symmetric(layers):
    spec = AttentionSpec(kind="rpc", n_iter=2, layers=layers, backend="torch")
    blocks = spec.per_block(4)
    chosen = [0, 1, 2, 3] if layers == "all" else [0, 2]
    assert len(blocks) == 4
    assert all(blocks[i] is spec for i in chosen)
    rest = [b for i, b in enumerate(blocks) if i not in chosen]
    assert all(b == AttentionSpec(kind="symmetric", backend="torch") for b in rest)


@pytest.mark.parametrize("kind", ["softmax", "symmetric"])
def test_per_block_softmax_and_symmetric_leave_the_other_blocks(kind):
    spec = AttentionSpec(kind=kind, layers=[1])
    assert spec.per_block(3) == [None, spec, None]
    assert spec.per_block(3)[1] is spec
    everywhere = AttentionSpec(kind=kind)
    assert everywhere.per_block(2) == [everywhere, everywhere]
    with pytest.raises(ValueError, match=r"layers \[1\] out of range for a model with 1 blocks"):
        spec.per_block(1)


class TinyModel(pl.LightningModule):
    def __init__(self, attention: AttentionSpec = AttentionSpec(), width: int = 24) -> None:  # noqa: B008
        super().__init__()
        self.save_hyperparameters()
        self.attn = attention.build(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["tiny"])  # LightningCLI warns when pytest's argv meets args=


def test_lightning_cli_parses_spec(tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text("model:\n  attention:\n    kind: rpc\n    n_iter: 6\n    layers: [0]\n")
    cli = LightningCLI(
        TinyModel, args=["-c", str(config), "--model.attention.lambd=2.5", "--seed_everything=0"], run=False,
        trainer_defaults={"logger": False, "enable_checkpointing": False, "default_root_dir": str(tmp_path)},
    )  # fmt: skip
    assert AttentionSpec(**cli.model.hparams.attention) == AttentionSpec(kind="rpc", n_iter=6, lambd=2.5, layers=[0])
    assert isinstance(cli.model.attn, RPCAttention) and cli.model.attn.n_iter == 6


def test_lightning_cli_reports_bad_spec(capsys):
    with pytest.raises(SystemExit):
        LightningCLI(TinyModel, args=["--model.attention.kind=rcp", "--seed_everything=0"], run=False)
    assert "rcp" in capsys.readouterr().err


@pytest.fixture
def registry(monkeypatch):
    """The kind registry, restored after the test."""
    monkeypatch.setattr(spec_module, "_REGISTRY", dict(spec_module._REGISTRY))


def _plain(spec: AttentionSpec, dim: int, num_heads: int, **kwargs) -> torch.nn.Module:
    return SoftmaxAttention(dim, num_heads, backend=spec.backend, **kwargs)


def test_the_kinds_and_their_literal_come_from_the_registry():
    assert kinds() == (
        "softmax", "symmetric", "rpc", "scaled_s", "scaled_alpha", "twicing", "neutreno", "elliptical"
    )  # fmt: skip
    assert get_type_hints(AttentionSpec)["kind"] == Literal[kinds()]  # what LightningCLI reads
    others = {"rpc": "symmetric", "neutreno": "softmax", "elliptical": "softmax"}  # hand their values on
    assert all(spec_module.registered_kind(kind).others == others.get(kind) for kind in kinds())


@pytest.mark.usefixtures("registry")
def test_a_registered_kind_builds_and_is_a_cli_choice(tmp_path):
    register_attention_kind("plain_rest_symmetric", others="symmetric")(_plain)
    assert kinds()[-1] == "plain_rest_symmetric"
    assert "plain_rest_symmetric" in get_args(get_type_hints(AttentionSpec)["kind"])
    spec = AttentionSpec(kind="plain_rest_symmetric", layers=[1], backend="torch")
    assert type(spec.build(24, 3)) is SoftmaxAttention and not spec.build(24, 3).symmetric
    rest = AttentionSpec(kind="symmetric", backend="torch")
    assert spec.per_block(3) == [rest, spec, rest]
    cli = LightningCLI(
        TinyModel, args=["--model.attention.kind=plain_rest_symmetric", "--seed_everything=0"], run=False,
        trainer_defaults={"logger": False, "enable_checkpointing": False, "default_root_dir": str(tmp_path)},
    )  # fmt: skip
    assert type(cli.model.attn) is SoftmaxAttention


@pytest.mark.usefixtures("registry")
@pytest.mark.parametrize(
    ("name", "others", "match"),
    [
        ("rpc", None, r"attention kind 'rpc' is registered already \(by _rpc\)"),
        ("two words", None, "must be a Python identifier, got 'two words'"),
        ("fresh", "missing", r"others='missing' for kind 'fresh' is no registered kind; register it first"),
    ],
)
def test_a_bad_registration_names_the_problem(name, others, match):
    with pytest.raises(ValueError, match=match):
        register_attention_kind(name, others=others)(_plain)
    assert "fresh" not in kinds()


def test_an_unknown_kind_lists_the_registered_ones():
    listed = re.escape(str(kinds()))
    with pytest.raises(ValueError, match=f"kind must be one of {listed}, got 'rcp'; .*register_attention_kind"):
        AttentionSpec(kind="rcp")
