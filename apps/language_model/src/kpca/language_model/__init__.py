"""kpca.language_model: causal symmetric / RPC transformer language models with LightningCLI."""
