"""The ``data.eval`` option group: the corrupted test sets of ADE20KDataModule, and the size of every evaluation set.

In a config file::

    data:
      eval:
        corruption_preset: elliptical
        corruptions: [gaussian_noise, fog]
        severities: [1, 2, 3]
        corruption_seed: 0
        subset: 100

and on the command line ``--data.eval.corruption_preset=elliptical``. :class:`EvalData` holds these options and
knows the test sets they give (:meth:`EvalData.eval_sets`, one per test dataloader);
:class:`~kpca.segmentation.data.ADE20KDataModule` builds the loaders. ``corruptions``, ``severities`` and ``subset``
are spelt as in vision-cls's ``data.eval`` group.
"""

from __future__ import annotations

from dataclasses import dataclass

from kpca.segmentation.corruption_sets import CorruptionPreset, CorruptionSet, resolve_corruption_set
from kpca.training.eval_subset import check_eval_subset


@dataclass(frozen=True)
class EvalData:
    """The corrupted test sets of the ``test`` stage, and the size of every evaluation set.

    Args:
        corruption_preset: The corrupted test sets (:mod:`kpca.segmentation.corruption_sets`): ``imagenet-c`` (the 15
            ImageNet-C corruptions x severities 1-5) or ``elliptical`` (the group's ADE20K-C harness: 19 corruptions x
            severities 1-3).
        corruptions: ``imagecorruptions`` names replacing the preset's (None: the preset's; ``[]``: clean only).
        severities: Severities in 1-5 replacing the preset's (None: the preset's).
        corruption_seed: Base seed of the corruptions (each image's seed hashes it with the corruption, severity and
            file name: :class:`~kpca.segmentation.data.CorruptImage`).
        subset: Use only this many validation images, evenly spaced, in every evaluation set (validation, test and
            predict loaders); None uses all. For quick runs.
    """

    corruption_preset: CorruptionPreset = "imagenet-c"
    corruptions: tuple[str, ...] | None = None
    severities: tuple[int, ...] | None = None
    corruption_seed: int = 0
    subset: int | None = None

    def __post_init__(self) -> None:
        for name in ("corruptions", "severities"):  # lists from Python callers
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        check_eval_subset(self.subset)
        resolve_corruption_set(self.corruption_preset, self.corruptions, self.severities)  # raises on a bad value

    @property
    def corruption_set(self) -> CorruptionSet:
        """The corruptions and severities tested: the preset's, each list replaced where given."""
        return resolve_corruption_set(self.corruption_preset, self.corruptions, self.severities)

    def eval_sets(self) -> list[tuple[str, str | None, int | None]]:
        """The test sets, in the order of the test dataloaders: the clean set, then :attr:`corruption_set`'s pairs.

        Returns:
            ``(name, corruption, severity)`` per set: ``("clean", None, None)``, then ``(f"{c}/s{s}", c, s)`` for
            each pair, corruption-major.
        """
        corrupted = [(f"{c}/s{s}", c, s) for c, s in self.corruption_set.pairs()]
        return [("clean", None, None), *corrupted]
