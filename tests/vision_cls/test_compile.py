"""``--model.compile``: the smoke network traces without graph breaks; compiled, a fit writes eager checkpoints and
``test`` runs the robustness evaluation, gradient attacks included."""

from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kpca.attention import AttentionSpec
from kpca.vision_cls.cli import VisionCLI, main
from kpca.vision_cls.model import ViTClassifier
from kpca.vision_cls.module import ClassificationModule
from tests.cli_support import CONFIGS, NEW_CHECKPOINT_DIR, run_cli, smoke_options

# Expected in every fit of the smoke model: its EMA copy stays in eval mode on purpose (timm's ModelEmaV3).
pytestmark = pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"


def smoke_net() -> ViTClassifier:
    """The smoke config's network (RPC in block 0, symmetric softmax in block 1)."""
    args = yaml.safe_load(SMOKE.read_text())["model"]["net"]["init_args"]
    return ViTClassifier(**{**args, "attention": AttentionSpec(**args["attention"])})


def test_network_forward_has_no_graph_breaks():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(smoke_net())(torch.rand(2, 3, 32, 32))  # (B, C, H, W)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.fixture(scope="module")
def compiled_fit(tmp_path_factory: pytest.TempPathFactory, digits_cache_dir: Path) -> VisionCLI:
    """Two training steps, two validation batches and the attention maps, with ``--model.compile true``.

    Limits of 2, not 1: once mmengine is imported (the segmentation tests), jsonargparse reads ``1`` as ``1.0``,
    which Lightning takes for 100 %. Diagnostics on every step keep one training graph (their switch recompiles).
    """
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    root = tmp_path_factory.mktemp("compiled_fit")
    options = ["--model.compile=true", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2",
               "--trainer.log_every_n_steps=1", "--rpc_diagnostics.every_n_steps=1"]  # fmt: skip
    return run_cli(main, "vision-cls", "fit", *smoke_options(SMOKE, root, digits_cache_dir, *options))


@pytest.mark.slow
def test_compiled_fit_writes_checkpoints_that_load_eager(compiled_fit: VisionCLI):
    assert compiled_fit.trainer.global_step == 2 and "val/acc1" in compiled_fit.trainer.callback_metrics
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # training and evaluation ran compiled
    events = EventAccumulator(compiled_fit.trainer.log_dir, size_guidance={"images": 0})
    events.Reload()
    assert set(events.Tags()["images"]) == {"attention/block0", "attention/block-1"}  # hooks on the compiled net
    last = Path(compiled_fit.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    assert not [key for key in torch.load(last, weights_only=True)["state_dict"] if "_orig_mod" in key]
    loaded = ClassificationModule.load_from_checkpoint(last)  # strict: every name matches the eager module's
    assert "forward" not in vars(loaded.net)  # compile is not saved: a loaded model runs eager


@pytest.mark.slow
@NEW_CHECKPOINT_DIR
def test_compiled_test_runs_the_attacks(compiled_fit: VisionCLI, tmp_path: Path, digits_cache_dir: Path):
    """FGSM and PGD differentiate the compiled network with respect to its input, outside Lightning's inference mode.

    The backend is AOTAutograd without Inductor's code generation: what this path adds to the fit is the capture
    (inference tensors, input gradients under ``torch.inference_mode(False)``), and it spares two Inductor compiles.
    """
    last = Path(compiled_fit.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    options = ["--model.compile={backend: aot_eager}", f"--ckpt_path={last}"]
    cli = run_cli(main, "vision-cls", "test", *smoke_options(SMOKE, tmp_path, digits_cache_dir, *options))
    metrics = cli.trainer.callback_metrics
    assert metrics["test/attack/n_images"] == 16 and "test/attack/pgd-pixel/eps2/acc1" in metrics
    assert "forward" in vars(cli.model.net)
