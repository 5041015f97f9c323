"""Output heads of the language model: a full softmax, or PyTorch's adaptive softmax (the authors' choice).

Legend: S positions (any leading shape), C width, V vocabulary.
Both heads give the log-probabilities over the vocabulary and the NLL of targets from the same
computation, so training loss, perplexity and generation agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kpca.training.errors import OptionError

WIKITEXT103_CUTOFFS = (20000, 40000, 200000)  # the authors' (KPCA-S lm/src_attack/train.py:336-341)


class SoftmaxHead(nn.Linear):
    """A bias-free ``Linear(C, V)`` followed by a softmax over the whole vocabulary."""

    def __init__(self, width: int, vocab_size: int) -> None:
        super().__init__(width, vocab_size, bias=False)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., V) logits in float32 or wider (bf16 / fp16 ones are upcast)."""
        logits = self(hidden)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., V) log-probabilities (float32 or wider)."""
        return F.log_softmax(self.logits(hidden), dim=-1)

    def nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(S, C), (S,) -> (S,) negative log-likelihood of each target (float32 or wider)."""
        return F.cross_entropy(self.logits(hidden), targets, reduction="none")


def check_cutoffs(cutoffs: tuple[int, ...], vocab_size: int) -> None:
    """Raise a ValueError naming the fix unless ``cutoffs`` are increasing ints in [1, V - 1]."""
    valid = (
        len(cutoffs) > 0
        and all(isinstance(c, int) and not isinstance(c, bool) for c in cutoffs)
        and list(cutoffs) == sorted(set(cutoffs))
        and cutoffs[0] >= 1
        and cutoffs[-1] <= vocab_size - 1
    )
    if not valid:
        scaled = sorted({min(max(round(c * vocab_size / 267735), 1), vocab_size - 1) for c in WIKITEXT103_CUTOFFS})
        raise OptionError(
            f"adaptive_cutoffs {list(cutoffs)} do not fit the vocabulary of {vocab_size} words: they must be "
            f"increasing integers between 1 and vocab_size - 1 = {vocab_size - 1}. The authors' WikiText-103 "
            f"cutoffs {list(WIKITEXT103_CUTOFFS)} are for its 267,735 words; scaled to this vocabulary they are "
            f"{scaled} (set model.net.init_args.adaptive_cutoffs)"
        )


class AdaptiveHead(nn.AdaptiveLogSoftmaxWithLoss):
    """``torch.nn.AdaptiveLogSoftmaxWithLoss`` (Grave et al.) with per-target NLL and full log-probabilities.

    The head scores the ``cutoffs[0]`` most frequent words and one entry per tail cluster; a word of
    cluster i has log-probability log p(cluster i) + log p(word | cluster i), the tail computed from
    a ``C // div_value ** (i + 1)`` projection. Token ids must be in frequency order (the word
    vocabulary's are). With ``div_value=1`` (the authors' ``div_val``) the tails keep the full width.
    """

    def __init__(self, width: int, vocab_size: int, cutoffs: tuple[int, ...], div_value: float) -> None:
        check_cutoffs(tuple(cutoffs), vocab_size)
        if div_value < 1.0:
            raise OptionError(f"adaptive_div_value must be >= 1 (1: tails keep the full width), got {div_value}")
        super().__init__(width, vocab_size, list(cutoffs), div_value=div_value, head_bias=True)

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., V) log-probabilities."""
        return self.log_prob(hidden.reshape(-1, hidden.shape[-1])).reshape(*hidden.shape[:-1], -1)

    def nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(S, C), (S,) -> (S,) negative log-likelihood of each target; each tail runs on its own targets only."""
        return -self(hidden, targets).output
