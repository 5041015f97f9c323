"""What the image apps share.

Modules: ``decoding`` (strict decoding: a truncated file fails), ``corruptions`` (the ImageNet-C corruption list and
seeded corruptions; needs the ``[vision]`` extra).
"""
