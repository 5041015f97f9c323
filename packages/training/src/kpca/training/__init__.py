"""kpca.training: the Lightning machinery every kpca app shares, so that no app imports another.

Modules: ``cli`` (ProjectCLI), ``module`` (NetModule), ``files``, ``checkpoint_io``, ``rng_state``,
``callbacks``, ``reports``, ``data``, ``optim``; ``vision`` (the ``[vision]`` extra) for the ViT apps.
"""
