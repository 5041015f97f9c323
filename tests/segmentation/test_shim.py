"""The mmcv.ops shim: mmseg imports on mmcv-lite, point_sample is mmcv's, compiled ops fail clearly, workers too."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import kpca.segmentation  # noqa: F401 (installs the shim)
from kpca.segmentation import _mmcv_shim
from kpca.segmentation.data import ADE20KDataModule, collate_lists
from tests.segmentation.conftest import SMOKE_SET

pytestmark = pytest.mark.mmseg


def test_shim_is_active_on_mmcv_lite_and_mmseg_imports():
    import mmcv.ops
    import mmseg.datasets  # noqa: F401

    assert not _mmcv_shim.compiled_ops_available()
    assert getattr(mmcv.ops, _mmcv_shim.SHIM_FLAG)
    assert _mmcv_shim.install()  # idempotent


def test_point_sample_is_mmcvs_and_matches_the_grid_sample_version():
    from mmcv.ops import point_sample

    assert point_sample.__module__ == "mmcv.ops.point_sample"  # loaded from mmcv-lite's source
    features = torch.randn(2, 3, 5, 7)  # (N, C, H, W)
    points = torch.rand(2, 11, 2)  # (N, P, 2)
    expected = _mmcv_shim._grid_sample_point_sample(features, points)
    torch.testing.assert_close(point_sample(features, points), expected)
    assert expected.shape == (2, 3, 11)
    corners = torch.tensor([[[0.5 / 7, 0.5 / 5]]]).expand(2, 1, 2)  # the centre of pixel (0, 0)
    torch.testing.assert_close(point_sample(features, corners)[..., 0], features[:, :, 0, 0])


def test_compiled_ops_raise_an_error_naming_the_op_and_the_fix():
    from mmcv.ops import sigmoid_focal_loss

    with pytest.raises(ImportError, match=r"mmcv\.ops\.sigmoid_focal_loss needs mmcv's compiled extension.*full mmcv"):
        sigmoid_focal_loss(torch.zeros(1), torch.zeros(1))
    with pytest.raises(ImportError, match="DeformConv2d"):
        _mmcv_shim._module_getattr("DeformConv2d").apply(torch.zeros(1))


@pytest.mark.slow  # two fresh interpreters importing torch and mmseg: about 7 s
def test_a_fresh_process_needs_the_shim_before_mmseg():
    code = "import {first}; import mmseg.datasets"
    without = subprocess.run([sys.executable, "-c", code.format(first="mmcv")], capture_output=True, text=True)
    assert without.returncode != 0 and "mmcv._ext" in without.stderr
    with_shim = subprocess.run([sys.executable, "-c", code.format(first="kpca.segmentation")], capture_output=True)
    assert with_shim.returncode == 0, with_shim.stderr


def report_shim(samples):
    """Collate in the worker, adding whether the worker's mmcv.ops is the shim and mmseg is loaded."""
    import sys

    ops = sys.modules.get("mmcv.ops")
    return collate_lists(samples), bool(getattr(ops, _mmcv_shim.SHIM_FLAG, False)), "mmseg.datasets" in sys.modules


@pytest.mark.slow  # a spawned worker re-imports torch, Lightning and mmseg: about 10 s
def test_spawned_dataloader_workers_import_the_shim_first(seg_cache_dir: Path):
    datamodule = ADE20KDataModule(builtin="synthetic", synthetic=SMOKE_SET, cache_dir=seg_cache_dir, scale=(192, 48))
    datamodule.setup("validate")
    loader = DataLoader(
        datamodule.val_set, batch_size=2, num_workers=1, multiprocessing_context="spawn", collate_fn=report_shim
    )
    (batch, shim_active, mmseg_loaded), *_ = list(loader)
    assert shim_active and mmseg_loaded
    assert batch["images"][0].shape == (3, 48, 48) and batch["labels"][0].shape == (48, 48)
