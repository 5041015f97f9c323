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


def test_kpca_experiment_help_says_what_each_subcommand_does(capsys):
    from kpca.training.experiment.cli import main  # what the kpca-experiment console script runs

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 0
    assert "Run an experiment plan" in out and "kpca-experiment run configs/experiments/" in out
    for subcommand, says in [
        ("run", "Run every step of every run and seed of the plan that is not done yet"),
        ("status", "done, running, failed (with its log), interrupted or not started"),
        ("report", "Write the plan's report"),
        ("validate", "Check plan files without running anything"),
        ("exec", "Run one step of one run and seed"),
    ]:
        assert says in out, subcommand
        with pytest.raises(SystemExit):
            main([subcommand, "--help"])
        assert says in " ".join(capsys.readouterr().out.split()), subcommand
