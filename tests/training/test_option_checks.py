"""kpca.training.option_checks: the optimizer's own range checks, run on the configured group before any work."""

import pytest
from jsonargparse import Namespace

from kpca.training.option_checks import check_optimizer


@pytest.mark.parametrize(
    ("init_args", "reason"),
    [
        ({"lr": -0.001}, "Invalid learning rate: -0.001"),
        ({"lr": 0.001, "betas": [0.9, 1.5]}, "Invalid beta parameter at index 1: 1.5"),
        ({"lr": 0.001, "weight_decay": -0.05}, "Invalid weight_decay value: -0.05"),
        ({"lr": 0.001, "no_such_argument": 1}, "unexpected keyword argument 'no_such_argument'"),
    ],
)
def test_an_optimizer_group_its_class_refuses_is_named_with_torchs_reason(init_args: dict, reason: str):
    group = Namespace(class_path="torch.optim.AdamW", init_args=Namespace(**init_args))
    with pytest.raises(
        ValueError, match=rf"^model\.optimizer \(torch\.optim\.AdamW\) refuses its arguments: .*{reason}"
    ):
        check_optimizer(group)


def test_a_valid_group_a_function_and_nothing_pass():
    check_optimizer({"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1, "momentum": 0.9}})
    check_optimizer(print)  # a function (Segmenter's optimizer factory): built by the module, not here
    check_optimizer(None)
