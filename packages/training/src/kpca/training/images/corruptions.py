"""Image corruptions: the ImageNet-C list (Hendrycks & Dietterich) and reproducible ``imagecorruptions`` calls.

``imagecorruptions`` (with numba, scikit-image and OpenCV, about 0.6 s) is imported at the first corruption, not with
this module: a fit or a clean evaluation only checks names against :data:`CORRUPTION_NAMES`, the library's list.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np

from kpca.training.errors import OptionError

IMAGENET_C_GROUPS: dict[str, tuple[str, ...]] = {
    "noise": ("gaussian_noise", "shot_noise", "impulse_noise"),
    "blur": ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur"),
    "weather": ("snow", "frost", "fog", "brightness"),
    "digital": ("contrast", "elastic_transform", "pixelate", "jpeg_compression"),
}
IMAGENET_C_CORRUPTIONS: tuple[str, ...] = tuple(c for group in IMAGENET_C_GROUPS.values() for c in group)
"""The 15 benchmark corruptions, in ImageNet-C's order (``imagecorruptions`` also has 4 extra ones)."""
IMAGENET_C_SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
CORRUPTION_NAMES: tuple[str, ...] = (
    *IMAGENET_C_CORRUPTIONS, "speckle_noise", "gaussian_blur", "spatter", "saturate"
)  # fmt: skip
"""Every corruption ``imagecorruptions`` applies, in its order (``get_corruption_names("all")``)."""


def check_corruptions(corruptions: Sequence[str], severities: Sequence[int]) -> None:
    """Raise ValueError on unknown corruption names or severities outside 1-5."""
    known = list(CORRUPTION_NAMES)
    unknown = [c for c in corruptions if c not in known]
    if unknown:
        raise OptionError(f"Unknown corruption(s) {unknown}; choose from {known}.")
    bad = [s for s in severities if s not in IMAGENET_C_SEVERITIES]
    if bad:
        raise OptionError(f"Severities {bad} are invalid; severities must be integers in 1-5.")


def corrupt_seeded(image: np.ndarray, corruption: str, severity: int, seed: int) -> np.ndarray:
    """Apply an ``imagecorruptions`` corruption reproducibly.

    The corruptions draw from NumPy's global RNG (``impulse_noise`` and ``glass_blur`` take a ``seed`` instead), so
    the global RNG is seeded for the call and restored afterwards, and ``seed`` is passed where it is accepted.

    Args:
        image: (H, W, 3) uint8 array, H and W at least 32.
        corruption: A name from :data:`CORRUPTION_NAMES`.
        severity: 1 to 5.
        seed: Seed in [0, 2**32).

    Returns:
        The corrupted (H, W, 3) uint8 array.
    """
    from imagecorruptions import corrupt, corruption_dict  # the library's first use: see the module's docstring

    kwargs = {"seed": seed} if "seed" in inspect.signature(corruption_dict[corruption]).parameters else {}
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        return corrupt(image, severity=severity, corruption_name=corruption, **kwargs)
    finally:
        np.random.set_state(state)
