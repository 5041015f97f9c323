"""kpca.vision_cls: DeiT / SymViT / RPC-SymViT classification with LightningCLI and robustness evaluation.

Importing it registers the project's ViTs with timm (``timm.create_model("rpc_symvit_tiny_patch16_224")``,
see :mod:`kpca.vision_cls.timm_models`).
"""

from kpca.vision_cls import timm_models as timm_models  # noqa: F401 (registers the timm entrypoints)
