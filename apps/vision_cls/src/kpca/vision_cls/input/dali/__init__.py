"""The NVIDIA DALI training input path (``data.train.input: dali``): DALI reads, decodes and augments.

* :mod:`.recipe`: the transform in timm's terms, and timm's RandAugment string parsed for it.
* :mod:`.tables`: timm's RandAugment as argument tables (:mod:`kpca.vision_cls.input.policy`'s levels per bin).
* :mod:`.graph`: the operator graph; imports ``nvidia.dali``.
* :mod:`.loader`: the loader Lightning iterates, one pipeline per epoch in the sampler's order; imports ``nvidia.dali``
  lazily (:func:`.loader.require_dali`, and :mod:`.graph` when an epoch starts).

Only :mod:`.graph` and :mod:`.loader` touch ``nvidia.dali``, and only when the DALI path runs: importing this package
imports no DALI.
"""
