"""Corpus files in the WikiText-103 layout: locating them, reading them, and the built-in corpus written into it.

WikiText-103 is a folder holding ``wiki.train.<kind>``, ``wiki.valid.<kind>`` and ``wiki.test.<kind>``,
where kind ``raw`` is the original text (wikitext-103-raw-v1) and kind ``tokens`` the tokenised text
with rare words replaced by ``<unk>`` (wikitext-103-v1, the files the authors' word-level models
read): one paragraph per line, headings as `` = Title = `` (`` = = Section = = `` for deeper levels)
and blank `` `` lines between them. The built-in corpus turns CPython's ``pydoc_data/topics.py`` (the
prose of the language reference, about 65k words) into the raw layout, one topic per article, so
the demo and the tests read it through the same loader as the real data.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from kpca.language_model.data_checks import find_invalid_utf8, invalid_utf8_problem
from kpca.training.choices import check_choice, choices
from kpca.training.data_checks.problems import DataError
from kpca.training.errors import MissingPathError
from kpca.training.files import write_atomic

Split = Literal["train", "valid", "test"]
SPLITS: tuple[Split, ...] = choices(Split)
"""The WikiText splits, in the order they are built and checked."""
TextFiles = Literal["raw", "tokens"]
_HASH_CHUNK = 1 << 24
BUILTIN_FRACTIONS = {"train": 0.9, "valid": 0.05, "test": 0.05}
_UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}$")
_HEADING_LEVEL = {"*": 1, "=": 2, "-": 3, "~": 4, "^": 4}  # reStructuredText underlines


def split_file(folder: str | os.PathLike[str], split: Split, kind: TextFiles = "raw") -> Path:
    """The file of ``split`` (train, valid or test) in a WikiText-layout folder: ``wiki.<split>.<kind>``."""
    check_choice("split", split, Split)
    check_choice("text_files", kind, TextFiles)
    return Path(folder) / f"wiki.{split}.{kind}"


def layout_hint(kind: str = "raw") -> str:
    """What a WikiText folder of ``kind`` (raw or tokens) holds, for errors about a missing file."""
    archive = "wikitext-103-raw-v1" if kind == "raw" else "wikitext-103-v1"
    names = ", ".join(split_file(".", s, kind).name for s in SPLITS)
    return (
        f"expected the WikiText-103 layout of text_files: {kind}, a folder with {names} (the unzipped {archive} "
        "archive), or data_dir: builtin for the built-in corpus"
    )


def check_layout(folder: str | os.PathLike[str], kind: str = "raw") -> Path:
    """``folder`` as a Path, after checking that it holds the three WikiText files of ``kind`` (raw or tokens)."""
    path = Path(folder).expanduser()
    missing = [split_file(path, s, kind).name for s in SPLITS if not split_file(path, s, kind).is_file()]
    if missing:
        raise MissingPathError(f"data_dir {str(folder)!r} lacks {missing}: {layout_hint(kind)}")
    return path


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def iter_lines(path: str | os.PathLike[str], chunk_lines: int = 100_000, split: str = "") -> Iterator[list[str]]:
    """The lines of a text file (newlines stripped, universal newlines as Python reads them), in chunks.

    Raises:
        DataError: when the file is not UTF-8, naming the file, ``split`` (default: from the file name), the line,
            the byte offset and the bad bytes.
    """
    chunk: list[str] = []
    with open(path, encoding="utf-8") as stream:
        try:
            for line in stream:
                chunk.append(line.rstrip("\n"))
                if len(chunk) == chunk_lines:
                    yield chunk
                    chunk = []
        except UnicodeDecodeError as error:
            found = find_invalid_utf8(path)
            if found is None:  # the file changed while it was read
                raise
            raise DataError(invalid_utf8_problem(path, split or split_of(path), found)) from error
    if chunk:
        yield chunk


def split_of(path: str | os.PathLike[str]) -> str:
    """The split a text file holds, from its name: ``valid`` for ``wiki.valid.raw``, else the file's stem."""
    parts = Path(path).name.split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "wiki" and parts[1] in SPLITS else Path(path).stem


def count_words(text: str) -> int:
    """Words of ``text`` for word-level perplexity: whitespace words plus one end-of-line per line.

    Word-level WikiText-103 models predict an ``<eos>`` after every line (blank lines included), so on
    ``wiki.*.tokens`` this is their token count; a model over any tokenizer that scores the same text
    (newlines included) can be normalised by it. Words are split as ``str.split()`` splits (Unicode
    whitespace), as the authors' vocabulary does.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the text's final newline ends the last line, it does not start a new one
    return sum(len(line.split()) for line in lines) + len(lines)


def topic_to_article(text: str) -> list[str]:
    """One pydoc topic (reStructuredText-like) as WikiText lines: underlined headings and one line per paragraph.

    A ``*`` underline (each topic's title) becomes `` = Title = ``, ``=`` becomes `` = = Section = = ``, and so on.
    """
    lines: list[str] = []
    raw = text.strip("\n").split("\n")
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            lines.extend([" " + " ".join(" ".join(paragraph).split()) + " ", " "])
            paragraph.clear()

    for i, line in enumerate(raw):
        if _UNDERLINE.match(line.strip()):
            continue
        following = raw[i + 1].strip() if i + 1 < len(raw) else ""
        if line.strip() and _UNDERLINE.match(following) and len(following) >= len(line.strip()) - 1:
            flush()
            marks = " =" * _HEADING_LEVEL[following[0]]
            lines.extend([f"{marks} {line.strip()} {marks.strip()} ", " "])
        elif line.strip():
            paragraph.append(line.strip())
        else:
            flush()
    flush()
    return lines


def write_builtin_corpus(cache_dir: str | os.PathLike[str]) -> Path:
    """Write CPython's pydoc topics into a WikiText-layout folder under ``cache_dir`` (once) and return it.

    Topics are assigned to train / valid / test in name order, each to the split furthest below
    its share (90 / 5 / 5 % of characters), so the split is deterministic and balanced. Files are
    written atomically; an existing complete folder is reused.
    """
    from pydoc_data.topics import topics  # CPython's own docs, always installed

    folder = Path(cache_dir).expanduser() / "builtin" / "pydoc-topics"
    if all(split_file(folder, s).is_file() for s in SPLITS):
        return folder
    articles = {name: "\n".join(topic_to_article(text)) + "\n" for name, text in sorted(topics.items())}
    total = sum(len(a) for a in articles.values())
    sizes = dict.fromkeys(SPLITS, 0)
    chosen: dict[str, list[str]] = {s: [] for s in SPLITS}
    for article in articles.values():
        split = min(SPLITS, key=lambda s: sizes[s] / total - BUILTIN_FRACTIONS[s])
        chosen[split].append(article)
        sizes[split] += len(article)
    for split in SPLITS:
        text = "".join(chosen[split])
        write_atomic(split_file(folder, split), lambda f, text=text: f.write(text), mode="w", encoding="utf-8")
    return folder
