"""Each app's console command says what the app does in ``--help`` (not Lightning's generic line)."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize(
    ("app", "says"),
    [
        ("vision_cls", "ImageNet-1K classification with DeiT, SymViT and RPC-SymViT"),
        ("language_model", "WikiText-103 causal language modelling"),
        ("segmentation", "ADE20K semantic segmentation with Segmenter"),
    ],
)
def test_help_says_what_the_app_does(app, says, capsys, monkeypatch):
    console_main = importlib.import_module(f"kpca.{app}.cli").console_main  # what the console script runs
    monkeypatch.setattr("sys.argv", [app.replace("_", "-"), "--help"])
    with pytest.raises(SystemExit) as exit_info:
        console_main()
    out = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 0
    assert says in out
    assert "Lightning Trainer command line tool" not in out
