"""kpca.training.option_checks: the optimizer's own range checks, run on the configured group before any work, and
the ranges of the Trainer arguments and the seed that Lightning takes unchecked."""

import pytest
from jsonargparse import Namespace

from kpca.training.errors import OptionError
from kpca.training.option_checks import SEED_RANGE, TRAINER_RANGES, check_optimizer, check_seed, check_trainer_options


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


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("accumulate_grad_batches", 0),
        ("num_nodes", 0),
        ("log_every_n_steps", 0),
        ("check_val_every_n_epoch", 0),
        ("val_check_interval", -1),
        ("val_check_interval", 1.5),
        ("gradient_clip_val", -0.25),
        ("limit_train_batches", -1),
        ("limit_val_batches", 2.5),
    ],
)
def test_a_trainer_argument_out_of_range_is_named_with_its_range(name: str, value: object):
    with pytest.raises(OptionError, match=rf"^--trainer\.{name}={value!r} is out of range: it must be "):
        check_trainer_options(Namespace(**{name: value}))


def test_trainer_arguments_in_range_pass():
    check_trainer_options(
        Namespace(
            accumulate_grad_batches=1,
            val_check_interval=0.5,
            check_val_every_n_epoch=None,
            gradient_clip_val=None,
            limit_train_batches=1.0,
            limit_val_batches=0,
            limit_test_batches=10,
            limit_predict_batches=2.0,  # the parser's float for a typed 2: two batches, as Lightning reads it
        )
    )
    assert set(TRAINER_RANGES) >= {"limit_predict_batches", "num_nodes", "log_every_n_steps"}


def test_a_seed_numpy_cannot_take_is_refused():
    low, high = SEED_RANGE
    for seed in (low, high, True, False, None):
        check_seed(seed)
    for seed in (low - 1, high + 1):
        with pytest.raises(OptionError, match=rf"^--seed_everything={seed} is out of range"):
            check_seed(seed)
