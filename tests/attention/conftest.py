"""Attention tests: run the Triton kernels in Triton's CPU interpreter on machines without CUDA.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates, that is when
``kpca.attention._triton.kernels`` is first imported (lazily, by the first call that resolves to
the ``triton`` backend), so it is set here, before any test runs. One process either interprets
the kernels or compiles them for CUDA, not both: where CUDA is present it is left unset, the
``gpu`` tests run compiled kernels and the CPU Triton tests skip (``TRITON_INTERPRET=1 pytest -m
triton`` runs those there). A value set by the caller is kept.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
