"""``python -m kpca.segmentation``: the same as the ``segmentation`` command."""

from kpca.segmentation.cli import console_main

console_main()
