"""Lightning's console messages that no user of this project can act on, silenced one by one.

Each filter names the exact message and the Lightning module that prints it, so that every other warning, Lightning's
included, still shows. :func:`quiet_known_noise` holds those of every command; :func:`evaluation_quiet` the one that is
noise only where nothing is trained.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from lightning.fabric.utilities.warnings import PossibleUserWarning

LITLOGGER_TIP = "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"
"""The start of the advertisement Lightning logs on building any Trainer without a LitLogger."""
LEAF_SPEC = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
EVAL_MODULES = r"Found \d+ module\(s\) in eval mode at the start of training"
DIRPATH_CHANGED = r"The dirpath has changed from "


class _WithoutLitLoggerTip(logging.Filter):
    """Drops the litlogger tip (:data:`LITLOGGER_TIP`) from the log of Lightning's ``rank_zero_info``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(LITLOGGER_TIP)


_WITHOUT_LITLOGGER_TIP = _WithoutLitLoggerTip()


def quiet_known_noise() -> None:
    """Silence, for this process, the messages below that every command of the apps printed to no purpose.

    - "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger] ...": an
      advertisement for a hosted service, logged by Lightning (``lightning.pytorch.utilities.rank_zero``) on every
      Trainer without a LitLogger; Lightning has no switch for it. The apps log to TensorBoard.
    - "`isinstance(treespec, LeafSpec)` is deprecated, ..." (FutureWarning): torch 2.14 deprecates the ``LeafSpec``
      that Lightning 2.6.6 builds in ``lightning.pytorch.utilities._pytree`` whenever it combines a run's
      dataloaders. Lightning's code, not the user's, has to change.
    - "Found N module(s) in eval mode at the start of training" (PossibleUserWarning, ``lightning.pytorch.loops.
      fit_loop``): in the apps the only such modules are the vision module's EMA copy of the network (``ema.module``
      and its submodules, with ``model.ema_decay`` set), which timm's ModelEmaV3 keeps in eval mode on purpose: it is
      never run during training, only in validation, where Lightning puts every module in eval mode anyway.
      tests/training/test_quiet.py checks that no other module is in eval mode at fit start.

    Idempotent: each filter is added once however often this runs (warnings and logging drop duplicates).
    """
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_WITHOUT_LITLOGGER_TIP)
    warnings.filterwarnings(
        "ignore", LEAF_SPEC, category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree\Z"
    )
    warnings.filterwarnings(
        "ignore", EVAL_MODULES, category=PossibleUserWarning, module=r"lightning\.pytorch\.loops\.fit_loop\Z"
    )


@contextmanager
def evaluation_quiet() -> Iterator[None]:
    """Within: no "The dirpath has changed from ... won't be reloaded" (UserWarning).

    Lightning's ModelCheckpoint (``lightning.pytorch.callbacks.model_checkpoint``) says it whenever a checkpoint is
    loaded into another run folder than the one it was saved in: on every validate, test and predict with
    ``--ckpt_path``, which log into a new version folder. These save no checkpoint, so the best-k bookkeeping that is
    not reloaded is never used. ``fit --ckpt_path <file>`` keeps the message: that run continues its checkpointing in a
    new folder, its top-k afresh (``--ckpt_path auto`` resumes in the checkpoint's own folder).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", DIRPATH_CHANGED, category=UserWarning, module=r"lightning\.pytorch\.callbacks\.model_checkpoint\Z"
        )
        yield
