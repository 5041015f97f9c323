"""Data options that moved into a group: saved options and config files read at the new place."""

from pathlib import Path

import yaml

from kpca.training.checkpointing.resume import comparable, saved_config_is
from kpca.training.moved_options import Move, MovedConfigs, move_options

MOVED = {"re_prob": "train.re_prob", "hflip": "train.hflip"}


def test_old_keys_move_into_their_group_and_each_move_is_named():
    saved = {"batch_size": 8, "re_prob": 0.0, "hflip": 0.5, "eval": {"subset": 4}}
    moved, moves = move_options(saved, MOVED, "--ckpt_path x.ckpt")
    assert moved == {"batch_size": 8, "train": {"re_prob": 0.0, "hflip": 0.5}, "eval": {"subset": 4}}
    assert saved["re_prob"] == 0.0 and "train" not in saved  # the saved options are left as they are
    assert [move.text for move in moves] == [
        "--ckpt_path x.ckpt: data option re_prob is now data.train.re_prob (read as such)",
        "--ckpt_path x.ckpt: data option hflip is now data.train.hflip (read as such)",
    ]


def test_the_new_place_wins_and_a_class_path_section_moves_inside_its_init_args():
    moved, moves = move_options({"re_prob": 0.0, "train": {"re_prob": 0.3}}, MOVED, "c")
    assert moved == {"train": {"re_prob": 0.3}} and moves == [Move("re_prob", "train.re_prob", "c")]
    by_class = {"class_path": "a.B", "init_args": {"hflip": 0.0}}
    assert move_options(by_class, MOVED, "c")[0] == {"class_path": "a.B", "init_args": {"train": {"hflip": 0.0}}}
    assert move_options({"batch_size": 8}, MOVED, "c") == ({"batch_size": 8}, [])


def test_only_config_files_with_old_keys_are_replaced_by_moved_copies(tmp_path: Path):
    old, new, other = tmp_path / "old.yaml", tmp_path / "new.yaml", tmp_path / "other.yaml"
    old.write_text("data:\n  batch_size: 8\n  re_prob: 0.0\ntrainer:\n  max_epochs: 1\n")
    new.write_text("data:\n  train:\n    re_prob: 0.0\n")
    other.write_text("trainer: {max_epochs: 2}\n")
    args = ["test", "-c", str(new), "--config", str(old), f"--config={old}", "-c", str(other), "--data.re_prob=0"]
    words, moves = MovedConfigs().rewrite(args, MOVED)
    assert [words[i] for i in (0, 1, 2, 3, 6, 7, 8)] == [args[i] for i in (0, 1, 2, 3, 6, 7, 8)]
    copies = [Path(words[4]), Path(words[5].removeprefix("--config="))]
    assert words[5].startswith("--config=") and [copy.name for copy in copies] == ["old.yaml", "old.yaml"]
    for copy in copies:
        assert yaml.safe_load(copy.read_text()) == {
            "data": {"batch_size": 8, "train": {"re_prob": 0.0}},
            "trainer": {"max_epochs": 1},
        }
    assert [move.text for move in moves] == [
        f"config {old}: data option re_prob is now data.train.re_prob (read as such)"
    ] * 2
    assert MovedConfigs().rewrite(["fit", "-c", str(new)], MOVED) == (["fit", "-c", str(new)], [])


def test_a_run_saved_before_the_move_is_the_same_experiment_for_auto_resume(tmp_path: Path):
    """``fit --ckpt_path auto`` finds a run folder whose config.yaml spells a moved option flat."""
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump({"seed_everything": 0, "data": {"batch_size": 8, "re_prob": 0.0}}))
    current = comparable({"seed_everything": 0, "data": {"batch_size": 8, "train": {"re_prob": 0.0}}})
    assert saved_config_is(saved, current, {"re_prob": "train.re_prob"})
    assert not saved_config_is(saved, current)  # without the table it is another experiment
    assert not saved_config_is(saved, comparable({"seed_everything": 0, "data": {"train": {"re_prob": 0.25}}}))
