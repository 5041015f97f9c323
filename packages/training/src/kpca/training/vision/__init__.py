"""What the ViT apps (vision_cls, segmentation) share: DeiT building, ViT weight loading, image corruptions.

Needs the ``[vision]`` extra of kpca-training (timm, torchvision, imagecorruptions-imaug).
"""
