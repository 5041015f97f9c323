"""The DataLoader workers' training transform (``data.train.input: turbo | timm``): files in, one image per call out.

* :mod:`.transform`: timm's DeiT stages, as they are (``timm``, the reference) or as their turbo equivalents, and where
  the transform ends (``data.train.augment_on``).
* :mod:`.turbo`: the turbo stages: libjpeg-turbo decode, crop, resize and flip on uint8 tensors.
* :mod:`.compiled_rand_augment`: timm's RandAugment with its slow ops computed by :mod:`.pil_kernels`, numba copies of
  Pillow's loops (bit-identical).
* :mod:`.random_erasing`: DeiT's per-image random erasing in pixel space (``augment_on: workers``).
"""
