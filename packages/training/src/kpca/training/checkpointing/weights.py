"""Reading model weights from checkpoint files: safely (tensors, containers and ``argparse.Namespace`` only).

Understands Lightning checkpoints, DeiT's and timm's released files and the RPC authors' training files.
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import lightning.pytorch as pl
import torch

from kpca.training.errors import MissingPathError, OptionError

_PREFIXES = ("net.", "module.", "vit.", "model.")
# The one class unpickled beyond tensors and containers: DeiT's and the RPC authors' training checkpoints store their
# command line as ``"args": argparse.Namespace`` (rachtsy/KPCA_code Robust/main_train.py; facebookresearch/deit
# main.py).
_SAFE_CLASSES = (argparse.Namespace,)


def load_checkpoint_file(path: str | Path) -> object:
    """``torch.load`` a checkpoint safely: tensors, containers and ``argparse.Namespace`` only, on the CPU.

    ``weights_only=True`` refuses every pickled class outside PyTorch's allow-list, which includes the
    ``argparse.Namespace`` that DeiT's and the RPC authors' training files keep under ``"args"``; that one class
    is allowed for this call only (no global registration). Any other class is refused.

    Raises:
        FileNotFoundError: If ``path`` is not a file.
        ValueError: If the file holds pickled classes other than ``argparse.Namespace``, naming the file and them.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingPathError(f"init_from={str(path)!r} is not a file; pass a checkpoint path")
    with torch.serialization.safe_globals(list(_SAFE_CLASSES)):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            classes = torch.serialization.get_unsafe_globals_in_checkpoint(path)
            raise OptionError(
                f"init_from={str(path)!r} holds pickled classes {classes or '(see below)'} that are not loaded (only "
                "tensors, containers and argparse.Namespace are: unpickling other classes can run code). If you trust "
                "the file, save its model weights alone, e.g. torch.save(torch.load(path, weights_only=False)"
                "['model'], 'weights.pth'), and pass that file."
            ) from error


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The model tensors of a checkpoint file with timm ViT key names (``blocks.0.attn.qkv.weight``).

    Understands Lightning checkpoints (``state_dict`` with ``net.vit.`` prefixes), DeiT's released
    files (``{"model": ...}``), DeiT's and the RPC authors' training files (``model`` beside
    ``optimizer``, ``lr_scheduler``, ``epoch``, ``model_ema``, ``scaler`` and ``args``, an
    ``argparse.Namespace``), and bare state dicts, with or without ``module.`` prefixes. Files are
    read by :func:`load_checkpoint_file`.
    """
    raw = load_checkpoint_file(path)
    for key in ("state_dict", "model", "state_dict_ema"):
        if isinstance(raw, dict) and isinstance(raw.get(key), dict):
            raw = raw[key]
            break
    state = {}
    for key, value in raw.items():
        while key.startswith(_PREFIXES):
            key = key.split(".", 1)[1]
        if key.startswith("ema."):
            continue
        state[key] = value
    return state


def load_checkpoint_weights(model: pl.LightningModule, ckpt_path: str) -> int | None:
    """Load the weights of one of the app's checkpoints into ``model`` (safely: ``weights_only``); its step."""
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["state_dict"])
    return checkpoint.get("global_step")
