"""The oldest torch the project supports, and the check that refuses an older one when the package is imported.

torch 2.11 is the floor because it is the oldest release the tests run on (``make test-compat``, besides the
pinned release of ``make test``) and the one that GPU images of the time ship. An older torch is refused with a
message naming the installed version and the fix, rather than left to fail later inside ``torch.compile`` or a
custom op. ``KPCA_ALLOW_UNTESTED_TORCH=1`` lets it import anyway, at the user's own risk.
"""

from __future__ import annotations

import os
import re

import torch

MIN_TORCH = (2, 11)
"""The oldest (major, minor) torch release the tests run on."""
ALLOW_ENV_VAR = "KPCA_ALLOW_UNTESTED_TORCH"


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as ``2.11.0+cu130`` or ``2.12.0.dev20260301``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"cannot read a torch release from the version string {version!r}")
    return int(match[1]), int(match[2])


def check_torch_version(version: str, environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Raise ImportError if torch ``version`` is older than :data:`MIN_TORCH`, unless the override is set.

    Args:
        version: ``torch.__version__``.
        environ: where ``KPCA_ALLOW_UNTESTED_TORCH`` is looked up.
    """
    if release(version) >= MIN_TORCH or environ.get(ALLOW_ENV_VAR) == "1":
        return
    floor = ".".join(map(str, MIN_TORCH))
    raise ImportError(
        f"kpca.attention needs torch >= {floor} (the oldest release its tests run on), found torch {version}. "
        f"Install torch >= {floor} (pip install 'torch>={floor}'), or set {ALLOW_ENV_VAR}=1 to import it on "
        f"torch {version} untested."
    )


check_torch_version(torch.__version__)
