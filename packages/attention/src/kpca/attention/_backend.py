"""Backend names and their resolution. The portable ``torch`` path is the one built so far."""

from __future__ import annotations

from typing import Literal

Backend = Literal["auto", "torch"]
BACKENDS: tuple[str, ...] = ("auto", "torch")


def resolve_backend(backend: str) -> str:
    """Return the concrete backend for a requested one; ``auto`` takes the best available (torch)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return "torch"
