"""The corruption names the apps check options against are imagecorruptions' own, in its order."""

import subprocess
import sys

import pytest
from imagecorruptions import get_corruption_names

from kpca.training.images.corruptions import CORRUPTION_NAMES, IMAGENET_C_CORRUPTIONS


def test_the_names_are_the_librarys_in_its_order():
    assert list(CORRUPTION_NAMES) == get_corruption_names("all")
    assert list(IMAGENET_C_CORRUPTIONS) == get_corruption_names("common")


@pytest.mark.slow  # a new interpreter imports the three apps: about 10 s
def test_an_app_imports_the_corruption_library_only_to_corrupt():
    apps = "kpca.vision_cls.cli, kpca.language_model.cli, kpca.segmentation.cli"
    code = f"import sys, {apps}; print('imagecorruptions' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False"]
