"""``python -m kpca.training.experiment``: the same as the ``kpca-experiment`` command."""

from kpca.training.experiment.cli import main

main()
