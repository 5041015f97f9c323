"""Checks that a model's cross-layer values (Elliptical's, NeuTRENO's) belong to one call: shared by the apps' tests.

A forward's values live in its block loop's local variables; these helpers run one model from two threads at once and
look for tensors left on its modules.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch


def held_tensors(model: torch.nn.Module) -> list[str]:
    """Attributes of ``model``'s modules that hold a tensor (or a list or tuple of them) but no parameter or buffer."""
    held = []
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            items = value if isinstance(value, (list, tuple)) else (value,)
            if any(isinstance(item, torch.Tensor) for item in items):
                held.append(f"{name}.{attr}")
    return held


def forwards_from_two_threads(
    call: Callable[[torch.Tensor], torch.Tensor], inputs: Sequence[torch.Tensor], forwards: int
) -> tuple[list[BaseException], int]:
    """Run ``call`` on ``inputs[0]`` in one thread and on ``inputs[1]`` in another, ``forwards`` times each, at once.

    Both threads start together (a barrier) and each compares every output with the output of the same call made
    alone beforehand, bit for bit.

    Returns:
        The exceptions the threads raised, and how many outputs differed from the call alone.
    """
    with torch.no_grad():
        alone = [call(x) for x in inputs]
    barrier = threading.Barrier(len(inputs))
    errors: list[BaseException] = []
    wrong = [0] * len(inputs)

    def run(index: int) -> None:
        barrier.wait()
        for _ in range(forwards):
            try:
                with torch.no_grad():
                    out = call(inputs[index])
            except Exception as error:  # noqa: BLE001 (counted: the test asserts there are none)
                errors.append(error)
                continue
            wrong[index] += int(not torch.equal(out, alone[index]))

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors, sum(wrong)
