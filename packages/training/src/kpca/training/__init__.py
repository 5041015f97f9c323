"""kpca.training: the Lightning machinery every kpca app shares, so that no app imports another.

Each module has one row in packages/training/README.md (a test keeps that table complete): the runtime (``cli``,
``module``, ``trainer``, ``data``, ``resumable``, ``checkpointing/``, ``callbacks``, ...) and the results tools
(``reports``, ``compare``, ``experiment/``, ...).
"""
