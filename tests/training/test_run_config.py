"""The one function that strips run-specific keys from a saved config, and dotted look-ups through init_args."""

from kpca.training.run_config import config_value, without_keys

CONFIG = {
    "seed_everything": 1,
    "ckpt_path": "auto",
    "trainer": {"logger": {"class_path": "TensorBoardLogger", "init_args": {"save_dir": "logs", "version": 3}}},
    "model": {"evaluator": {"class_path": "RobustnessEvaluator", "init_args": {"report_name": "foo"}}},
}


def test_without_keys_removes_each_dotted_key_from_a_copy():
    stripped = without_keys(CONFIG, ["ckpt_path", "trainer.logger.init_args.version", "model.evaluator"])
    assert stripped == {
        "seed_everything": 1,
        "trainer": {"logger": {"class_path": "TensorBoardLogger", "init_args": {"save_dir": "logs"}}},
        "model": {},
    }
    assert CONFIG["trainer"]["logger"]["init_args"]["version"] == 3 and "ckpt_path" in CONFIG  # left as it was


def test_without_keys_skips_keys_whose_parents_are_absent_or_not_mappings():
    config = {"trainer": {"logger": None}, "data": [1, 2]}
    assert without_keys(config, ["trainer.logger.init_args.version", "data.cache_dir", "absent.key"]) == config
    assert without_keys({}, ["ckpt_path"]) == {}


def test_config_value_looks_through_init_args_as_the_cli_options_do():
    assert config_value(CONFIG, "model.evaluator.report_name") == "foo"
    assert config_value(CONFIG, "model.evaluator.init_args.report_name") == "foo"
    assert config_value({"model": {"evaluator": {"report_name": "bar"}}}, "model.evaluator.report_name") == "bar"
    assert config_value(CONFIG, "trainer.logger.version") == 3
    assert config_value(CONFIG, "model.evaluator.attacks") is None
    assert config_value({"model": {"evaluator": None}}, "model.evaluator.report_name") is None
