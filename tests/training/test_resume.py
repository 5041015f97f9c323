"""Automatic resume: damaged checkpoints are recognised, and the newest readable one of this experiment is found."""

import os
import zipfile
from pathlib import Path

import pytest
import torch

from kpca.training.checkpointing.resume import (
    RUN_FOLDER_KEY,
    Resume,
    check_checkpoint,
    checkpoint_problem,
    comparable,
    find_resume,
    read_step,
    record_run_folder,
    version_glob,
)

T0 = 1_700_000_000 * 10**9  # a fixed mtime base in ns; each test orders its files by offsets from it


def save(path: Path, step: int, run_folder: Path | None = None, mtime_s: int = 0) -> Path:
    """A small ``torch.save`` checkpoint at ``path`` with ``global_step`` and run folder, mtime ``T0 + mtime_s``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {"global_step": step, "state_dict": {"w": torch.full((3,), float(step))}}
    if run_folder is not None:
        checkpoint[RUN_FOLDER_KEY] = str(run_folder.resolve())
    torch.save(checkpoint, path)
    set_mtime(path, mtime_s)
    return path


def set_mtime(path: Path, mtime_s: int) -> None:
    os.utime(path, ns=(T0 + mtime_s * 10**9, T0 + mtime_s * 10**9))


def truncate(path: Path) -> None:
    """Keep the first half of the file's bytes, as a node killed while copying it leaves it (mtime kept)."""
    stat = path.stat()
    path.write_bytes(path.read_bytes()[: stat.st_size // 2])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def run_folder(exp: Path, name: str, config: str = "same") -> Path:
    folder = exp / name
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text(f"run: {config}\n", encoding="utf-8")
    return folder


def same_config(folder: Path) -> bool:
    path = folder / "config.yaml"
    return path.is_file() and path.read_text(encoding="utf-8") == "run: same\n"


@pytest.fixture
def tree(tmp_path) -> tuple[Path, Path, Path, Path]:
    """``exp/version_0`` (steps 10, 20) and ``exp/version_1`` (steps 30, 40), both this config; an empty hpc dir."""
    exp, hpc = tmp_path / "exp", tmp_path / "root"
    hpc.mkdir()
    v0, v1 = run_folder(exp, "version_0"), run_folder(exp, "version_1")
    save(v0 / "checkpoints" / "best-000.ckpt", 10, v0, mtime_s=1)
    save(v0 / "checkpoints" / "last.ckpt", 20, v0, mtime_s=2)
    save(v1 / "checkpoints" / "best-000.ckpt", 30, v1, mtime_s=3)
    save(v1 / "checkpoints" / "last.ckpt", 40, v1, mtime_s=4)
    return exp, hpc, v0, v1


# checkpoint_problem / check_checkpoint


def test_checkpoint_problem_accepts_a_complete_checkpoint(tmp_path):
    assert checkpoint_problem(save(tmp_path / "a.ckpt", 3)) is None


def test_checkpoint_problem_names_a_missing_file(tmp_path):
    assert "does not exist" in checkpoint_problem(tmp_path / "missing.ckpt")


def test_checkpoint_problem_names_a_folder(tmp_path):
    """A folder given as ``--ckpt_path`` exists: the problem says it is a folder, not that it is missing."""
    problem = checkpoint_problem(tmp_path)
    assert problem is not None and "folder" in problem and "does not exist" not in problem


def test_checkpoint_problem_names_an_empty_file(tmp_path):
    path = tmp_path / "empty.ckpt"
    path.touch()
    assert "empty" in checkpoint_problem(path)


def test_checkpoint_problem_names_a_truncated_file(tmp_path):
    path = save(tmp_path / "half.ckpt", 3)
    truncate(path)
    assert path.stat().st_size > 0
    assert "truncated" in checkpoint_problem(path)


def test_checkpoint_problem_names_a_text_file(tmp_path):
    path = tmp_path / "notes.ckpt"
    path.write_text("not a checkpoint\n", encoding="utf-8")
    assert "not a checkpoint (File is not a zip file)" in checkpoint_problem(path)


def test_checkpoint_problem_names_a_zip_without_pickle(tmp_path):
    path = tmp_path / "other.ckpt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/readme.txt", "hello")
    assert "not a torch.save checkpoint" in checkpoint_problem(path)


def test_check_checkpoint_passes_a_complete_checkpoint(tmp_path):
    check_checkpoint(save(tmp_path / "a.ckpt", 3))


def test_check_checkpoint_names_the_path_and_auto_resume(tmp_path):
    path = save(tmp_path / "half.ckpt", 3)
    truncate(path)
    with pytest.raises(ValueError, match="truncated") as error:
        check_checkpoint(path)
    assert str(path) in str(error.value)
    assert "--ckpt_path auto" in str(error.value)


def test_check_checkpoint_refuses_a_missing_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        check_checkpoint(tmp_path / "missing.ckpt")


# read_step / record_run_folder


def test_read_step_returns_the_step_and_run_folder(tmp_path):
    folder = tmp_path / "exp" / "version_2"
    assert read_step(save(tmp_path / "a.ckpt", 17, folder)) == (17, str(folder.resolve()))


def test_read_step_without_a_run_folder(tmp_path):
    assert read_step(save(tmp_path / "a.ckpt", 5)) == (5, None)


def test_record_run_folder_stores_a_resolved_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkpoint = {"global_step": 1}
    record_run_folder(checkpoint, "logs/exp/../exp/version_0")
    assert checkpoint[RUN_FOLDER_KEY] == str((tmp_path / "logs" / "exp" / "version_0").resolve())
    assert isinstance(checkpoint[RUN_FOLDER_KEY], str)  # loadable with weights_only=True


def test_record_run_folder_ignores_none():
    checkpoint = {"global_step": 1}
    record_run_folder(checkpoint, None)
    assert checkpoint == {"global_step": 1}


# find_resume


def test_find_resume_picks_the_newest_checkpoint(tree):
    exp, hpc, _, v1 = tree
    resume = find_resume(exp, hpc, same_config)
    assert resume.checkpoint == v1.resolve() / "checkpoints" / "last.ckpt"
    assert resume.run_folder == v1.resolve()
    assert resume.step == 40
    assert resume.skipped == []


def test_find_resume_follows_the_mtime_not_the_folder_name(tree):
    exp, hpc, v0, _ = tree
    set_mtime(v0 / "checkpoints" / "best-000.ckpt", 9)
    resume = find_resume(exp, hpc, same_config)
    assert resume.checkpoint == v0.resolve() / "checkpoints" / "best-000.ckpt"
    assert (resume.run_folder, resume.step) == (v0.resolve(), 10)


def test_find_resume_skips_a_truncated_checkpoint(tree):
    exp, hpc, _, v1 = tree
    damaged = v1 / "checkpoints" / "last.ckpt"
    truncate(damaged)
    resume = find_resume(exp, hpc, same_config)
    assert resume.checkpoint == v1.resolve() / "checkpoints" / "best-000.ckpt"
    assert (resume.run_folder, resume.step) == (v1.resolve(), 30)
    assert len(resume.skipped) == 1
    path, reason = resume.skipped[0]
    assert Path(path).resolve() == damaged.resolve()
    assert "truncated" in reason


def test_find_resume_skips_every_damaged_checkpoint_down_to_a_readable_one(tree):
    exp, hpc, v0, v1 = tree
    truncate(v1 / "checkpoints" / "last.ckpt")
    (v1 / "checkpoints" / "best-000.ckpt").write_bytes(b"")
    set_mtime(v1 / "checkpoints" / "best-000.ckpt", 3)
    resume = find_resume(exp, hpc, same_config)
    assert resume.checkpoint == v0.resolve() / "checkpoints" / "last.ckpt"
    assert (resume.run_folder, resume.step) == (v0.resolve(), 20)
    assert [Path(path).name for path, _ in resume.skipped] == ["last.ckpt", "best-000.ckpt"]


def test_find_resume_ignores_folders_of_another_config(tree):
    exp, hpc, v0, _ = tree
    other = run_folder(exp, "version_2", config="other")
    save(other / "checkpoints" / "last.ckpt", 99, other, mtime_s=10)
    resume = find_resume(exp, hpc, same_config)
    assert (resume.checkpoint.parent.parent, resume.step) == (exp.resolve() / "version_1", 40)
    assert resume.skipped == []  # not a candidate at all
    resume = find_resume(exp, hpc, lambda folder: folder.name == "version_0")
    assert (resume.run_folder, resume.step) == (v0.resolve(), 20)


def test_find_resume_ignores_a_folder_without_checkpoints(tmp_path):
    exp, hpc = tmp_path / "exp", tmp_path / "root"
    hpc.mkdir()
    run_folder(exp, "version_0")
    assert find_resume(exp, hpc, same_config) == Resume()


def test_find_resume_picks_a_newer_hpc_checkpoint_of_a_matching_folder(tree):
    exp, hpc, v0, _ = tree
    hpc_ckpt = save(hpc / "hpc_ckpt_3.ckpt", 50, v0, mtime_s=5)
    resume = find_resume(exp, hpc, same_config)
    assert resume.checkpoint.resolve() == hpc_ckpt.resolve()
    assert resume.run_folder == v0.resolve()  # the run folder recorded in it, not the hpc dir
    assert resume.step == 50
    assert resume.skipped == []


def test_find_resume_skips_an_hpc_checkpoint_of_another_folder(tree):
    exp, hpc, _, v1 = tree
    other = run_folder(exp, "version_2", config="other")
    hpc_ckpt = save(hpc / "hpc_ckpt_3.ckpt", 50, other, mtime_s=5)
    resume = find_resume(exp, hpc, same_config)
    assert resume.checkpoint == v1.resolve() / "checkpoints" / "last.ckpt"
    assert (resume.run_folder, resume.step) == (v1.resolve(), 40)
    assert len(resume.skipped) == 1
    path, reason = resume.skipped[0]
    assert Path(path).resolve() == hpc_ckpt.resolve()
    assert "another experiment" in reason


def test_find_resume_skips_an_hpc_checkpoint_without_a_run_folder(tree):
    exp, hpc, _, v1 = tree
    save(hpc / "hpc_ckpt_1.ckpt", 50, None, mtime_s=5)
    resume = find_resume(exp, hpc, same_config)
    assert (resume.run_folder, resume.step) == (v1.resolve(), 40)
    assert [Path(path).name for path, _ in resume.skipped] == ["hpc_ckpt_1.ckpt"]


def test_find_resume_restricted_to_one_version(tree):
    exp, hpc, v0, v1 = tree
    save(hpc / "hpc_ckpt_3.ckpt", 50, v1, mtime_s=6)  # of version_1, so outside version_0 as well
    resume = find_resume(exp, hpc, same_config, versions="version_0")
    assert resume.checkpoint == v0.resolve() / "checkpoints" / "last.ckpt"
    assert (resume.run_folder, resume.step) == (v0.resolve(), 20)
    set_mtime(v0 / "checkpoints" / "last.ckpt", 9)  # newest overall, yet not in version_1
    resume = find_resume(exp, hpc, same_config, versions="version_1")
    assert resume.run_folder == v1.resolve()
    assert resume.step == 50  # the hpc checkpoint of version_1


def test_find_resume_returns_nothing_when_nothing_matches(tree, tmp_path):
    exp, hpc, _, _ = tree
    assert find_resume(exp, hpc, lambda folder: False) == Resume()
    assert find_resume(exp, hpc, same_config, versions="version_7") == Resume()
    assert find_resume(tmp_path / "absent", hpc, same_config) == Resume()
    assert find_resume(exp, hpc, lambda folder: False).checkpoint is None


def test_find_resume_prefers_last_at_equal_times(tmp_path):
    exp, hpc = tmp_path / "exp", tmp_path / "root"
    hpc.mkdir()
    folder = run_folder(exp, "version_0")
    for name in ("best-000.ckpt", "best-001.ckpt", "best-002.ckpt", "last.ckpt", "zz.ckpt"):
        save(folder / "checkpoints" / name, 7 if name == "last.ckpt" else 6, folder, mtime_s=3)
    resume = find_resume(exp, hpc, same_config)
    assert resume.checkpoint == folder.resolve() / "checkpoints" / "last.ckpt"
    assert resume.step == 7


# ProjectCLI helpers


def test_comparable_drops_only_what_resuming_sets():
    config = {
        "ckpt_path": "auto",
        "config": ["configs/a.yaml"],
        "seed_everything": 1,
        "version": 4,
        "trainer": {
            "max_steps": 10,
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": "logs", "name": "exp", "version": 3, "purge_step": 120},
            },
        },
        "model": {"init_args": {"version": 2, "ckpt_path": "x", "purge_step": 1, "config": "c"}},
    }
    assert comparable(config) == {
        "seed_everything": 1,
        "version": 4,
        "trainer": {
            "max_steps": 10,
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": "logs", "name": "exp"},
            },
        },
        "model": {"init_args": {"version": 2, "ckpt_path": "x", "purge_step": 1, "config": "c"}},
    }


def test_comparable_of_configs_without_the_keys():
    assert comparable({"trainer": {"logger": None}, "a": 1}) == {"trainer": {"logger": None}, "a": 1}
    assert comparable({"trainer": {"logger": False}}) == {"trainer": {"logger": False}}
    assert comparable({}) == {}


def test_comparable_makes_a_resumed_config_equal():
    def config(version, purge_step, ckpt_path):
        logger = {"init_args": {"save_dir": "logs", "version": version, "purge_step": purge_step}}
        return {"ckpt_path": ckpt_path, "trainer": {"logger": logger, "max_epochs": 3}}

    assert comparable(config(None, None, "auto")) == comparable(config("version_0", 40, "a"))
    different = config(None, None, "auto")
    different["trainer"]["max_epochs"] = 4
    assert comparable(different) != comparable(config(None, None, "auto"))


def testversion_glob():
    assert version_glob(None) == "version_*"
    assert version_glob(3) == "version_3"
    assert version_glob(0) == "version_0"
    assert version_glob("run_a") == "run_a"


def test_comparable_ignores_model_compile():
    """Compiling changes how the network runs, not what it is: a compiled rerun resumes the eager run."""
    config = {"model": {"compile": False, "lr": 0.1}, "trainer": {"max_epochs": 3}}
    compiled = {"model": {"compile": {"mode": "max-autotune"}, "lr": 0.1}, "trainer": {"max_epochs": 3}}
    assert comparable(config) == comparable(compiled)


def _saved(attention: dict, decoder_attention: dict) -> dict:
    """A saved config holding two attention groups (Segmenter's), with the fields every group saves."""
    every = {"layers": "all", "backend": "auto", "num_tokens": None}
    groups = {"attention": {**attention, **every}, "decoder_attention": {**decoder_attention, **every}}
    return {"model": {"net": {"init_args": groups}}}


def test_a_run_saved_before_each_kind_owned_its_settings_is_the_same_experiment():
    """``fit --ckpt_path auto`` after the upgrade finds the run: its saved attention groups compare in one form."""
    then = {"n_iter": 4, "lambd": 4.0, "convention": "reference"}  # every setting saved, at the former defaults
    now = dict.fromkeys(("n_iter", "lambd", "convention"))  # what was chosen: nothing
    saved_then = _saved({"kind": "rpc", **then, "n_iter": 2}, {"kind": "symmetric", **then})
    dumped_now = _saved({"kind": "rpc", **now, "n_iter": 2}, {"kind": "symmetric", **now})
    assert comparable(saved_then) == comparable(dumped_now)
    other = _saved({"kind": "rpc", **now, "n_iter": 6}, {"kind": "symmetric", **now})
    assert comparable(other) != comparable(dumped_now)
    neutreno = {"kind": "neutreno", **now, "layers": "all"}
    assert comparable(neutreno)["lambd"] is None  # its default depends on the task: left as chosen
