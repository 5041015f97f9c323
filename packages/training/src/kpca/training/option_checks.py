"""Option values that torch or Lightning would refuse deep inside a run, checked where the CLI builds them.

Each check runs before anything is built (``ProjectCLI.before_instantiate_classes``) and ends in one
:class:`~kpca.training.errors.OptionError` naming the option as typed, its value and the fix: the optimizer's
arguments are given to the optimizer class itself on one stand-in parameter, so that torch's own range checks (``lr``,
``betas``, ``weight_decay``, ``eps``, ...) speak; Lightning's refusal of a Trainer argument
(``MisconfigurationException``) is turned into the same one line (:func:`refused_trainer_options`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

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
    """The one-line error for a Trainer argument that Lightning refused (its ``MisconfigurationException``)."""
    return OptionError(
        f"the trainer options are refused by Lightning: {str(error).strip()} Set the --trainer option it names "
        "(the app's fit --help lists them)."
    )
