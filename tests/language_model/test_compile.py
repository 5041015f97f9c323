"""``--model.compile``: the smoke network traces without graph breaks, and a compiled fit writes eager checkpoints."""

from pathlib import Path

import pytest
import torch
import yaml

from kpca.attention import AttentionSpec
from kpca.language_model.cli import main
from kpca.language_model.model import CausalTransformerLM
from kpca.language_model.module import LanguageModelModule
from tests.cli_support import CONFIGS, run_compiled_fit

SMOKE = CONFIGS / "language_model" / "smoke.yaml"


def smoke_net() -> CausalTransformerLM:
    """The smoke config's network (2 RPC blocks), with the vocabulary and context its data links in."""
    config = yaml.safe_load(SMOKE.read_text())
    args, data = config["model"]["net"]["init_args"], config["data"]
    attention = AttentionSpec(**args["attention"])
    return CausalTransformerLM(**{**args, "attention": attention}, vocab_size=data["tokenizer"]["vocab_size"],
                               context=data["context"])  # fmt: skip


def test_network_forward_has_no_graph_breaks():
    """``forward`` runs ``hidden``, the trunk that ``--model.compile`` compiles, then the softmax head."""
    torch._dynamo.reset()
    net = smoke_net()
    explanation = torch._dynamo.explain(net)(torch.randint(0, net.vocab_size, (2, 16)))  # (B, N)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.slow
def test_compiled_fit_writes_checkpoints_that_load_eager(tmp_path: Path, lm_cache_dir: Path):
    """Two training steps and two batches of the sliding-window validation, compiled; the names stay."""
    _, last = run_compiled_fit(main, "language-model", SMOKE, tmp_path, lm_cache_dir, "val/ppl")
    loaded = LanguageModelModule.load_from_checkpoint(last)  # strict: every name matches the eager module's
    assert "hidden" not in vars(loaded.net)  # compile is not saved: a loaded model runs eager
