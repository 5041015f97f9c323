"""The training input path of ImageNetDataModule: files in, training images on the device out.

``data.input`` names the path and ``data.augment_on`` where its transform finishes; :mod:`.options` holds both, the
one check of their combinations with the other data options, and the names they replaced. Modules:

* :mod:`.options`: ``data.input`` / ``data.augment_on``, :func:`~.options.check_input_options`.
* :mod:`.train_transform`: the DataLoader workers' transform (``turbo`` and ``timm``): timm's stages, the
  reference, and where the transform ends.
* :mod:`.turbo`: the turbo stages: libjpeg-turbo decode, crop, resize and flip on uint8 tensors.
* :mod:`.compiled_rand_augment`: timm's RandAugment with its slow ops computed by :mod:`.pil_kernels`, numba
  copies of Pillow's loops (bit-identical).
* :mod:`.random_erasing`: DeiT's per-image random erasing in pixel space (``augment_on: workers``).
* :mod:`.device_augment`: the batched device tail after transfer: uint8 -> float, random erasing
  (``augment_on: device``).
* :mod:`.samplers`: DeiT's repeated-augmentation sampler, and the sampler of the DALI loader.
* :mod:`.dali_loader`: the DALI path's recipe and loader (``input: dali``); :mod:`.dali_graph` its operator
  graph (the only module that imports ``nvidia.dali``, lazily); :mod:`.dali_rand_augment` timm's RandAugment as
  DALI argument tables.

Evaluation loaders never take these paths: they decode with PIL and resize and crop per image.
"""
