"""Protocol provenance of the perplexity report: the rules against the shipped configs, and what ``test`` records.

The shipped combinations come from the CLI's own ``--print_config`` (the config a run saves).
"""

import json
from pathlib import Path

import pytest
import yaml

from kpca.language_model.cli import main
from kpca.language_model.perplexity import (
    CJK_WORD_SPLIT,
    PERPLEXITY_REPORT,
    SEES_LATER_TOKENS,
    write_perplexity_report,
)
from tests.cli_support import CONFIGS, printed_config

GPU = CONFIGS / "trainer" / "gpu_1x_bf16.yaml"
PUBLISHED = sorted((CONFIGS / "language_model").glob("*_published.yaml"))
OURS = sorted(set((CONFIGS / "language_model").glob("lm-*.yaml")) - set(PUBLISHED))
METRICS = ["valid/ppl", "valid_wordswap/ppl", "test/ppl", "test_wordswap/ppl"]


def texts(config: dict) -> dict[str, str]:
    return {group: protocol.text for group, protocol in PERPLEXITY_REPORT.protocol_of(config, METRICS).items()}


def test_the_shipped_configs_include_published_ones_and_ours():
    assert PUBLISHED and OURS and not set(PUBLISHED) & set(OURS)


@pytest.mark.parametrize("experiment", PUBLISHED, ids=lambda path: path.stem)
def test_the_published_configs_measure_clean_perplexity_as_the_authors(experiment: Path, capsys):
    # the authors' Elliptical sees later tokens of its segment, as theirs: noted, still their protocol
    notes = f"; note: {SEES_LATER_TOKENS}" if "elliptical" in experiment.stem else ""
    assert texts(printed_config(capsys, main, "language-model", "-c", GPU, "-c", experiment)) == {
        "clean": "published" + notes,
        "word_swap": f"ours: {CJK_WORD_SPLIT}" + notes,  # the one difference no setting removes: never published
    }


def test_only_the_authors_elliptical_lm_is_noted_as_seeing_later_tokens(capsys):
    (experiment,) = [path for path in PUBLISHED if "elliptical" in path.stem]
    authors = printed_config(capsys, main, "language-model", "-c", GPU, "-c", experiment)
    assert authors["model"]["net"]["init_args"]["attention"]["convention"] == "reference"
    clean = PERPLEXITY_REPORT.protocol_of(authors, METRICS)["clean"]
    assert clean.comparable_with_published and clean.notes == (SEES_LATER_TOKENS,)
    ours = printed_config(
        capsys, main, "language-model", "-c", GPU, "-c", experiment, "--model.net.init_args.attention.convention=causal"
    )
    assert PERPLEXITY_REPORT.protocol_of(ours, METRICS)["clean"].text == "published"


@pytest.mark.parametrize("experiment", OURS, ids=lambda path: path.stem)
def test_our_configs_name_each_difference(experiment: Path, capsys):
    window = (
        "text_files=raw (published: tokens); tokenizer=sentencepiece (published: word); "
        "eval_stride=128 (published: 1); score_first_token=true (published: false)"
    )
    assert texts(printed_config(capsys, main, "language-model", "-c", GPU, "-c", experiment)) == {
        "clean": f"ours: {window}",
        "word_swap": f"ours: {window}; word_swap=uniform (published: textattack); {CJK_WORD_SPLIT}",
    }


def rows() -> list[dict]:
    row = {"tokens": 10, "words": 8, "nll_token": 1.0, "ppl_token": 2.7, "ppl_word": 3.5, "complete": True}
    return [{"set": "valid", **row}, {"set": "valid_wordswap", **row, "ppl_word": 4.0}]


def report_of(kind: str, folder: Path) -> dict:
    """``protocol.json`` of a report written beside the shipped ``_published`` config of ``kind``."""
    (experiment,) = [path for path in PUBLISHED if f"_{kind}_" in path.stem]
    config = yaml.safe_load(experiment.read_text())
    config["trainer"] |= {"limit_test_batches": None, "fast_dev_run": False}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    write_perplexity_report(rows(), folder)
    return json.loads((folder / "protocol.json").read_text())


def test_the_authors_elliptical_lm_report_says_it_sees_later_tokens(tmp_path: Path):
    record = report_of("elliptical", tmp_path)
    assert record["clean"]["comparable_with_published"] is True and record["clean"]["notes"] == [SEES_LATER_TOKENS]
    assert f"- `clean`: published; note: {SEES_LATER_TOKENS}" in (tmp_path / "perplexity.md").read_text()


def test_the_report_records_the_protocol_of_the_config_saved_beside_it(tmp_path: Path):
    record = report_of("softmax", tmp_path)
    assert record["clean"] == {"protocol": "published", "comparable_with_published": True, "differences": []}
    assert record["word_swap"]["comparable_with_published"] is False
    assert record["word_swap"]["differences"] == [CJK_WORD_SPLIT]
    markdown = (tmp_path / "perplexity.md").read_text()
    assert markdown.startswith("| set | tokens |") and "## Protocol" in markdown
    assert "- `clean`: published\n" in markdown and f"- `word_swap`: ours: {CJK_WORD_SPLIT}\n" in markdown
    assert (tmp_path / "perplexity.csv").read_text().splitlines()[0].startswith("set,tokens,words,")


def test_a_null_eval_stride_is_named_by_what_it_means():
    config = {"data": {"eval_stride": None}}
    assert PERPLEXITY_REPORT.protocol_of(config)["clean"].differences[4] == "eval_stride=context / 2 (published: 1)"


def test_a_report_without_a_saved_config_says_its_protocol_is_not_recorded(tmp_path: Path):
    write_perplexity_report(rows(), tmp_path)
    assert not (tmp_path / "protocol.json").exists()
    assert f"Not recorded: {tmp_path} holds no config.yaml" in (tmp_path / "perplexity.md").read_text()
