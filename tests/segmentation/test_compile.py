"""``--model.compile``: the smoke network traces without graph breaks, and a compiled fit writes eager checkpoints."""

from pathlib import Path

import pytest
import torch
import yaml

from kpca.attention import AttentionSpec
from kpca.segmentation.cli import main
from kpca.segmentation.model import Segmenter
from kpca.segmentation.module import SegmentationModule
from tests.cli_support import CONFIGS, run_cli, smoke_options

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
    """Two training steps and two batches of the sliding-window validation, compiled; the names stay.

    Limits of 2, not 1: once mmengine is imported (the segmentation tests), jsonargparse reads ``1`` as ``1.0``,
    which Lightning takes for 100 %. Diagnostics on every step keep one training graph (their switch recompiles).
    """
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    options = ["--model.compile=true", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2",
               "--trainer.log_every_n_steps=1", "--rpc_diagnostics.every_n_steps=1"]  # fmt: skip
    cli = run_cli(main, "segmentation", "fit", *smoke_options(SMOKE, tmp_path, seg_cache_dir, *options))
    assert cli.trainer.global_step == 2 and "val/mIoU" in cli.trainer.callback_metrics
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # training and evaluation ran compiled
    last = Path(cli.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    assert not [key for key in torch.load(last, weights_only=True)["state_dict"] if "_orig_mod" in key]
    loaded = SegmentationModule.load_from_checkpoint(last)  # strict: every name matches the eager module's
    assert "forward" not in vars(loaded.net)  # compile is not saved: a loaded model runs eager
