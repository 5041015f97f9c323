"""Report tables: Markdown format, CSV beside it, name checks, and the optional console table."""

import csv
import logging

import pytest

from kpca.training.results.tables import markdown_table, write_report


def test_write_report(tmp_path):
    rows = [
        {"model": "deit_tiny", "attack": "pgd", "eps": 1 / 255, "acc1": 0.5},
        {"model": "rpc|symvit", "attack": "fgsm", "eps": 2 / 255, "acc1": None, "note": "x"},
    ]
    md_path, csv_path = write_report(rows, tmp_path / "reports", "attacks")
    assert md_path == tmp_path / "reports" / "attacks.md" and csv_path == tmp_path / "reports" / "attacks.csv"
    assert md_path.read_text() == (
        "| model | attack | eps | acc1 | note |\n"
        "| --- | --- | --- | --- | --- |\n"
        "| deit_tiny | pgd | 0.0039 | 0.5000 |  |\n"
        "| rpc\\|symvit | fgsm | 0.0078 |  | x |\n"
    )
    with csv_path.open(newline="") as stream:
        read = list(csv.DictReader(stream))
    assert list(read[0]) == ["model", "attack", "eps", "acc1", "note"]
    assert read[0]["eps"] == repr(1 / 255) and read[1]["acc1"] == "" and read[1]["model"] == "rpc|symvit"
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["attacks.csv", "attacks.md"]
    write_report(rows[:1], tmp_path / "reports", "attacks")
    assert md_path.read_text().count("\n") == 3


@pytest.mark.parametrize(
    ("rows", "name", "error", "match"),
    [
        ([], "r", ValueError, "rows is empty"),
        ([{"a": 1}], "../r", ValueError, "plain file stem.*'../r'"),
        ([{"a": 1}], "", ValueError, "plain file stem"),
        ([["a", 1]], "r", TypeError, "each row must be a mapping"),
    ],
)
def test_write_report_rejects_bad_input(tmp_path, rows, name, error, match):
    with pytest.raises(error, match=match):
        write_report(rows, tmp_path, name)


def test_markdown_table_columns_in_first_seen_order_with_4_decimal_floats():
    rows = [{"b": 1, "a": 2.0}, {"c": "z|y", "a": None, "b": 0.123456}]
    assert markdown_table(rows) == ("| b | a | c |\n| --- | --- | --- |\n| 1 | 2.0000 |  |\n| 0.1235 |  | z\\|y |\n")


def test_show_logs_the_markdown_table_at_info(tmp_path, caplog):
    rows = [{"dataset": "val", "acc1": 0.75}]
    table = markdown_table(rows)
    with caplog.at_level(logging.INFO, logger="kpca.training.results.tables"):
        md_path, _ = write_report(rows, tmp_path, "shown", show=True)
    shown = [r for r in caplog.records if r.name == "kpca.training.results.tables" and table in r.getMessage()]
    assert len(shown) == 1 and shown[0].levelno == logging.INFO and str(md_path) in shown[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kpca.training.results.tables"):
        write_report(rows, tmp_path, "hidden")
    messages = [r.getMessage() for r in caplog.records if r.name == "kpca.training.results.tables"]
    assert messages and not any(table in message for message in messages)  # only the "wrote ..." line
