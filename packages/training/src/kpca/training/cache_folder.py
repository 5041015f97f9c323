"""Where generated data goes: ``data.cache_dir``, else ``$KPCA_CACHE``, else ``~/.cache/kpca``.

Built-in data sets, tokenizers and token arrays are written there once and reused. The folder is checked before a
run is built (:func:`kpca.training.machine_checks.check_cache_folder`), and an operating-system error writing into it
names these settings as the fix (:func:`kpca.training.errors.disk_message`).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV_VAR = "KPCA_CACHE"
CACHE_FIX = f"pass --data.cache_dir=<folder> or set {CACHE_ENV_VAR}=<folder> to a writable folder"
"""The fix an error about the cache folder names."""


def default_cache_dir() -> Path:
    """Where generated data goes: ``$KPCA_CACHE`` (``~`` expanded) if set, else ``~/.cache/kpca``."""
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "kpca").expanduser()


def cache_folder_source(cache_dir: str | Path | None) -> tuple[Path, str]:
    """The cache folder that ``data.cache_dir`` (None: unset) gives, and the setting it comes from, for messages."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser(), f"data.cache_dir={cache_dir}"
    if os.environ.get(CACHE_ENV_VAR):
        return default_cache_dir(), f"{CACHE_ENV_VAR}={os.environ[CACHE_ENV_VAR]}"
    return default_cache_dir(), f"the default cache folder {default_cache_dir()}"


def inside_default_cache(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` lies inside the default cache folder (``$KPCA_CACHE`` or ``~/.cache/kpca``)."""
    if not path:
        return False
    cache = default_cache_dir().absolute()
    return Path(os.fspath(path)).absolute().is_relative_to(cache)
