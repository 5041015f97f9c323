"""``vision-cls export``: a classifier as a timm model folder, reloaded by timm with identical logits."""

import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

from kpca.attention import AttentionSpec, RPCAttention
from kpca.vision_cls.cli import VisionCLI, main
from kpca.vision_cls.export import export_timm
from kpca.vision_cls.model import ViTClassifier
from tests.cli_support import CONFIGS, run_cli, smoke_options

SMOKE = CONFIGS / "vision_cls" / "smoke.yaml"
EMA_IN_EVAL_MODE = pytest.mark.filterwarnings(r"ignore:Found \d+ module\(s\) in eval mode")
TINY = {"img_size": 32, "patch_size": 8, "depth": 2, "num_classes": 5}


def run(*args: object) -> VisionCLI:
    return run_cli(main, "vision-cls", *args)


def test_registered_rpc_symvit_is_the_apps_model():
    vit = timm.create_model("rpc_symvit_tiny_patch16_224")
    classifier = ViTClassifier("deit_tiny", attention=AttentionSpec(kind="rpc", layers=[0]))
    assert sum(p.numel() for p in vit.parameters()) == sum(p.numel() for p in classifier.parameters()) == 5_272_744
    assert (vit.blocks[0].attn.n_iter, vit.blocks[0].attn.lambd) == (4, 4.0)


def _normalised(classifier: ViTClassifier, images: torch.Tensor) -> torch.Tensor:
    return (images - classifier.mean) / classifier.std


@EMA_IN_EVAL_MODE
def test_export_of_a_checkpoint_reloads_in_timm_with_identical_logits(
    monitored_run: Path, tmp_path: Path, digits_cache_dir: Path
):
    options = smoke_options(SMOKE, tmp_path, digits_cache_dir, "--trainer.limit_train_batches=2")
    last = monitored_run / "checkpoints" / "last.ckpt"  # a 3-step fit's, shared: only read
    out = tmp_path / "exported"
    cli = run("export", *options, "--ckpt_path", last, "--out_dir", out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    classifier = cli.model.net.eval()
    checkpoint = torch.load(last, weights_only=True)["state_dict"]
    assert torch.equal(classifier.vit.blocks[0].attn.qkv.weight, checkpoint["net.vit.blocks.0.attn.qkv.weight"])
    reloaded = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    assert type(reloaded.blocks[0].attn) is RPCAttention and reloaded.blocks[0].attn.n_iter == 2
    images = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(_normalised(classifier, images)), classifier(images), rtol=0, atol=0)
    with pytest.raises(FileExistsError, match="choose a new --out_dir"):
        export_timm(classifier, out)


def test_an_exported_deit_loads_in_plain_timm_without_this_project(tmp_path: Path):
    classifier = ViTClassifier("deit_tiny", **TINY).eval()  # softmax attention: timm's own DeiT
    folder = export_timm(classifier, tmp_path / "deit")
    images = torch.rand(2, 3, 32, 32)
    torch.save(_normalised(classifier, images), tmp_path / "inputs.pt")
    code = (
        "import sys, timm, torch; "
        f"m = timm.create_model('local-dir:{folder}', pretrained=True).eval(); "
        f"torch.save(m(torch.load('{tmp_path / 'inputs.pt'}')), '{tmp_path / 'logits.pt'}'); "
        "assert not any(name.startswith('kpca') for name in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), classifier(images))
