"""NetModule's ``compile`` option: parsed, never saved, applied in place once; compiled attention matches eager.

The numerical test compiles (Inductor, CPU) one tiny network holding a layer of every attention kind, so the
five kinds cost one forward and one backward compile.
"""

import pytest
import torch
from torch import nn

from kpca.attention import AttentionSpec
from kpca.attention.spec import registered_kind
from kpca.training.module import CompileOptions, NetModule, compile_options

WIDTH, HEADS, TOKENS = 32, 2, 16
KINDS = ("softmax", "symmetric", "rpc", "scaled_s", "scaled_alpha")
# float32, eps 1.2e-7: Inductor fuses kernels and reorders their sums (softmax, matmul epilogues, reductions in the
# backward), so results move by a few ulps per op. Through five layers (PAP: 3 evaluations) and the backward, with
# gradients of size 1-10 here, the worst element measured 3.8e-6 apart, a tenth of this tolerance; a lost term
# or mask moves them by 1e-2 or more (1 % of alpha moves the loss by 2e-2).
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


class Module(NetModule):
    def __init__(self, net: nn.Module, optimizer=sgd, compile: bool | CompileOptions = False) -> None:
        super().__init__(net, optimizer, compile)


def _read_by(kind: str, settings: dict) -> dict:
    """The ``settings`` that ``kind`` reads (a spec refuses the others)."""
    return {name: value for name, value in settings.items() if name in registered_kind(kind).settings}


class EveryKind(nn.Module):
    """One residual layer of each attention kind in a row, (B, N, C) -> (B, N, C)."""

    def __init__(self) -> None:
        super().__init__()
        settings = {"n_iter": 3, "lambd": 0.3, "num_tokens": TOKENS}
        specs = [AttentionSpec(kind=kind, **_read_by(kind, settings)) for kind in KINDS]
        self.layers = nn.ModuleList(spec.build(WIDTH, HEADS, qkv_bias=True) for spec in specs)
        with torch.no_grad():  # S and alpha start at 0 (plain softmax): give the scaled kinds their extra term
            self.layers[3].s_matrix.normal_(std=0.1)
            self.layers[4].alpha.fill_(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return x


def loss_and_grads(net: nn.Module, x: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    """The weighted output sum and its gradients with respect to the input and every parameter."""
    x = x.clone().requires_grad_(True)
    loss = (net(x) * weights).sum()
    return [loss, *torch.autograd.grad(loss, [x, *net.parameters()])]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (False, None),
        (True, CompileOptions()),
        (CompileOptions(mode="max-autotune", dynamic=False), CompileOptions(mode="max-autotune", dynamic=False)),
    ],
)
def test_compile_options(given, expected):
    assert compile_options(given) == expected


def test_compile_options_refuse_other_values():
    with pytest.raises(TypeError, match="--model.compile true"):
        compile_options("yes")


def test_compile_is_never_saved_in_the_hyperparameters():
    module = Module(nn.Linear(3, 1), compile=True)
    assert "compile" not in module.hparams and module.compile_options == CompileOptions()


def test_off_leaves_the_network_as_it_is():
    net = nn.Linear(3, 1)
    Module(net).configure_model()
    assert "forward" not in vars(net)


def test_configure_model_compiles_the_network_in_place_once():
    net = nn.Linear(3, 1)
    keys = list(net.state_dict())
    module = Module(net, compile=CompileOptions(dynamic=False))
    module.configure_model()
    compiled = vars(net)["forward"]
    assert compiled._torchdynamo_orig_callable.__name__ == "forward"  # a torch.compile wrapper of forward
    module.configure_model()  # Lightning calls it at every stage
    assert vars(net)["forward"] is compiled and module.net is net
    assert list(module.state_dict()) == [f"net.{key}" for key in keys]  # no `_orig_mod.`


def test_every_attention_kind_traces_without_graph_breaks():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(EveryKind())(torch.randn(2, TOKENS, WIDTH))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.slow
def test_compiled_attention_kinds_match_eager_forward_and_backward():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    net = EveryKind()
    x, weights = torch.randn(2, TOKENS, WIDTH), torch.randn(2, TOKENS, WIDTH)
    eager = loss_and_grads(net, x, weights)
    Module(net, compile=True).configure_model()
    compiled = loss_and_grads(net, x, weights)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # it did compile, in one graph
    for c, e in zip(compiled, eager, strict=True):
        torch.testing.assert_close(c, e, **TOLERANCE)
