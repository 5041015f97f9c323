"""The ``--ckpt_path`` rule on plain configs: typed options over the trained ones, and what then differs."""

import pytest
import torch

from kpca.training.checkpointing.trained_options import (
    OptionDifference,
    check_weights_fit,
    option_differences,
    run_differences,
    trained_model_options,
    typed_over_trained,
    weight_mismatches,
)
from kpca.training.errors import OptionError

NET = "kpca.vision_cls.model.ViTClassifier"
TRAINED = {
    "net": {"class_path": NET, "init_args": {"embed_dim": 32, "attention": {"kind": "rpc", "n_iter": 2}}},
    "mixup_alpha": 0.8,
}


def test_typed_options_replace_the_trained_ones_and_the_rest_stays():
    typed = {"net": {"class_path": NET, "init_args": {"attention": {"n_iter": 6}}}}
    merged = typed_over_trained(TRAINED, typed)
    assert merged["net"]["init_args"] == {"embed_dim": 32, "attention": {"kind": "rpc", "n_iter": 6}}
    assert merged["mixup_alpha"] == 0.8
    assert TRAINED["net"]["init_args"]["attention"]["n_iter"] == 2  # the trained options are left as they are


def test_another_class_replaces_the_trained_class_whole():
    typed = {"net": {"class_path": "other.Net", "init_args": {"width": 8}}}
    assert typed_over_trained(TRAINED, typed)["net"] == {"class_path": "other.Net", "init_args": {"width": 8}}


def test_differences_name_the_option_as_typed_with_both_values():
    used = typed_over_trained(TRAINED, {"net": {"init_args": {"attention": {"n_iter": 6}}}, "mixup_alpha": 0.0})
    differences = option_differences(TRAINED, used)
    assert [d.text for d in differences] == [
        "model.net.init_args.attention.n_iter=6 (trained with 2)",
        "model.mixup_alpha=0.0 (trained with 0.8)",
    ]
    assert differences[0].short == "n_iter=2"
    assert option_differences(TRAINED, {"mixup_alpha": 0.8}) == []  # an option only one side records is not compared


def _checkpoint(path, state, hparams):
    torch.save({"state_dict": state, "hyper_parameters": {"_instantiator": "x", **hparams}}, path)
    return path


def test_the_checkpoint_options_and_a_saved_run_config_compare(tmp_path):
    ckpt = _checkpoint(tmp_path / "a.ckpt", {"w": torch.zeros(2)}, TRAINED)
    assert trained_model_options(ckpt) == TRAINED
    config = {"ckpt_path": str(ckpt), "model": typed_over_trained(TRAINED, {"mixup_alpha": 0.0})}
    assert run_differences(config) == [OptionDifference("model.mixup_alpha", 0.8, 0.0)]
    assert run_differences({**config, "ckpt_path": str(tmp_path / "gone.ckpt")}) == []


def test_weights_that_do_not_fit_differing_options_are_refused_with_both_values(tmp_path):
    ckpt = _checkpoint(tmp_path / "a.ckpt", {"w": torch.zeros(2), "old": torch.zeros(1)}, TRAINED)
    model = {"w": torch.zeros(3), "new": torch.zeros(1)}
    assert weight_mismatches(model, ckpt) == [
        "w (checkpoint [2], model [3])",
        "old (checkpoint only)",
        "new (model only)",
    ]
    difference = OptionDifference("model.net.init_args.embed_dim", 32, 48)
    with pytest.raises(OptionError, match=r"embed_dim=48 \(trained with 32\).*w \(checkpoint \[2\], model \[3\]\)"):
        check_weights_fit(model, ckpt, [difference])
    check_weights_fit(model, ckpt, [])  # no option differs: Lightning's loading reports it
    check_weights_fit({"w": torch.ones(2), "old": torch.ones(1)}, ckpt, [difference])  # the weights fit: it runs


def test_a_function_option_compares_by_its_import_path_as_the_checkpoint_saved_it():
    from kpca.segmentation.module import segmenter_sgd  # Segmenter's optimizer option, a function

    trained = {"optimizer": "kpca.segmentation.module.segmenter_sgd", "lr": 0.001}
    assert option_differences(trained, {"optimizer": segmenter_sgd, "lr": 0.001}) == []
    (difference,) = option_differences(trained, {"optimizer": OptionDifference, "lr": 0.001})
    assert difference.text == (
        "model.optimizer=kpca.training.checkpointing.trained_options.OptionDifference "
        "(trained with kpca.segmentation.module.segmenter_sgd)"
    )
