"""The training input path of ImageNetDataModule: files in, training images on the device out.

``data.input`` names the path and ``data.augment_on`` where its transform finishes. The folder shows the split:

* :mod:`.options`: ``data.input`` / ``data.augment_on``, the one check of their combinations, the names they replaced.
* :mod:`.policy`: timm's RandAugment policy (op -> level -> argument) and Pillow's constants, read by every executor.
* :mod:`.workers`: the DataLoader workers' transform (``turbo`` and ``timm``).
* :mod:`.device`: the batched tail after transfer (float conversion, random erasing, RandAugment where it moved).
* :mod:`.dali`: the DALI path (``input: dali``); only its ``graph`` and ``loader`` import ``nvidia.dali``, lazily.
* :mod:`.samplers`: DeiT's repeated-augmentation sampler, and the sampler of the DALI loader.

Evaluation loaders never take these paths: they decode with PIL and resize and crop per image.
"""
