"""Decoding images strictly: a truncated file fails where a library would pad it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from PIL import ImageFile


@contextmanager
def strict_image_decoding() -> Iterator[None]:
    """Decode images with PIL's truncation check on, whatever a library set: a truncated file fails, not padded.

    With ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` true, PIL fills the missing part of a truncated file with grey
    silently; inside this context it is false (and restored afterwards).
    """
    previous = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = previous
