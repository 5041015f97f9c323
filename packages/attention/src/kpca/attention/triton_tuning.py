"""Public hooks into the Triton backend for benchmarks and tuning: its launch configuration, and its kernels stubbed.

The Triton backend's element-wise kernels (the PAP steps and the row L1 norms) run ``num_warps`` warps on tiles of
at most ``block_elements`` elements; :func:`launch_configuration` reads the configuration in use and
:func:`launched_with` runs a block under another one (``benchmarks/attention.py --sweep`` times them all).
:func:`stubbed_kernels` replaces every Triton kernel by a stub that counts its launch and computes nothing, so the
host-side cost of a call (Python, the dispatcher, argument binding) can be timed on any machine
(``benchmarks/dispatch.py``).

Each hook imports triton when called; ``import kpca.attention`` never does. Neither is thread-safe: they change the
backend for the whole process while their block runs.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kpca.attention import _backend

NUM_WARPS = (1, 2, 4, 8, 16, 32)
"""The warp counts a launch can take (powers of two, as Triton requires)."""


@dataclass(frozen=True)
class LaunchConfiguration:
    """How the element-wise kernels launch.

    Attributes:
        num_warps: Warps per program (one of :data:`NUM_WARPS`).
        block_elements: Elements per tile, a power of two: ``block_elements // BLOCK_D`` rows of ``BLOCK_D``
            columns (at least one row), where ``BLOCK_D`` is the head dim rounded up to a power of two.
    """

    num_warps: int
    block_elements: int

    def __post_init__(self) -> None:
        if self.num_warps not in NUM_WARPS:
            raise ValueError(f"num_warps={self.num_warps!r}: choose one of {NUM_WARPS}")
        if not isinstance(self.block_elements, int) or self.block_elements < 1:
            raise ValueError(f"block_elements={self.block_elements!r}: pass a power of two such as 2048")
        if self.block_elements & (self.block_elements - 1):
            raise ValueError(
                f"block_elements={self.block_elements}: tiles are powers of two; pass "
                f"{1 << (self.block_elements.bit_length() - 1)} or {1 << self.block_elements.bit_length()}"
            )


def _ops():
    """The Triton launchers (imports triton)."""
    from kpca.attention._triton import ops

    return ops


def launch_configuration() -> LaunchConfiguration:
    """The launch configuration the element-wise kernels use now (imports triton)."""
    ops = _ops()
    return LaunchConfiguration(ops.ELEMENTWISE_NUM_WARPS, ops.MAX_BLOCK_ELEMENTS)


@contextlib.contextmanager
def launched_with(num_warps: int, block_elements: int) -> Iterator[LaunchConfiguration]:
    """Run the block with the element-wise kernels launched as given; the configuration before is restored after.

    A new configuration compiles new kernel specialisations on first use. Results do not depend on it (each
    element's arithmetic is the same); only the speed does.

    Raises:
        ValueError: ``num_warps`` not in :data:`NUM_WARPS`, or ``block_elements`` not a positive power of two.
    """
    wanted = LaunchConfiguration(num_warps, block_elements)
    ops = _ops()
    saved = ops.ELEMENTWISE_NUM_WARPS, ops.MAX_BLOCK_ELEMENTS
    ops.ELEMENTWISE_NUM_WARPS, ops.MAX_BLOCK_ELEMENTS = wanted.num_warps, wanted.block_elements
    try:
        yield wanted
    finally:
        ops.ELEMENTWISE_NUM_WARPS, ops.MAX_BLOCK_ELEMENTS = saved


class _CountingKernel:
    """A jit kernel's ``kernel[grid](...)`` that counts the launch under its name and does nothing."""

    def __init__(self, name: str, launches: collections.Counter[str]) -> None:
        self.name, self.launches = name, launches

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def launch(*args: object, **kwargs: object) -> None:
            self.launches[self.name] += 1

        return launch


@contextlib.contextmanager
def stubbed_kernels(device_types: tuple[str, ...] = ("cpu",)) -> Iterator[collections.Counter[str]]:
    """Replace every Triton kernel by a stub that counts its launches; yield the counts by kernel name.

    Inside the block ``backend="triton"`` also takes tensors of ``device_types`` (CPU by default), so the Triton
    path runs its host code on any machine: its outputs are garbage (nothing is computed), only the host time and
    the launch counts mean anything. Everything is restored after the block.
    """
    from kpca.attention._triton import kernels

    launches: collections.Counter[str] = collections.Counter()
    saved = {name: getattr(kernels, name) for name in kernels.__all__}
    saved_device_types = _backend.TRITON_DEVICE_TYPES
    for name in saved:
        setattr(kernels, name, _CountingKernel(name, launches))
    _backend.TRITON_DEVICE_TYPES = tuple(dict.fromkeys((*saved_device_types, *device_types)))
    try:
        yield launches
    finally:
        for name, kernel in saved.items():
            setattr(kernels, name, kernel)
        _backend.TRITON_DEVICE_TYPES = saved_device_types
