"""kpca.attention: softmax, symmetric and RPC-Attention (Principal Attention Pursuit) for PyTorch.

The robust-attention family beside it (Twicing, NeuTRENO, Elliptical) are functions (``kpca.attention.robust``) and
modules; Elliptical and NeuTRENO read values of earlier blocks of the same forward, which the model's loop over its
blocks passes to each call (``first_values``, ``previous_values``, ``values_out``).

Functions take (B, H, N, D) tensors; modules take (B, N, C) tokens and drop into timm ViTs. The paper's
scaled-attention variants are modules too; its kernel-PCA diagnostics are ``kpca.attention.kernel_pca``. The
project's ViTs (timm's DeiT sizes with any attention, in timm's registry, and DeiT <-> SymViT / RPC weights) are
``kpca.attention.vit``, imported explicitly: it needs timm (the ``timm`` extra), which this package does not.

torch older than 2.11, the oldest release the tests run on, is refused at import with the fix in the message
(``KPCA_ALLOW_UNTESTED_TORCH=1`` imports anyway).
"""

from kpca.attention import _torch_version  # noqa: F401 (first: refuses a torch older than the floor)

# isort: split
from kpca.attention._backend import get_backend, set_backend, use_backend
from kpca.attention.functional import RPCState, pap_mu, rpc_attention, softmax_attention
from kpca.attention.layout import convert_qkv_rows, is_symmetric_qkv
from kpca.attention.modules import (
    AlphaAsymAttention,
    AttentionOptions,
    EllipticalAttention,
    NeuTRENOAttention,
    RPCAttention,
    ScaledAttention,
    SoftmaxAttention,
    TwicingAttention,
    index_attention_blocks,
)
from kpca.attention.robust import elliptical_attention, elliptical_scale, neutreno_attention, twicing_attention
from kpca.attention.spec import AttentionSpec, register_attention_kind
from kpca.attention.swap import AttentionSwap, swap_attention

__all__ = [
    "AlphaAsymAttention",
    "AttentionOptions",
    "AttentionSpec",
    "AttentionSwap",
    "EllipticalAttention",
    "NeuTRENOAttention",
    "RPCAttention",
    "RPCState",
    "ScaledAttention",
    "SoftmaxAttention",
    "TwicingAttention",
    "convert_qkv_rows",
    "elliptical_attention",
    "elliptical_scale",
    "get_backend",
    "index_attention_blocks",
    "is_symmetric_qkv",
    "neutreno_attention",
    "pap_mu",
    "register_attention_kind",
    "rpc_attention",
    "set_backend",
    "softmax_attention",
    "swap_attention",
    "twicing_attention",
    "use_backend",
]
