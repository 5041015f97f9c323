"""``data.eval.subset``, the evaluation subset of both image apps: its check and its protocol setting.

Each image app's ``data.eval`` group has ``subset``: use only this many images of every evaluation set (validation,
test and predict loaders), spread evenly over the set (:func:`kpca.training.data.evenly_spaced`); None uses all.
"""

from __future__ import annotations

from kpca.training.errors import OptionError
from kpca.training.results.protocol import Setting

EVAL_SUBSET = Setting(
    "data.eval.subset", None, name="eval.subset", published_text="null (every image)", old_key="data.eval_subset"
)
"""Every image of each evaluation set (configs saved before ``data.eval`` name it ``data.eval_subset``)."""


def check_eval_subset(subset: int | None) -> None:
    """Refuse a ``data.eval.subset`` that is neither None nor positive.

    Raises:
        OptionError: naming the value and the fix.
    """
    if subset is not None and subset < 1:
        raise OptionError(f"data.eval.subset={subset} must be positive, or None to evaluate on all images.")
