"""kpca.vision_cls: DeiT / SymViT / RPC-SymViT classification with LightningCLI and robustness evaluation.

Importing it registers the project's ViTs with timm (``timm.create_model("rpc_symvit_tiny_patch16_224")``,
see :mod:`kpca.attention.vit`), so that exported models (:mod:`kpca.vision_cls.export`) load by name.
"""

import kpca.attention.vit  # noqa: F401 (registers the timm entrypoints)
