"""CausalTransformerLM: a decoder-only transformer whose attention is chosen by an AttentionSpec.

Legend: B batch, N tokens (N <= context), C width, V vocabulary, S scored positions.
Every attention module is built strictly causal (causal attention in every PAP evaluation and a
causal mu from prefix sums), so the prediction at position t depends on tokens <= t only. The
output head (:mod:`kpca.language_model.output_heads`) is a full softmax or an adaptive softmax;
:meth:`CausalTransformerLM.token_nll` runs it on the positions that are scored only.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from kpca.attention import AttentionSpec, index_attention_blocks
from kpca.language_model.output_heads import WIKITEXT103_CUTOFFS, AdaptiveHead, SoftmaxHead
from kpca.training.choices import check_choice, choices
from kpca.training.errors import OptionError

NormPosition = Literal["pre", "post"]
Positions = Literal["sinusoidal", "learned"]
Activation = Literal["gelu", "relu"]
Output = Literal["softmax", "adaptive"]
ACTIVATIONS = {name: getattr(F, name) for name in choices(Activation)}
"""The function of each :data:`Activation`: ``torch.nn.functional``'s of that name."""


class FeedForward(nn.Module):
    """Position-wise MLP: Linear(C, F) -> GELU or ReLU -> dropout -> Linear(F, C)."""

    def __init__(self, width: int, ffn_dim: int, dropout: float, activation: Activation = "gelu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, width)
        self.drop = nn.Dropout(dropout)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, N, C)."""
        return self.fc2(self.drop(self.activation(self.fc1(x))))


class DecoderBlock(nn.Module):
    """One transformer block with causal attention; ``norm_position`` chooses post-LN (paper) or pre-LN."""

    def __init__(
        self,
        width: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float,
        attention: AttentionSpec,
        norm_position: NormPosition,
        attention_dropout: float = 0.0,
        attention_bias: bool = True,
        activation: Activation = "gelu",
    ) -> None:
        super().__init__()
        self.norm_position = norm_position
        self.attn = attention.build(
            width, num_heads, qkv_bias=attention_bias, proj_bias=attention_bias, attn_drop=attention_dropout,
            proj_drop=dropout, is_causal=True, task="language",
        )  # (B, N, C) -> (B, N, C), strictly causal; the kind's language defaults (NeuTRENO lambd 0.4)  # fmt: skip
        self.norm1 = nn.LayerNorm(width)
        self.ffn = FeedForward(width, ffn_dim, dropout, activation)
        self.norm2 = nn.LayerNorm(width)
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        first_values: torch.Tensor | None = None,
        previous_values: torch.Tensor | None = None,
        values_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """(B, N, C) -> (B, N, C), causal in N.

        ``first_values`` / ``previous_values`` are block 0's and the block before's (B, H, N, D) values of this
        forward (None in block 0), which Elliptical and NeuTRENO read; the attention appends its own to the
        caller's ``values_out`` (``kpca.attention.modules``).
        """
        if self.norm_position == "pre":
            x = x + self.attn(self.norm1(x), None, False, None, first_values, previous_values, values_out)
            return x + self.drop(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.attn(x, None, False, None, first_values, previous_values, values_out))
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
    FFN 2048, dropout 0.1, no attention dropout (the authors' ``--dropatt 0.0``), context 256,
    post-LN. The output is a tied full softmax by default; the authors' set-up (their commands'
    ``--adaptive``) is ``output: adaptive`` with ``tie_embeddings: false``.

    Each block builds its own attention from the spec (``AttentionSpec.per_block``, then
    ``AttentionSpec.build``), where the ViTs and Segmenter build timm blocks with softmax attention
    and then ``swap_attention`` them. Both give the same modules and the same ``state_dict`` layout,
    but a swap would first draw a softmax ``qkv`` (3C rows) and keep its K and V rows, so a seed
    would give other initial weights (every tensor drawn after the first ``qkv``) than the symmetric
    ``qkv`` (2C rows) drawn here, and earlier runs and the demo's numbers would not reproduce. The
    ViTs swap because timm builds their blocks (timm's ``attn_layer`` cannot carry RPC's settings);
    these blocks are ours. Kinds that read values of earlier blocks (Elliptical: the previous
    block's; NeuTRENO: block 0's) get them from the loop over the blocks (:meth:`hidden`), which
    hands each block the values of block 0 and of the block before in local variables.

    Args:
        vocab_size: vocabulary size V (the tokenizer's).
        context: longest input N the model accepts (the training block length).
        width: model width C.
        depth: number of blocks.
        num_heads: attention heads (C must be divisible by it).
        ffn_dim: hidden width of the feed-forward layers.
        dropout: dropout on embeddings, the FFN hidden layer and residual branches.
        attention_dropout: dropout on the attention probabilities (with RPC: on the last PAP evaluation).
        attention: which attention, and in which blocks (see ``AttentionSpec.per_block``); blocks it
            leaves as they are get the baseline, asymmetric softmax attention.
        norm_position: ``post`` (LayerNorm after each residual sum, the paper) or ``pre``
            (LayerNorm on each branch input, plus a final LayerNorm).
        positions: ``sinusoidal`` (fixed) or ``learned`` position embeddings.
        tie_embeddings: share the token embedding with the output projection (``output: softmax`` only).
        activation: ``gelu`` or ``relu`` (the authors') in the feed-forward layers.
        attention_bias: biases in the q/k/v and output projections of attention (the authors have none).
        output: ``softmax`` (a full softmax over V) or ``adaptive`` (``torch.nn.AdaptiveLogSoftmaxWithLoss``).
        adaptive_cutoffs: cluster boundaries of the adaptive softmax, increasing, below V (the authors'
            WikiText-103 20000, 40000, 200000; scale them down for small vocabularies).
        adaptive_div_value: width divisor of the adaptive softmax's tail clusters (the authors' ``div_val`` 1).
    """

    passes_earlier_values = True  # its loop hands values on: swap_attention may put Elliptical or NeuTRENO in

    def __init__(
        self,
        vocab_size: int,
        context: int = 256,
        width: int = 128,
        depth: int = 16,
        num_heads: int = 8,
        ffn_dim: int = 2048,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        attention: AttentionSpec = AttentionSpec(kind="symmetric"),  # noqa: B008 (dataclass default)
        norm_position: NormPosition = "post",
        positions: Positions = "sinusoidal",
        tie_embeddings: bool = True,
        activation: Activation = "gelu",
        attention_bias: bool = True,
        output: Output = "softmax",
        adaptive_cutoffs: tuple[int, ...] = WIKITEXT103_CUTOFFS,
        adaptive_div_value: float = 1.0,
    ) -> None:
        super().__init__()
        sizes = {"vocab_size": (vocab_size, 2), "context": (context, 1), "width": (width, 1), "depth": (depth, 1)}
        sizes |= {"num_heads": (num_heads, 1), "ffn_dim": (ffn_dim, 1)}
        for name, (size, low) in sizes.items():
            if size < low:
                raise OptionError(f"{name}={size} must be {low} or more")
        if width % num_heads:
            raise OptionError(f"width {width} must be divisible by num_heads {num_heads}")
        check_choice("norm_position", norm_position, NormPosition)
        check_choice("positions", positions, Positions)
        check_choice("activation", activation, Activation)
        check_choice("output", output, Output)
        if output == "adaptive" and tie_embeddings:
            raise OptionError(
                "tie_embeddings needs output: softmax (the adaptive softmax's clusters have their own weights); "
                "set tie_embeddings: false with output: adaptive"
            )
        if not (0.0 <= dropout < 1.0 and 0.0 <= attention_dropout < 1.0):
            raise OptionError(f"dropout and attention_dropout must be in [0, 1), got {dropout}, {attention_dropout}")
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
            DecoderBlock(
                width,
                num_heads,
                ffn_dim,
                dropout,
                baseline if spec is None else spec,
                norm_position,
                attention_dropout,
                attention_bias,
                activation,
            )  # fmt: skip
            for spec in attention.per_block(depth)
        )
        index_attention_blocks([block.attn for block in self.blocks], owner="CausalTransformerLM.blocks")
        self.norm = nn.LayerNorm(width) if norm_position == "pre" else nn.Identity()
        if output == "adaptive":
            self.head = AdaptiveHead(width, vocab_size, tuple(adaptive_cutoffs), adaptive_div_value)
        else:
            self.head = SoftmaxHead(width, vocab_size)
        self.apply(_init_weights)
        if positions == "learned":
            nn.init.normal_(self.pos_embed, std=0.02)
        if tie_embeddings:
            self.head.weight = self.embed.weight

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N) token ids -> (B, N, C) final hidden states; position t sees tokens <= t only."""
        n = tokens.shape[1]
        if n > self.context:
            raise OptionError(f"input has {n} tokens, more than the model's context {self.context}; crop it")
        x = self.embed(tokens) * math.sqrt(self.width) + self.pos_embed[:n]  # (B, N, C)
        x = self.drop(x)
        first: torch.Tensor | None = None
        previous: torch.Tensor | None = None
        for block in self.blocks:
            values: list[torch.Tensor] = []  # this block's (B, H, N, D) values: a local of this call
            x = block(x, first, previous, values)  # (B, N, C)
            first = values[0] if first is None else first
            previous = values[0]
        return self.norm(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N) token ids -> (B, N, V) next-token log-probabilities; position t sees tokens <= t only."""
        return self.head.log_probs(self.hidden(tokens))

    def token_nll(
        self, tokens: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor | None = None
    ) -> torch.Tensor:
        """NLL of ``targets`` after ``tokens``, both (B, N): (S,) at the positions where ``scored`` (B, N) is True.

        The output head runs on those S positions only (all B * N when ``scored`` is None), so a
        sliding window that scores one position costs one head evaluation, not N.
        """
        hidden = self.hidden(tokens)  # (B, N, C)
        if scored is None:
            return self.head.nll(hidden.flatten(0, 1), targets.flatten())  # (B * N,)
        return self.head.nll(hidden[scored], targets[scored])  # (S,)

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
            raise OptionError(f"prompt must be (B, P) token ids with P >= 1, got shape {tuple(prompt.shape)}")
        if top_k is not None and top_k < 1:
            raise OptionError(f"top_k must be None (greedy) or >= 1, got {top_k}")
        if temperature <= 0:
            raise OptionError(f"temperature must be > 0, got {temperature}")
        tokens = prompt
        for _ in range(max_new_tokens):
            hidden = self.hidden(tokens[:, -self.context :])[:, -1]  # (B, C)
            log_probs = self.head.log_probs(hidden)  # (B, V)
            if top_k is None:
                next_token = log_probs.argmax(-1, keepdim=True)  # (B, 1)
            else:
                values, indices = log_probs.topk(min(top_k, log_probs.shape[-1]), dim=-1)  # (B, k)
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
