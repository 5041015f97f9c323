"""``--model.compile``: the smoke network traces without graph breaks, and a compiled fit writes eager checkpoints."""

from pathlib import Path

import pytest
import torch
import yaml

from kpca.attention import AttentionSpec
from kpca.segmentation.cli import main
from kpca.segmentation.model import Segmenter
from kpca.segmentation.module import SegmentationModule
from tests.cli_support import CONFIGS, run_compiled_fit

pytestmark = pytest.mark.mmseg

SMOKE = CONFIGS / "segmentation" / "smoke.yaml"


def smoke_net() -> Segmenter:
    """The smoke config's network (RPC in the first encoder and decoder blocks)."""
    args = yaml.safe_load(SMOKE.read_text())["model"]["net"]["init_args"]
    specs = {name: AttentionSpec(**args[name]) for name in ("attention", "decoder_attention")}
    return Segmenter(**{**args, **specs})


def test_network_forward_has_no_graph_breaks():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(smoke_net())(torch.rand(2, 3, 32, 32))  # (B, C, H, W)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.slow
def test_compiled_fit_writes_checkpoints_that_load_eager(tmp_path: Path, seg_cache_dir: Path):
    """Two training steps and two batches of the sliding-window validation, compiled; the names stay."""
    _, last = run_compiled_fit(main, "segmentation", SMOKE, tmp_path, seg_cache_dir, "val/mIoU")
    loaded = SegmentationModule.load_from_checkpoint(last)  # strict: every name matches the eager module's
    assert "forward" not in vars(loaded.net)  # compile is not saved: a loaded model runs eager
