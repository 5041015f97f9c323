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
from tests.cli_support import CONFIGS, NEW_CHECKPOINT_DIR, run_cli, run_compiled_fit, smoke_options

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
def compiled_fit(tmp_path_factory: pytest.TempPathFactory, digits_cache_dir: Path) -> tuple[VisionCLI, Path]:
    """Two training steps, two validation batches and the attention maps, with ``--model.compile true``."""
    root = tmp_path_factory.mktemp("compiled_fit")
    return run_compiled_fit(main, "vision-cls", SMOKE, root, digits_cache_dir, "val/acc1")


@pytest.mark.slow
def test_compiled_fit_writes_checkpoints_that_load_eager(compiled_fit: tuple[VisionCLI, Path]):
    cli, last = compiled_fit
    events = EventAccumulator(cli.trainer.log_dir, size_guidance={"images": 0})
    events.Reload()
    assert set(events.Tags()["images"]) == {"attention/block0", "attention/block-1"}  # hooks on the compiled net
    loaded = ClassificationModule.load_from_checkpoint(last)  # strict: every name matches the eager module's
    assert "forward" not in vars(loaded.net)  # compile is not saved: a loaded model runs eager


@pytest.mark.slow
@NEW_CHECKPOINT_DIR
def test_compiled_test_runs_the_attacks(compiled_fit: tuple[VisionCLI, Path], tmp_path: Path, digits_cache_dir: Path):
    """FGSM and PGD differentiate the compiled network with respect to its input, outside Lightning's inference mode.

    The backend is AOTAutograd without Inductor's code generation: what this path adds to the fit is the capture
    (inference tensors, input gradients under ``torch.inference_mode(False)``), and it spares two Inductor compiles.
    """
    _, last = compiled_fit
    options = ["--model.compile={backend: aot_eager}", f"--ckpt_path={last}"]
    cli = run_cli(main, "vision-cls", "test", *smoke_options(SMOKE, tmp_path, digits_cache_dir, *options))
    metrics = cli.trainer.callback_metrics
    assert metrics["test/attack/n_images"] == 16 and "test/attack/pgd-pixel/eps2/acc1" in metrics
    assert "forward" in vars(cli.model.net)
