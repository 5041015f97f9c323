"""The corruption names the apps check options against are imagecorruptions' own, in its order."""

from imagecorruptions import get_corruption_names

from kpca.training.images.corruptions import CORRUPTION_NAMES, IMAGENET_C_CORRUPTIONS


def test_the_names_are_the_librarys_in_its_order():
    assert list(CORRUPTION_NAMES) == get_corruption_names("all")
    assert list(IMAGENET_C_CORRUPTIONS) == get_corruption_names("common")
