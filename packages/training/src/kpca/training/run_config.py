"""A run's saved configuration (the ``config.yaml`` LightningCLI writes): its settings by dotted key.

Two callers compare saved configurations and each ignores its own run-specific keys: resuming
(:class:`kpca.training.cli.ProjectCLI`) ignores what resuming itself sets, ``kpca-report``
(:mod:`kpca.training.results`) also the seed and the output folders. Both strip them with :func:`without_keys`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping


def without_keys(config: Mapping, dotted_keys: Iterable[str]) -> dict:
    """A deep copy of ``config`` without the settings at ``dotted_keys``, e.g. ``trainer.logger.init_args.version``.

    A key whose parents are absent or not mappings (``trainer.logger: null``) is skipped: there is nothing to
    remove. ``config`` itself is left as it is.

    Args:
        config: a nested mapping, e.g. a loaded ``config.yaml``.
        dotted_keys: the settings to remove, each as its path of keys joined by ``.``.

    Returns:
        The copy, as a dict.
    """
    stripped = copy.deepcopy(dict(config))
    for dotted in dotted_keys:
        *parents, last = dotted.split(".")
        node: object = stripped
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return stripped


def config_value(config: Mapping, dotted_key: str) -> object:
    """The setting at ``dotted_key`` of a saved config, looking through ``init_args`` as the CLI's options do.

    ``model.evaluator.report_name`` finds ``model: {evaluator: {class_path: ..., init_args: {report_name: x}}}``,
    the form LightningCLI saves a class-typed argument in, as well as ``model: {evaluator: {report_name: x}}``.

    Args:
        config: a nested mapping, e.g. a loaded ``config.yaml``.
        dotted_key: the setting's path of keys joined by ``.``.

    Returns:
        The value, or None when the config does not set it.
    """
    node: object = config
    for key in dotted_key.split("."):
        if isinstance(node, Mapping) and key not in node and isinstance(node.get("init_args"), Mapping):
            node = node["init_args"]
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node
