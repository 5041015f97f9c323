"""Option values that torch or Lightning would refuse deep inside a run, checked where the CLI builds them.

Each check runs before anything is built (``ProjectCLI.before_instantiate_classes``) and ends in one
:class:`~kpca.training.errors.OptionError` naming the option as typed, its value and the fix: the optimizer's
arguments are given to the optimizer class itself on one stand-in parameter, so that torch's own range checks (``lr``,
``betas``, ``weight_decay``, ``eps``, ...) speak; Lightning's refusal of a Trainer argument
(``MisconfigurationException``) is turned into the same one line (:func:`refused_trainer_options`); the Trainer
arguments that Lightning takes without a check and that fail later (a division by zero, a silent no-op) are checked
against their ranges here (:func:`check_trainer_options`), as is ``seed_everything`` (:func:`check_seed`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

import torch

from kpca.training.checkpointing.trained_options import plain
from kpca.training.errors import OptionError


def check_optimizer(group: object, option: str = "model.optimizer") -> None:
    """Refuse an optimizer group (``class_path`` and ``init_args``) whose arguments its class refuses.

    Args:
        group: the configured optimizer: a ``{"class_path": ..., "init_args": ...}`` group (checked) or anything
            else (a function, None: left alone).
        option: the option's name, for the message.

    Raises:
        ValueError: naming the option, its arguments and torch's reason, when the class refuses them.
    """
    group = plain(group)
    if not isinstance(group, Mapping) or not isinstance(group.get("class_path"), str):
        return
    class_path, init_args = group["class_path"], dict(group.get("init_args") or {})
    module, _, name = class_path.rpartition(".")
    try:
        optimizer_class = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return  # the parser names a class path that does not import
    try:
        optimizer_class([torch.nn.Parameter(torch.zeros(1))], **init_args)
    except (ValueError, TypeError) as error:
        raise OptionError(
            f"{option} ({class_path}) refuses its arguments: {error}; set the init_args value it names, e.g. "
            f"--{option}.init_args.lr=0.001"
        ) from error


def refused_trainer_options(error: Exception) -> OptionError:
    """The one-line error for a Trainer argument that Lightning refused while building the Trainer.

    Lightning refuses with a ``MisconfigurationException`` or a ``ValueError`` (``num_nodes``, ``devices``).
    """
    return OptionError(
        f"the trainer options are refused by Lightning: {str(error).strip()} Set the --trainer option it names "
        "(the app's fit --help lists them)."
    )


def _count(low: int) -> Callable[[object], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= low


def _whole(value: object) -> bool:
    """A whole float above 1, which Lightning reads as that many batches (the parser may give ``2.0`` for ``2``)."""
    return isinstance(value, float) and value > 1.0 and value.is_integer()


def _batches(value: object) -> bool:
    """A number of batches (an int >= 0) or a fraction of them (a float in [0, 1])."""
    return _count(0)(value) or _whole(value) or (isinstance(value, float) and 0.0 <= value <= 1.0)


def _interval(value: object) -> bool:
    """A number of batches (an int >= 1) or a fraction of an epoch (a float in (0, 1])."""
    return _count(1)(value) or _whole(value) or (isinstance(value, float) and 0.0 < value <= 1.0)


TRAINER_RANGES: dict[str, tuple[Callable[[object], bool], str]] = {
    "accumulate_grad_batches": (_count(1), "an integer >= 1 (1: a step per batch)"),
    "num_nodes": (_count(1), "an integer >= 1"),
    "log_every_n_steps": (_count(1), "an integer >= 1"),
    "check_val_every_n_epoch": (lambda value: value is None or _count(1)(value), "an integer >= 1 or null"),
    "val_check_interval": (
        lambda value: value is None or _interval(value),
        "a fraction of an epoch in (0, 1], a number of batches >= 1, or null",
    ),
    "gradient_clip_val": (
        lambda value: value is None or (isinstance(value, (int, float)) and value >= 0),
        "a number >= 0, or null for no clipping",
    ),
    **{
        f"limit_{stage}_batches": (
            lambda value: value is None or _batches(value),
            "a fraction in [0, 1], a number of batches >= 0, or null",
        )
        for stage in ("train", "val", "test", "predict")
    },  # fmt: skip
}
"""Trainer arguments Lightning does not check, each with its test and the range its message names."""


def check_trainer_options(trainer: Mapping) -> None:
    """Refuse a Trainer argument out of its range (:data:`TRAINER_RANGES`), naming ``--trainer.<name>``.

    Raises:
        OptionError: the first argument out of range, its value and the range.
    """
    for name, (accepts, accepted) in TRAINER_RANGES.items():
        if name in trainer and not accepts(trainer[name]):
            raise OptionError(f"--trainer.{name}={trainer[name]!r} is out of range: it must be {accepted}.")


SEED_RANGE = (0, 2**32 - 1)
"""The seeds ``seed_everything`` takes (numpy's)."""


def check_seed(seed: object) -> None:
    """Refuse a ``seed_everything`` that Lightning's ``seed_everything`` would refuse with a traceback.

    Raises:
        OptionError: an integer seed outside :data:`SEED_RANGE`.
    """
    low, high = SEED_RANGE
    if isinstance(seed, int) and not isinstance(seed, bool) and not low <= seed <= high:
        raise OptionError(
            f"--seed_everything={seed} is out of range: a seed is an integer in [{low}, {high}], or true for a "
            "random one (recorded in the run's config.yaml)."
        )
