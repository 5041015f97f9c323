"""The documentation names only things that exist: repository paths, make targets, kpca modules, links.

Checked in README.md, CHANGELOG.md, docs/*.md and every packages/*/README.md and apps/*/README.md:

- every repository path named in inline code, in a fenced code block or as a Markdown link exists (brace
  lists and ``*`` / ``<placeholder>`` segments must match at least one file; a ``:line`` suffix is ignored);
- every ``make <target>`` is a target of the Makefile;
- every relative Markdown link resolves, and its ``#anchor`` is a heading of the target page;
- every ``kpca.<module>[.<name>]`` resolves to a module of the repository and a name defined there (not in
  CHANGELOG.md, whose history names modules that no longer exist);
- no page points outside the repository (``shared/``, ``paper.md``, ``/work/``);
- the guides speak in the present tense: no page but CHANGELOG.md names one of the project's issues (``issue 37``,
  ``(#37)``); history belongs in CHANGELOG.md. A reference to another repository's issue (``owner/repo#123``) is
  fine.

A path counts as a repository path when its first segment is one of the repository's top-level entries
(``ROOTS``); anything else (``runs/...``, ``~/.cache/kpca``, ``/data/imagenet``, metric keys such as
``val/acc1``, files of other repositories) is not checked.
"""

from __future__ import annotations

import glob
import os
import re
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

ROOTS = (
    ".ci",
    "apps",
    "benchmarks",
    "configs",
    "docker",
    "docs",
    "packages",
    "requirements",
    "tests",
    "tools",
    "CHANGELOG.md",
    "Makefile",
    "README.md",
    "pyproject.toml",
)
"""The repository's top-level entries: a path starting with one of these is a repository path."""

GENERATED = {
    "benchmarks/results/attention_cuda.md": "written by `make test-gpu` on a CUDA machine, not committed",
    "benchmarks/results/": "the folder `make test-gpu` writes its report into",
}
"""Repository paths the docs may name although they are not in a checkout, each with the reason."""

FORBIDDEN = {
    "shared/": "the repository stands alone: no page points at the project's shared notes",
    "paper.md": "not in the repository: cite the paper by its public URL",
    "/work/": "an absolute path of one machine",
}

MODULE_CHECK_EXCLUDED = {"CHANGELOG.md"}  # history names the modules it renamed or removed

HISTORY_PAGES = {"CHANGELOG.md"}  # the one page that tells history, issue numbers included

PROJECT_ISSUE = re.compile(r"\bissues?\s+#?\d+|(?<![\w/.-])#\d+\b", re.I)
"""A project issue named in prose: ``issue 37``, ``issues 35``, ``issue #37``, ``#37`` (not ``owner/repo#37``)."""

ENTRY_POINT_GROUPS = {"kpca.reports": "the entry-point group kpca-report reads; declared in apps/*/pyproject.toml"}
"""Dotted names that are not modules, each with what it is (checked to be declared by some pyproject.toml)."""


def doc_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
    files += sorted(REPO.glob("packages/*/README.md")) + sorted(REPO.glob("apps/*/README.md"))
    return files


def doc_id(path: Path) -> str:
    return str(path.relative_to(REPO))


DOCS = doc_files()

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
MAKE = re.compile(r"(?:^|[\s`(])make\s+([A-Za-z][\w-]*)")
MODULE = re.compile(r"(?<![\w./-])kpca(?:\.[A-Za-z_]\w*)+")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def split_code(text: str) -> tuple[list[str], list[str], str]:
    """Fenced blocks, inline code spans, and the prose with both removed."""
    blocks = [m.group(2) for m in FENCE.finditer(text)]
    prose = FENCE.sub("\n", text)
    spans = [m.group(2).strip() for m in INLINE_CODE.finditer(prose)]
    prose = INLINE_CODE.sub(" ", prose)
    return blocks, spans, prose


def expand_braces(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [out for option in match.group(1).split(",") for out in expand_braces(head + option + tail)]


def path_candidate(token: str) -> str | None:
    """The repository path ``token`` names, or None when it names none."""
    token = token.strip().strip("\"'").rstrip(".,;:)")
    token = re.sub(r":\d+(?:-\d+)?(?:,\s*\d+(?:-\d+)?)*$", "", token)  # file.py:12-34
    if not token or "://" in token or token.startswith(("/", "~", "$", "-", ".venv")):
        return None
    if " " in token and not re.search(r"\{[^}]* [^}]*\}", token):
        return None
    first = token.split("/", 1)[0]
    if first not in ROOTS:
        return None
    return token


def path_exists(candidate: str) -> bool:
    if candidate in GENERATED:
        return True
    for pattern in expand_braces(candidate.replace(" ", "")):
        pattern = re.sub(r"<[^<>/]+>", "*", pattern)
        if any(ch in pattern for ch in "*?["):
            if not glob.glob(str(REPO / pattern)):
                return False
        elif not (REPO / pattern).exists():
            return False
    return True


def named_paths(text: str) -> set[str]:
    blocks, spans, _ = split_code(text)
    tokens = list(spans)
    for block in blocks:
        tokens += re.split(r"[\s=]+", block)
    for span in spans:  # `make test-gpu` writes `benchmarks/...` or a command in backticks
        tokens += span.split()
    out = {c for c in (path_candidate(t) for t in tokens) if c}
    return out


def links(text: str) -> list[str]:
    _, _, prose = split_code(text)
    return [m.group(1) for m in LINK.finditer(prose)]


def make_targets() -> set[str]:
    targets = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z][\w .-]*?)\s*:(?!=)", line)
        if match and not line.startswith((".", "\t")):
            targets.update(match.group(1).split())
    return targets


def named_make_targets(text: str) -> set[str]:
    blocks, spans, _ = split_code(text)
    found = set()
    for chunk in spans:
        found.update(MAKE.findall(chunk))
    for block in blocks:
        for line in block.splitlines():
            found.update(MAKE.findall(line.split("#", 1)[0]))  # not in a shell comment
    return found


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    kept = []
    for ch in text:
        if ch in " -_" or unicodedata.category(ch)[0] in "LNM":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("\n", path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(text):
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        out.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return out


def module_sources() -> list[Path]:
    return sorted(REPO.glob("packages/*/src")) + sorted(REPO.glob("apps/*/src"))


def resolve_module(dotted: str) -> str | None:
    """None when ``dotted`` is a kpca module or a name defined in one, else what is wrong."""
    if dotted in ENTRY_POINT_GROUPS:
        declared = any(f'entry-points."{dotted}"' in p.read_text() for p in REPO.glob("*/*/pyproject.toml"))
        return None if declared else f"no pyproject.toml declares the entry-point group {dotted!r}"
    parts = dotted.split(".")
    for n in range(len(parts), 1, -1):
        for src in module_sources():
            base = src.joinpath(*parts[:n])
            for file in (base.with_suffix(".py"), base / "__init__.py"):
                if file.is_file():
                    rest = parts[n:]
                    if not rest or defines(file.read_text(), rest[0]):
                        return None
                    return f"{'.'.join(parts[:n])} ({file.relative_to(REPO)}) defines no {rest[0]!r}"
    return f"no module {'.'.join(parts[:2])} in packages/*/src or apps/*/src"


def defines(source: str, name: str) -> bool:
    n = re.escape(name)
    patterns = (
        rf"^\s*(?:async\s+)?def\s+{n}\b",
        rf"^\s*class\s+{n}\b",
        rf"^\s*{n}\s*(?::|=)",
        rf"^\s*(?:from\s+\S+\s+)?import\s+[^\n]*\b{n}\b",
        rf"^\s+{n},?\s*$",  # one name per line in a parenthesised import
        rf"^\s*for\s+[^\n]*\b{n}\b",
    )
    return any(re.search(p, source, re.M) for p in patterns)


NOT_MARKDOWN_OF_THE_REPOSITORY = {".venv", "build", "dist", "runs", "lightning_logs", "__pycache__", "node_modules"}
"""Folders whose Markdown is not the repository's documentation: environments, build and run outputs (ignored)."""


def markdown_files() -> set[Path]:
    """Every Markdown file of the checkout but those in hidden, ignored or generated folders."""
    found = set()
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [
            f for f in subfolders
            if not (f.startswith(".") or f in NOT_MARKDOWN_OF_THE_REPOSITORY or f.endswith(".egg-info"))
        ]  # fmt: skip
        for name in files:
            path = Path(folder) / name
            if name.endswith(".md") and not path.relative_to(REPO).as_posix().startswith(tuple(GENERATED)):
                found.add(path)
    return found


def test_the_doc_set_is_every_markdown_file():
    """The checks read every Markdown page of the repository: a new page (say benchmarks/README.md) is not skipped."""
    assert set(DOCS) == markdown_files(), sorted(doc_id(p) for p in set(DOCS) ^ markdown_files())
    ids = {doc_id(d) for d in DOCS}
    assert {"README.md", "CHANGELOG.md", "docs/attention.md", "packages/training/README.md"} <= ids


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_repository_path_exists(doc: Path):
    missing = sorted(p for p in named_paths(doc.read_text()) if not path_exists(p))
    assert not missing, f"{doc_id(doc)} names repository paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_make_target_exists(doc: Path):
    unknown = sorted(named_make_targets(doc.read_text()) - make_targets())
    assert not unknown, f"{doc_id(doc)} names make targets the Makefile lacks: {unknown}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_relative_link_resolves(doc: Path):
    broken = []
    for target in links(doc.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        file = (doc.parent / path_part).resolve() if path_part else doc
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif REPO not in file.parents and file != REPO:
            broken.append(f"{target} (outside the repository)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.relative_to(REPO)})")
    assert not broken, f"{doc_id(doc)} has broken links: {broken}"


@pytest.mark.parametrize("doc", [d for d in DOCS if doc_id(d) not in MODULE_CHECK_EXCLUDED], ids=doc_id)
def test_every_kpca_module_exists(doc: Path):
    problems = sorted({p for p in (resolve_module(m) for m in MODULE.findall(doc.read_text())) if p})
    assert not problems, f"{doc_id(doc)} names kpca modules or names that do not exist: {problems}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_no_page_points_outside_the_repository(doc: Path):
    text = doc.read_text()
    found = [f"{word!r}: {why}" for word, why in FORBIDDEN.items() if word in text]
    assert not found, f"{doc_id(doc)} mentions {found}"


def project_issues(text: str) -> list[str]:
    """The project issue numbers named in ``text`` outside code and link targets (see ``PROJECT_ISSUE``)."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    prose = re.sub(r"\]\([^)]*\)", "]", prose)
    return PROJECT_ISSUE.findall(prose)


@pytest.mark.parametrize("doc", [d for d in DOCS if doc_id(d) not in HISTORY_PAGES], ids=doc_id)
def test_no_guide_names_an_issue_number(doc: Path):
    found = project_issues(doc.read_text())
    assert not found, f"{doc_id(doc)} names issues {found}: say what is true now, and put the history in CHANGELOG.md"


@pytest.mark.parametrize(
    "text",
    ["as issue 37 decided", "(issue #41)", "see #42.", "Issues 35 and 36"],
)
def test_an_issue_number_is_caught(text: str):
    assert project_issues(text)


def test_other_repositories_issues_and_anchors_pass():
    text = (
        "([Lightning-AI/pytorch-lightning#21406](https://github.com/Lightning-AI/pytorch-lightning/issues/21406)),"
        " [a section](docs/attention.md#kinds), `x#1`, pytorch/pytorch#135712, a colour #fff"
    )
    assert not project_issues(text), project_issues(text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("`configs/vision_cls/smok.yaml`", "path"),
        ("```bash\nvision-cls fit -c configs/trainer/cpus.yaml\n```", "path"),
        ("`configs/vision_cls/deit-tiny_{softmax,nonsense}_8xb128-300e_imagenet-224.yaml`", "path"),
        ("`make tests`", "make"),
        ("[a page](docs/nowhere.md)", "link"),
        ("[a section](docs/attention.md#no-such-heading)", "link"),
        ("`kpca.training.vision.build_vit`", "module"),
        ("`kpca.attention.no_such_function`", "module"),
    ],
)
def test_the_checks_catch_a_wrong_name(tmp_path: Path, text: str, problem: str):
    """Each check fails on a wrong name (the tests above would pass vacuously if a check matched nothing)."""
    if problem == "path":
        assert any(not path_exists(p) for p in named_paths(text))
    elif problem == "make":
        assert named_make_targets(text) - make_targets()
    elif problem == "module":
        assert any(resolve_module(m) for m in MODULE.findall(text))
    else:
        (target,) = links(text)
        path_part, _, anchor = target.partition("#")
        file = REPO / path_part
        assert not file.exists() or anchor not in anchors(file)


def test_the_checks_accept_right_names():
    text = (
        "`configs/vision_cls/deit-{tiny,small}_rpc_8xb128-300e_imagenet-224.yaml`, `apps/<name>/`, `tests/attention/`,"
        " `Makefile`, `benchmarks/attention.py:12-30`, `make test-gpu`, `kpca.attention.AttentionSpec`,"
        " `runs/demo/report.md`, `val/acc1`, `~/.cache/kpca`"
    )
    assert all(path_exists(p) for p in named_paths(text)), named_paths(text)
    assert "runs/demo/report.md" not in named_paths(text) and "val/acc1" not in named_paths(text)
    assert named_make_targets(text) == {"test-gpu"} <= make_targets()
    assert not [m for m in MODULE.findall(text) if resolve_module(m)]
    assert github_slug("Modules, `AttentionSpec`, `swap_attention`") == "modules-attentionspec-swap_attention"
    assert github_slug("The demo (`make demo`)") == "the-demo-make-demo"
