"""Optimizer helpers: decay / no-decay groups and the LambdaLR factors."""

import math

import pytest
import torch
from torch import nn

from kpca.training.optim import parameter_groups, polynomial, warmup_cosine


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(1, 4, 8))
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 2)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)

    def no_weight_decay(self) -> set[str]:
        return {"pos"}


def names(net: nn.Module, params) -> set[str]:
    by_id = {id(p): name for name, p in net.named_parameters()}
    return {by_id[id(p)] for p in params}


def test_parameter_groups_split_decay_and_no_decay():
    net = Net()
    decay, no_decay = parameter_groups(net)
    assert decay["name"] == "decay" and "weight_decay" not in decay  # the optimizer's weight decay applies
    assert no_decay["name"] == "no_decay" and no_decay["weight_decay"] == 0.0
    assert names(net, decay["params"]) == {"proj.weight", "head.weight"}
    assert names(net, no_decay["params"]) == {"pos", "proj.bias", "norm.weight", "norm.bias", "head.bias"}
    optimizer = torch.optim.AdamW([decay, no_decay], lr=1e-3, weight_decay=0.05)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.05, 0.0]


def test_parameter_groups_decay_everything_in_one_group():
    net = Net()
    (group,) = parameter_groups(net, decay_everything=True)
    assert group["name"] == "all" and "weight_decay" not in group
    assert names(net, group["params"]) == {n for n, p in net.named_parameters() if not n.startswith("frozen.")}


def test_warmup_cosine_from_start_to_floor():
    total, warmup, start, floor = 100, 10, 0.1, 0.05
    factor = warmup_cosine(total, warmup, start=start, floor=floor)
    assert factor(0) == pytest.approx(start)
    assert factor(5) == pytest.approx(start + (1 - start) * 0.5)
    assert factor(warmup) == pytest.approx(1.0)
    assert factor(55) == pytest.approx(floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factor(total) == pytest.approx(floor)
    after = [factor(step) for step in range(warmup, total + 1)]
    assert all(a > b for a, b in zip(after, after[1:], strict=False))
    assert factor(total + 1) == pytest.approx(floor) and factor(10 * total) == pytest.approx(floor)


def test_warmup_cosine_with_offset_trains_step_0():
    warmup = 4
    factor = warmup_cosine(20, warmup, warmup_offset=1)
    assert [factor(step) for step in range(warmup)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert factor(warmup) == pytest.approx(1.0)


def test_warmup_cosine_without_warmup_starts_at_the_peak():
    factor = warmup_cosine(10, 0, start=0.3)
    assert factor(0) == pytest.approx(1.0) and factor(10) == pytest.approx(0.0)


def test_polynomial():
    factor = polynomial(100, power=0.9, floor=0.01)
    assert factor(0) == pytest.approx(1.0)
    assert factor(50) == pytest.approx(0.99 * 0.5**0.9 + 0.01)
    assert factor(100) == pytest.approx(0.01) and factor(200) == pytest.approx(0.01)
