"""Named ADE20K-C evaluation sets: which ``imagecorruptions`` corruptions, at which severities, ``test`` evaluates.

Presets (``data.eval.corruption_preset``, :data:`CorruptionPreset`; their sets in :data:`CORRUPTION_PRESETS`):

* ``imagenet-c`` (the default): the 15 ImageNet-C benchmark corruptions (Hendrycks & Dietterich) at severities 1-5,
  75 sets, as shared/paper.md describes the paper's corrupted ADE20K.
* ``elliptical``: the set of the group's ADE20K-C harness (KurtPask/Elliptical-Attention ``ADE20K/test_city_c.py``
  lines 93-105, from NVlabs/FAN): all 19 ``imagecorruptions`` corruptions (the 15 plus ``speckle_noise``,
  ``gaussian_blur``, ``saturate`` and ``spatter``) at severities 1-3, 57 sets, in that file's order.

Both are applied on the fly to the original validation images (:class:`kpca.segmentation.data.CorruptImage`). The
group's harness reads copies made offline instead (``gen_city_c.py``); the differences that remain are listed in the
README's protocols table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kpca.training.choices import check_choice, choices
from kpca.training.errors import OptionError
from kpca.training.images.corruptions import IMAGENET_C_CORRUPTIONS, IMAGENET_C_SEVERITIES, check_corruptions

ELLIPTICAL_CORRUPTIONS: tuple[str, ...] = (
    *("gaussian_noise", "shot_noise", "speckle_noise", "impulse_noise"),  # noise_list
    *("zoom_blur", "elastic_transform"),  # extra
    *("gaussian_blur", "motion_blur", "glass_blur", "defocus_blur"),  # blur_list
    *("contrast", "jpeg_compression", "saturate", "pixelate"),  # digital_list
    *("snow", "fog", "frost", "spatter", "brightness"),  # weather_list
)
"""The 19 corruptions of the group's ``test_city_c.py`` (lines 93-98), in its order."""


@dataclass(frozen=True)
class CorruptionSet:
    """Corruptions evaluated at each of the severities: ``len(corruptions) * len(severities)`` test sets.

    Attributes:
        corruptions: ``imagecorruptions`` names, each at most once.
        severities: severities in 1-5, each at most once.
    """

    corruptions: tuple[str, ...]
    severities: tuple[int, ...]

    def __post_init__(self) -> None:
        check_corruptions(self.corruptions, self.severities)
        for name, values in (("corruptions", self.corruptions), ("severities", self.severities)):
            repeated = sorted({v for v in values if values.count(v) > 1})
            if repeated:
                raise OptionError(f"data.eval.{name} lists {repeated} more than once; give each one once")

    def pairs(self) -> list[tuple[str, int]]:
        """``(corruption, severity)`` of every test set, corruption-major: ``[(c0, s0), (c0, s1), ..., (c1, s0), ...]``.

        Returns:
            ``len(corruptions) * len(severities)`` pairs.
        """
        return [(c, s) for c in self.corruptions for s in self.severities]


CorruptionPreset = Literal["imagenet-c", "elliptical"]
"""The names of the presets, the one list of them: the type of ``data.eval.corruption_preset``, and the keys of
:data:`CORRUPTION_PRESETS` in this order."""

IMAGENET_C_SET = CorruptionSet(IMAGENET_C_CORRUPTIONS, IMAGENET_C_SEVERITIES)
"""The ``imagenet-c`` preset: the 15 ImageNet-C benchmark corruptions at severities 1-5 (75 sets)."""

ELLIPTICAL_SET = CorruptionSet(ELLIPTICAL_CORRUPTIONS, (1, 2, 3))
"""The ``elliptical`` preset: the group's 19 corruptions at severities 1-3 (57 sets)."""

CORRUPTION_PRESETS: dict[CorruptionPreset, CorruptionSet] = dict(
    zip(choices(CorruptionPreset), (IMAGENET_C_SET, ELLIPTICAL_SET), strict=True)
)
"""Each preset name of :data:`CorruptionPreset` -> its corruption set."""


def resolve_corruption_set(
    preset: str, corruptions: Sequence[str] | None = None, severities: Sequence[int] | None = None
) -> CorruptionSet:
    """The preset's corruptions and severities, either replaced by ``corruptions`` / ``severities`` when given.

    Raises:
        ValueError: naming the valid choices, for an unknown preset, corruption name or severity, or a repeat.
    """
    check_choice("data.eval.corruption_preset", preset, CorruptionPreset)
    base = CORRUPTION_PRESETS[preset]
    return CorruptionSet(
        tuple(base.corruptions if corruptions is None else corruptions),
        tuple(base.severities if severities is None else severities),
    )
