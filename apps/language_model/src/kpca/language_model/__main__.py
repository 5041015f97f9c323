"""``python -m kpca.language_model``: the same as the ``language-model`` command."""

from kpca.language_model.cli import console_main

console_main()
