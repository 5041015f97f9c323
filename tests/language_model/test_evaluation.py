"""Sliding-window perplexity with stride 1 (the authors' protocol) against one forward pass per token (float64)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from kpca.attention import AttentionSpec
from kpca.language_model.data import SlidingWindows, TokenArray
from kpca.language_model.model import CausalTransformerLM

CONTEXT, EOS = 8, 0


def array_of(tmp_path: Path, ids: list[int]) -> TokenArray:
    path = tmp_path / "tokens.bin"
    np.asarray(ids, dtype=np.uint16).tofile(path)
    return TokenArray(path, "uint16", len(ids), words=len(ids))


def tiny_model(output: str) -> CausalTransformerLM:
    torch.manual_seed(0)
    options = {"output": output, "tie_embeddings": output == "softmax", "adaptive_cutoffs": (5, 15)}
    return (
        CausalTransformerLM(
            30, context=CONTEXT, width=16, depth=2, num_heads=2, ffn_dim=32, attention=AttentionSpec(kind="rpc"),
            **options,
        )
        .double()
        .eval()
    )  # fmt: skip


def brute_force(model: CausalTransformerLM, stream: list[int]) -> tuple[float, int]:
    """Sum of -log p(stream[j] | the <= CONTEXT tokens before it) over j >= 1, one forward pass per token."""
    total = 0.0
    for j in range(1, len(stream)):
        context = torch.tensor([stream[max(0, j - CONTEXT) : j]])  # (1, <= N)
        total -= model(context)[0, -1, stream[j]].item()
    return total, len(stream) - 1


def windowed(model: CausalTransformerLM, windows: SlidingWindows, batch_size: int) -> tuple[float, int]:
    """What ``test`` computes: batches of windows, the head run on the scored positions only."""
    total, count = 0.0, 0
    with torch.no_grad():
        for inputs, targets, scored in DataLoader(windows, batch_size=batch_size):
            nll = model.token_nll(inputs, targets, scored)  # (S,)
            total, count = total + nll.sum().item(), count + nll.numel()
    return total, count


@pytest.mark.parametrize("output", ["softmax", "adaptive"])
@pytest.mark.parametrize("score_first_token", [False, True])
def test_stride_one_scores_every_token_once_with_the_full_context(output, score_first_token, tmp_path: Path):
    ids = [int(x) for x in np.random.default_rng(1).integers(1, 30, 29)]
    model = tiny_model(output)
    windows = SlidingWindows(
        array_of(tmp_path, ids), CONTEXT, stride=1, eos_id=EOS, score_first_token=score_first_token
    )
    stream = [EOS, *ids] if score_first_token else ids
    # the authors' count: the first window scores its N positions, each later one its last: T - 1 without the eos
    assert len(windows) == len(stream) - CONTEXT
    expected_total, expected_count = brute_force(model, stream)
    total, count = windowed(model, windows, batch_size=7)
    assert count == expected_count == (29 if score_first_token else 28)
    assert total == pytest.approx(expected_total, rel=1e-12)


def test_the_output_head_runs_on_the_scored_positions_only(tmp_path: Path):
    model = tiny_model("softmax")
    rows = []
    model.head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    windows = SlidingWindows(array_of(tmp_path, list(range(1, 30))), CONTEXT, stride=1, eos_id=EOS)
    windowed(model, windows, batch_size=21)
    assert rows == [CONTEXT + 20, 1]  # 29 - 8 + 1 = 22 windows: the first scores 8, the others 1 each
