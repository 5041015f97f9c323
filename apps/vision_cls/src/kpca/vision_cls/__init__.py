"""kpca.vision_cls: DeiT / SymViT / RPC-SymViT classification with LightningCLI and robustness evaluation."""
