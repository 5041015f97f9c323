"""Test-wide settings: offline hubs, threads per xdist worker, Triton's CPU interpreter, fixed seeds, each test's
signal mask restored, xdist order, gpu skips; the built-in digits tree, once per session."""

import os
import signal
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Each pytest-xdist worker (``make test``: one per core) takes its share of the cores for torch's threads, and so do
# the commands it starts (they inherit the variable): two workers of two threads each on two cores spend their time
# waiting on each other's threads (``make test`` took about 11% longer on the 2-core CI machine). A value set by the
# caller is kept.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))

import pytest  # noqa: E402
import torch  # noqa: E402

# Triton reads TRITON_INTERPRET when ``@triton.jit`` decorates, for its own standard library too, that is when
# ``triton.language`` is first imported, by our kernels or by any library a test imports before them (timm,
# torch's compiler). So it is set here, before any test module is collected, and not in tests/attention: one
# process either interprets the kernels or compiles them for CUDA, not both. Where CUDA is present it is left
# unset, the ``gpu`` tests run compiled kernels and the CPU Triton tests skip (``TRITON_INTERPRET=1 pytest -m
# triton`` runs those there). A value set by the caller is kept.
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _signal_mask() -> Iterator[None]:
    """Give the worker back the signal mask each test found: a held SIGUSR1 (kpca.training.slurm_start) would
    reach every later test and the commands it starts."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.fixture(scope="session")
def digits_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``data.cache_dir`` holding the 32 px digits tree, written once per worker (about 2 s) and shared: read it."""
    from kpca.vision_cls.builtin_data import write_digits_imagefolder

    cache = tmp_path_factory.mktemp("digits_cache")
    write_digits_imagefolder(cache / "digits-32px", image_size=32)
    return cache


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order and group the tests for pytest-xdist, and skip `gpu` tests when no CUDA device is present.

    The `slow` tests come first (in their collected order), so that with several workers (``make test``: ``-n 2
    --dist loadgroup``) the longest start early and the short ones fill in at the end instead of one worker finishing
    a long test alone (the `slurm` tests form one xdist group: tests/slurm/test_real_slurm.py). Without xdist this
    only sets the order. CUDA is probed once, at collection.
    """
    items.sort(key=lambda item: "slow" not in item.keywords)  # stable: collected order within each part
    if not any("gpu" in item.keywords for item in items) or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
