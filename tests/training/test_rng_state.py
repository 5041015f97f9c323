"""RNG states: a saved state replays the same torch, NumPy and Python draws, also after a weights-only load."""

import io
import random

import numpy as np
import torch

from kpca.training.checkpointing.restore import rng_states, set_rng_states


def draws() -> tuple[torch.Tensor, np.ndarray, list[float]]:
    return torch.rand(5), np.append(np.random.randn(), np.random.rand(5)), [random.random() for _ in range(5)]


def assert_same(a, b) -> None:
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_rng_states_round_trip():
    np.random.seed(1)
    random.seed(2)
    np.random.randn()  # leaves a cached Gaussian in NumPy's state
    states = rng_states()
    assert states["numpy"][3] == 1
    first = draws()
    second = draws()
    assert not torch.equal(first[0], second[0])
    set_rng_states(states)
    assert_same(draws(), first)
    assert_same(draws(), second)


def test_rng_states_survive_a_weights_only_checkpoint():
    states = rng_states()
    expected = draws()
    buffer = io.BytesIO()
    torch.save({"rng_states": [states]}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["rng_states"][0]
    draws()
    set_rng_states(loaded)
    assert_same(draws(), expected)
