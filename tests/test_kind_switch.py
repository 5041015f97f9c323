"""Choosing an attention kind is one word in every app: the commands docs/attention.md shows, run as shown.

The page's "Choosing a kind" block shows one fit per app that types the kind alone over the app's RPC smoke config
(``n_iter: 2``). Each is run here as a user types it (the console script's function, from the repository root,
in this process: tests/console_support.py), briefly (``--trainer.fast_dev_run=1``, data in a scratch cache): it fits,
and its log names the setting it dropped. The same command with each of the robust family's kinds fits in every app,
and builds that kind's modules.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli_support import run_cli
from tests.console_support import console

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "attention.md"
SECTION = "## Choosing a kind: one word"
APPS = {"vision-cls": "vision_cls", "language-model": "language_model", "segmentation": "segmentation"}
FAMILY = {"twicing": "TwicingAttention", "neutreno": "NeuTRENOAttention", "elliptical": "EllipticalAttention"}
KIND_OPTION = "--model.net.init_args.attention.kind="


def shown_switches() -> list[list[str]]:
    """The commands of the first shell block of the page's section, split into words."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, f"{PAGE.name}: no shell block under {SECTION!r}"
    return [line.split() for line in block.group(1).splitlines() if line.strip()]


def brief(words: list[str], scratch: Path) -> list[str]:
    """The shown command's arguments, plus a one-batch fit whose data and outputs go under ``scratch``."""
    return [
        *words[1:], "--trainer.fast_dev_run=1", "--trainer.enable_progress_bar=false",
        f"--data.cache_dir={scratch / 'cache'}", f"--trainer.default_root_dir={scratch}",
    ]  # fmt: skip


def test_the_page_shows_one_switch_per_app_from_its_smoke_config():
    commands = shown_switches()
    assert [words[0] for words in commands] == list(APPS)
    for words in commands:
        assert words[1] == "fit" and f"configs/{APPS[words[0]]}/smoke.yaml" in words
        assert [word for word in words if word.startswith("--")] == [next(w for w in words if KIND_OPTION in w)]


@pytest.mark.parametrize("words", shown_switches(), ids=lambda words: words[0])
def test_the_shown_switch_runs_as_typed_and_says_what_it_dropped(
    words: list[str], tmp_path: Path, capfd: pytest.CaptureFixture
):
    done = console(capfd, words[0], REPO, *brief(words, tmp_path))  # capfd: sentencepiece writes to stderr's fd
    assert done.returncode == 0, done.stderr[-4000:]
    kind = next(word for word in words if KIND_OPTION in word).partition("=")[2]
    dropped = f"attention.n_iter=2 from configs/{APPS[words[0]]}/smoke.yaml does not apply to {kind}: dropped"
    assert dropped in done.stderr


@pytest.mark.parametrize("kind", list(FAMILY))
@pytest.mark.parametrize("program", list(APPS))
def test_every_app_fits_every_family_kind_typed_alone(program: str, kind: str, tmp_path: Path, monkeypatch):
    (words,) = [words for words in shown_switches() if words[0] == program]
    words = [f"{KIND_OPTION}{kind}" if KIND_OPTION in word else word for word in words]
    main = __import__(f"kpca.{APPS[program]}.cli", fromlist=["main"]).main
    monkeypatch.chdir(REPO)
    cli = run_cli(main, program, *brief(words, tmp_path))
    built = {type(module).__name__ for module in cli.model.modules()}
    assert FAMILY[kind] in built
    attention = cli.config.fit.model.net.init_args.attention
    assert (attention.kind, attention.n_iter) == (kind, None)


def test_null_can_be_typed_for_an_optional_setting(tmp_path: Path, monkeypatch):
    (words,) = [words for words in shown_switches() if words[0] == "vision-cls"]
    words = [f"{KIND_OPTION}rpc" if KIND_OPTION in word else word for word in words]
    from kpca.vision_cls.cli import main

    monkeypatch.chdir(REPO)
    cli = run_cli(main, "vision-cls", *brief(words, tmp_path), "--model.net.init_args.attention.lambd=null")
    assert cli.config.fit.model.net.init_args.attention.lambd is None
    assert {module.lambd for module in cli.model.modules() if type(module).__name__ == "RPCAttention"} == {4.0}
