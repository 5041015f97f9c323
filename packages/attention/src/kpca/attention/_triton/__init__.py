"""The Triton backend: kernels for the PAP element-wise steps and mu, imported only when used.

Nothing is imported here, so ``import kpca.attention`` works without triton; ``functional``
imports :mod:`kpca.attention._triton.ops` when a call resolves to the ``triton`` backend.
"""
