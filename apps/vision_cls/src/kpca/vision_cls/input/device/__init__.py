"""The batched device tail of the training transform, run after transfer: what ``data.train.augment_on`` moves there.

* :mod:`.tail`: uint8 -> float and random erasing, batched (``augment_on: device``), after RandAugment where it moved.
* :mod:`.rand_augment`: timm's RandAugment on a uint8 batch (``augment_on: device_randaugment``): timm's draws per
  image, from torch's generator; :mod:`.pillow_ops` its ops, Pillow's pixels in torch.
"""
