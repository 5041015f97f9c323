"""Elliptical's and NeuTRENO's earlier values belong to one call of a ViT: threads, re-entry, checkpointing.

The values one block reads from earlier blocks are passed by the ViT's block loop in local variables
(``kpca.attention.vit_blocks.ValuePassingViT``): two threads sharing one model, a model called again inside its own
forward, and activation checkpointing (recomputing blocks in the backward) each give what the same call gives alone.
``nn.DataParallel``'s replicas are shallow copies of the model run from one thread per device: they share less than
the two threads here share, and no module holds a tensor after a call.
"""

import pytest
import torch

from kpca.attention import AttentionSpec
from kpca.attention.vit import create_vit
from kpca.attention.vit_blocks import ValuePassingViT
from tests.values_per_call import forwards_from_two_threads, held_tensors

TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 3, "num_heads": 2, "num_classes": 5}
READING = ("neutreno", "elliptical")
"""The kinds whose attention reads earlier blocks' values."""


def vit(kind: str) -> ValuePassingViT:
    torch.manual_seed(0)
    return create_vit("deit_tiny", AttentionSpec(kind=kind), **TINY).eval()


@pytest.mark.parametrize("kind", READING)
def test_two_threads_sharing_one_vit_with_different_batch_sizes_each_get_their_own_outputs(kind: str):
    model = vit(kind)
    inputs = [torch.randn(3, 3, 32, 32), torch.randn(5, 3, 32, 32)]
    errors, wrong = forwards_from_two_threads(model, inputs, forwards=150)
    assert (errors, wrong) == ([], 0)
    assert held_tensors(model) == []


@pytest.mark.parametrize("kind", READING)
def test_a_vit_called_again_inside_its_own_forward_gives_both_calls_their_own_values(kind: str):
    model = vit(kind)
    outer, inner = torch.randn(2, 3, 32, 32), torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected_outer, expected_inner = model(outer), model(inner)
    seen = []

    class CallingTheModelAgain(torch.nn.Module):
        """Block 1's MLP, calling the whole model on other images the first time: block 0 of the outer call has run."""

        def __init__(self, mlp: torch.nn.Module) -> None:
            super().__init__()
            self.mlp = mlp

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not seen:
                seen.append(None)  # once: the inner call passes here too
                seen[0] = model(inner)
            return self.mlp(x)

    mlp = model.blocks[1].mlp
    model.blocks[1].mlp = CallingTheModelAgain(mlp)
    with torch.no_grad():
        got_outer = model(outer)
    model.blocks[1].mlp = mlp
    assert torch.equal(got_outer, expected_outer) and torch.equal(seen[0], expected_inner)


@pytest.mark.parametrize("kind", READING)
def test_activation_checkpointing_recomputes_each_block_with_the_values_of_its_call(kind: str):
    model = vit(kind).double().train()
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    results = []
    for checkpointing in (False, True):
        model.set_grad_checkpointing(checkpointing)
        model.zero_grad()
        out = model(images)
        out.square().sum().backward()
        results.append((out.detach(), [param.grad.clone() for param in model.parameters()]))
    (plain, plain_grads), (checkpointed, checkpointed_grads) = results
    assert torch.equal(checkpointed, plain)
    for got, want in zip(checkpointed_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
