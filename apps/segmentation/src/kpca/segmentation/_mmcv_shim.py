"""A light ``mmcv.ops`` for mmcv-lite: mmseg imports it unconditionally, but only Segmenter-free heads need its kernels.

mmcv-lite ships ``mmcv/ops/*.py`` without the compiled ``mmcv._ext``, and ``mmcv/ops/__init__.py`` loads that
extension, so ``import mmseg.datasets`` fails (``mmseg/utils/mask_classification.py`` does
``from mmcv.ops import point_sample``). :func:`install` registers a stand-in ``mmcv.ops`` module when the compiled
extension is absent. It exposes mmcv's own pure-PyTorch ``point_sample`` (loaded from mmcv-lite's
``mmcv/ops/point_sample.py``, which imports only torch; a faithful ``F.grid_sample`` version otherwise), and any
other name resolves to a placeholder that raises :class:`ImportError` naming the op and the fix when used.

``kpca.segmentation`` calls :func:`install` on import, so every process that imports it first (dataloader workers
included, see ``kpca.segmentation.data``) can import mmseg.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

SHIM_FLAG = "__kpca_mmcv_shim__"
FULL_MMCV_FIX = (
    "install the full mmcv 2.1.0 with its compiled ops (built from source; see the mmsegmentation section of the "
    "repository's documentation) instead of mmcv-lite"
)


def _grid_sample_point_sample(
    input: torch.Tensor,
    points: torch.Tensor,
    align_corners: bool = False,
    **kwargs,
) -> torch.Tensor:
    """The ``point_sample`` of mmcv: sample ``input`` at relative [0, 1] ``points`` with ``F.grid_sample``.

    Args:
        input: (N, C, H, W) feature map.
        points: (N, P, 2) or (N, Hg, Wg, 2) x, y coordinates in [0, 1].
        align_corners: as in ``F.grid_sample``.
        **kwargs: passed to ``F.grid_sample`` (e.g. ``mode``, ``padding_mode``).

    Returns:
        (N, C, P) or (N, C, Hg, Wg) features.
    """
    add_dim = points.dim() == 3
    if add_dim:
        points = points.unsqueeze(2)  # (N, P, 1, 2)
    output = F.grid_sample(input, 2.0 * points - 1.0, align_corners=align_corners, **kwargs)
    return output.squeeze(3) if add_dim else output


def _mmcv_point_sample():
    """mmcv-lite's ``point_sample`` loaded from its source file (pure PyTorch), or None when not present."""
    spec = importlib.util.find_spec("mmcv")
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).parent / "ops" / "point_sample.py"
    if not source.is_file():
        return None
    module_spec = importlib.util.spec_from_file_location("mmcv.ops.point_sample", source)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except ImportError:  # a future version that needs the extension
        return None
    sys.modules["mmcv.ops.point_sample"] = module
    return module.point_sample


class _CompiledOpMeta(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        cls._fail()


class _CompiledOp(metaclass=_CompiledOpMeta):
    """Placeholder for a compiled mmcv op: importable (mmseg imports some at module level), fails when used."""

    op_name = "?"

    def __init__(self, *args, **kwargs) -> None:
        self._fail()

    @classmethod
    def _fail(cls):
        raise ImportError(
            f"mmcv.ops.{cls.op_name} needs mmcv's compiled extension (mmcv._ext), which mmcv-lite does not have; "
            f"{FULL_MMCV_FIX}. Segmenter does not need it."
        )


def _placeholder(name: str) -> type:
    return _CompiledOpMeta(name, (_CompiledOp,), {"op_name": name, "__module__": "mmcv.ops"})


def _module_getattr(name: str) -> type:
    """``mmcv.ops.<name>`` for a compiled op: a placeholder that raises a clear ImportError when used."""
    if name.startswith("__"):
        raise AttributeError(f"module 'mmcv.ops' has no attribute {name!r}")
    return _placeholder(name)


def compiled_ops_available() -> bool:
    """Whether mmcv's compiled extension ``mmcv._ext`` can be imported (full mmcv, not mmcv-lite)."""
    try:
        return importlib.util.find_spec("mmcv._ext") is not None
    except ModuleNotFoundError:  # no mmcv at all
        return False


def install() -> bool:
    """Register the light ``mmcv.ops`` when mmcv is installed without its compiled extension; idempotent.

    Returns:
        True when the shim is (now or already) active, False when mmcv is absent or has its compiled ops.
    """
    existing = sys.modules.get("mmcv.ops")
    if existing is not None:
        return bool(getattr(existing, SHIM_FLAG, False))
    if importlib.util.find_spec("mmcv") is None or compiled_ops_available():
        return False
    ops = types.ModuleType("mmcv.ops", "Light mmcv.ops for mmcv-lite (kpca.segmentation._mmcv_shim).")
    setattr(ops, SHIM_FLAG, True)
    ops.point_sample = _mmcv_point_sample() or _grid_sample_point_sample

    ops.__getattr__ = _module_getattr
    sys.modules["mmcv.ops"] = ops
    import mmcv  # after registering, so that `mmcv.ops` resolves to the shim

    mmcv.ops = ops
    return True
