"""ImageFolder trees read with a given class list, and their class folders listed with a layout-naming error."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import find_classes

from kpca.training.errors import MissingPathError, OptionError


class ClassListImageFolder(ImageFolder):
    """ImageFolder whose classes (and so labels, their positions in ``classes``) are given instead of discovered.

    Args:
        root: The folder holding one sub-folder per class.
        classes: The class folder names, in label order.
        transform: Applied to each PIL image.
    """

    def __init__(self, root: str | Path, classes: Sequence[str], transform: Callable | None = None) -> None:
        self._class_list = list(classes)
        super().__init__(str(root), transform=transform)

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        """The given classes, labelled by position."""
        return self._class_list, {name: i for i, name in enumerate(self._class_list)}


def class_folders(directory: Path, layout: str) -> list[str]:
    """Sorted class folder names of ``directory``; FileNotFoundError or ValueError naming ``layout`` if unusable."""
    if not directory.is_dir():
        raise MissingPathError(f"{directory} is not a directory; expected the layout {layout}.")
    try:
        return find_classes(directory)[0]
    except FileNotFoundError:
        raise OptionError(f"{directory} has no class sub-folders; expected the layout {layout}.") from None
