"""CausalTransformerLM: a decoder-only transformer whose attention is chosen by an AttentionSpec.

Legend: B batch, N tokens (N <= context), C width, V vocabulary.
Every attention module is built strictly causal (causal attention in every PAP evaluation and a
causal mu from prefix sums), so logits at position t depend on tokens <= t only.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from kpca.attention import AttentionSpec

NormPosition = Literal["pre", "post"]


class FeedForward(nn.Module):
    """Position-wise MLP: Linear(C, F) -> GELU -> dropout -> Linear(F, C)."""

    def __init__(self, width: int, ffn_dim: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, N, C)."""
        return self.fc2(self.drop(F.gelu(self.fc1(x))))


class DecoderBlock(nn.Module):
    """One transformer block with causal attention; ``norm_position`` chooses post-LN (paper) or pre-LN."""

    def __init__(
        self, width: int, num_heads: int, ffn_dim: int, dropout: float, attention: AttentionSpec, norm_position: str
    ) -> None:
        super().__init__()
        self.norm_position = norm_position
        self.attn = attention.build(
            width, num_heads, qkv_bias=True, attn_drop=dropout, proj_drop=dropout, is_causal=True
        )  # (B, N, C) -> (B, N, C), strictly causal
        self.norm1 = nn.LayerNorm(width)
        self.ffn = FeedForward(width, ffn_dim, dropout)
        self.norm2 = nn.LayerNorm(width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, N, C), causal in N."""
        if self.norm_position == "pre":
            x = x + self.attn(self.norm1(x))
            return x + self.drop(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.drop(self.ffn(x)))


def sinusoidal_positions(length: int, width: int) -> torch.Tensor:
    """(length, width) sine/cosine position encodings of Vaswani et al. (sin on even, cos on odd channels)."""
    position = torch.arange(length, dtype=torch.float64)[:, None]  # (N, 1)
    frequency = torch.exp(torch.arange(0, width, 2, dtype=torch.float64) * (-math.log(10000.0) / width))  # (C/2,)
    table = torch.zeros(length, width, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: width // 2])
    return table.float()


class CausalTransformerLM(nn.Module):
    """Decoder-only language model; ``attention`` picks asymmetric, symmetric or RPC attention per block.

    The paper's WikiText-103 model is the default: 16 blocks, width 128, 8 heads (head dim 16),
    FFN 2048, dropout 0.1, context 256, post-LN, tied input/output embeddings.

    Args:
        vocab_size: vocabulary size V (the tokenizer's).
        context: longest input N the model accepts (the training block length).
        width: model width C.
        depth: number of blocks.
        num_heads: attention heads (C must be divisible by it).
        ffn_dim: hidden width of the feed-forward layers.
        dropout: dropout on embeddings, attention probabilities and residual branches.
        attention: which attention, and in which blocks (see ``AttentionSpec.per_block``); blocks it
            leaves as they are get the baseline, asymmetric softmax attention.
        norm_position: ``post`` (LayerNorm after each residual sum, the paper) or ``pre``
            (LayerNorm on each branch input, plus a final LayerNorm).
        positions: ``sinusoidal`` (fixed) or ``learned`` position embeddings.
        tie_embeddings: share the token embedding with the output projection.
    """

    def __init__(
        self,
        vocab_size: int,
        context: int = 256,
        width: int = 128,
        depth: int = 16,
        num_heads: int = 8,
        ffn_dim: int = 2048,
        dropout: float = 0.1,
        attention: AttentionSpec = AttentionSpec(kind="symmetric"),  # noqa: B008 (dataclass default)
        norm_position: NormPosition = "post",
        positions: Literal["sinusoidal", "learned"] = "sinusoidal",
        tie_embeddings: bool = True,
    ) -> None:
        super().__init__()
        if vocab_size < 2 or context < 1 or depth < 1:
            raise ValueError(f"need vocab_size >= 2, context >= 1, depth >= 1; got {vocab_size}, {context}, {depth}")
        if width % num_heads:
            raise ValueError(f"width {width} must be divisible by num_heads {num_heads}")
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        if positions not in ("sinusoidal", "learned"):
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {positions!r}")
        self.vocab_size, self.context, self.width = vocab_size, context, width
        self.attention = attention
        self.embed = nn.Embedding(vocab_size, width)
        if positions == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(context, width))  # (N_max, C)
        else:
            self.register_buffer("pos_embed", sinusoidal_positions(context, width), persistent=False)
        self.drop = nn.Dropout(dropout)
        baseline = AttentionSpec(kind="softmax", backend=attention.backend)  # the blocks per_block leaves as they are
        self.blocks = nn.ModuleList(
            DecoderBlock(width, num_heads, ffn_dim, dropout, baseline if spec is None else spec, norm_position)
            for spec in attention.per_block(depth)
        )
        self.norm = nn.LayerNorm(width) if norm_position == "pre" else nn.Identity()
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.apply(_init_weights)
        if positions == "learned":
            nn.init.normal_(self.pos_embed, std=0.02)
        if tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N) token ids -> (B, N, V) next-token logits; position t sees tokens <= t only."""
        n = tokens.shape[1]
        if n > self.context:
            raise ValueError(f"input has {n} tokens, more than the model's context {self.context}; crop it")
        x = self.embed(tokens) * math.sqrt(self.width) + self.pos_embed[:n]  # (B, N, C)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # (B, N, V)

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        top_k: int | None = None,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue (B, P) prompts by ``max_new_tokens`` tokens; returns (B, P + max_new_tokens).

        Greedy when ``top_k`` is None, else samples among the ``top_k`` most likely tokens at
        ``temperature``. The model sees the last ``context`` tokens at each step.
        """
        if prompt.ndim != 2 or prompt.shape[1] == 0:
            raise ValueError(f"prompt must be (B, P) token ids with P >= 1, got shape {tuple(prompt.shape)}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be None (greedy) or >= 1, got {top_k}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        tokens = prompt
        for _ in range(max_new_tokens):
            logits = self(tokens[:, -self.context :])[:, -1].float()  # (B, V)
            if top_k is None:
                next_token = logits.argmax(-1, keepdim=True)  # (B, 1)
            else:
                values, indices = logits.topk(min(top_k, logits.shape[-1]), dim=-1)  # (B, k)
                probs = torch.softmax(values / temperature, dim=-1)
                choice = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
                next_token = indices.gather(-1, choice)
            tokens = torch.cat([tokens, next_token], dim=1)
        return tokens

    def no_weight_decay(self) -> set[str]:
        """Parameter names excluded from weight decay beyond biases and norms."""
        return {"pos_embed"} if isinstance(self.pos_embed, nn.Parameter) else set()


def _init_weights(module: nn.Module) -> None:
    """GPT-style init: N(0, 0.02) weights, zero biases, unit LayerNorms."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
