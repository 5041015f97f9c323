"""``python -m kpca.vision_cls``: the same as the ``vision-cls`` command."""

from kpca.vision_cls.cli import console_main

console_main()
