"""Each package README's module table names every module of the package, and only modules that exist.

The table's rows are ``| `name` | what it holds |``: a module ``name.py`` has a row of its own, a sub-package a row
``name/`` whose text names each of its modules in code (``io``, ``callback``, ...). ``__init__.py`` and
``__main__.py`` are the package (or sub-package) itself and need no entry. The app READMEs list no modules (their
docs/<app>.md pages describe the apps by topic), so only the two packages are checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PACKAGES = {
    "packages/attention/README.md": "packages/attention/src/kpca/attention",
    "packages/training/README.md": "packages/training/src/kpca/training",
}
"""Each package README and the source folder of the package it describes."""

PACKAGE_FILES = {"__init__.py", "__main__.py"}
CODE = re.compile(r"`([^`]+)`")


def modules(source: Path) -> list[tuple[str, ...]]:
    """Every module and sub-package under ``source``, as path parts without ``.py`` (``("checkpointing", "io")``)."""
    found = []
    for path in sorted(source.rglob("*")):
        parts = path.relative_to(source).parts
        if "__pycache__" in parts:
            continue
        if path.is_file() and path.suffix == ".py" and path.name not in PACKAGE_FILES:
            found.append((*parts[:-1], path.stem))
        elif path.is_dir() and (path / "__init__.py").is_file():
            found.append(parts)
    return found


def module_table(readme: str) -> dict[str, list[str]]:
    """The README's table rows: the first cell's name (``cli``, ``checkpointing/``) -> the code spans of the row."""
    rows = {}
    for line in readme.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2 and (names := CODE.findall(cells[0])):
            for name in names:
                rows[name] = CODE.findall("|".join(cells[1:]))
    return rows


def is_named(module: tuple[str, ...], rows: dict[str, list[str]]) -> bool:
    """Whether ``module`` has a row (``name``, ``name/``) or is named in code in its parent sub-package's row."""
    path = "/".join(module)
    if path in rows or f"{path}/" in rows or f"{path}.py" in rows:
        return True
    parent = "/".join(module[:-1]) + "/"
    return len(module) > 1 and parent in rows and (module[-1] in rows[parent] or f"{module[-1]}/" in rows[parent])


@pytest.mark.parametrize("readme", list(PACKAGES))
def test_every_module_is_in_the_readme(readme: str):
    rows = module_table((REPO / readme).read_text(encoding="utf-8"))
    missing = ["/".join(m) for m in modules(REPO / PACKAGES[readme]) if not is_named(m, rows)]
    assert not missing, (
        f"{readme} does not name these modules of {PACKAGES[readme]}: {missing}; add a row | `name` | what it "
        "holds | (a sub-package's module: name it in code in the sub-package's `name/` row)"
    )


@pytest.mark.parametrize("readme", list(PACKAGES))
def test_every_row_of_the_readme_is_a_module(readme: str):
    """A row for a module that was renamed or removed fails too (the table names only what exists)."""
    existing = {"/".join(m) for m in modules(REPO / PACKAGES[readme])}
    rows = module_table((REPO / readme).read_text(encoding="utf-8"))
    stale = [name for name in rows if name.strip("/") not in existing]
    assert not stale, f"{readme} has rows for modules {PACKAGES[readme]} does not have: {stale}"


def test_the_check_reads_rows_and_sub_package_rows():
    readme = "\n".join(
        [
            "| module | what it holds |",
            "|---|---|",
            "| `cli` | the base CLI (`ProjectCLI`) |",
            "| `checkpointing/` | `io` (`AtomicCheckpointIO`), `resume` |",
            "| `files`, `run_lock` | file writes and locks |",
        ]
    )
    rows = module_table(readme)
    assert set(rows) == {"cli", "checkpointing/", "files", "run_lock"}
    named = [("cli",), ("checkpointing",), ("checkpointing", "io"), ("checkpointing", "resume"), ("run_lock",)]
    assert all(is_named(module, rows) for module in named)
    assert not is_named(("data_check",), rows)
    assert not is_named(("checkpointing", "origin"), rows)
    assert not is_named(("AtomicCheckpointIO",), rows)  # named in a row's text, not a row of its own


def test_the_packages_have_sub_packages_and_modules():
    """The walk finds modules and sub-packages (an empty walk would pass every test above)."""
    training = modules(REPO / PACKAGES["packages/training/README.md"])
    assert {("cli",), ("checkpointing",), ("checkpointing", "io"), ("experiment",), ("experiment", "plan")} <= set(
        training
    )
    assert ("experiment", "__main__") not in training and ("attention", "__init__") not in training
    assert ("_triton", "kernels") in modules(REPO / PACKAGES["packages/attention/README.md"])
