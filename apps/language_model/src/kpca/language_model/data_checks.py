"""Checks of a corpus text file before anything reads it: present, non-empty, valid UTF-8 (line and byte offset named).

The UTF-8 check reads the file in binary chunks and decodes them with CPython's C decoder, so it runs at
disk (or page-cache) speed on WikiText-103's 540 MB train file; a multi-byte character split between two
chunks is carried over to the next one, so no chunk boundary is mistaken for damage.
"""

from __future__ import annotations

import codecs
import os
from dataclasses import dataclass
from pathlib import Path

from kpca.training.data_checks.problems import DataProblem

_CHUNK = 1 << 18  # 256 KiB per read: the decoded text stays in the CPU cache (faster than bigger reads)
_COUNT_LIMIT = 100  # invalid sequences counted per file before the count stops ("at least 100")


@dataclass(frozen=True)
class InvalidUtf8:
    """Where a file stops being UTF-8.

    Attributes:
        offset: byte offset (from 0) of the first invalid sequence.
        line: its line number (from 1; a line ends with a newline byte).
        bad_bytes: the invalid sequence as it is on disk.
        count: invalid sequences in the file, counted up to ``_COUNT_LIMIT``.
    """

    offset: int
    line: int
    bad_bytes: bytes
    count: int


def find_invalid_utf8(path: str | os.PathLike[str], chunk_size: int = _CHUNK) -> InvalidUtf8 | None:
    """The first invalid UTF-8 sequence of the file at ``path`` and how many there are, or None when it is UTF-8."""
    first: InvalidUtf8 | None = None
    count = 0
    lines_before = 0  # newlines in the bytes before ``buffer``
    buffer_offset = 0  # file offset of ``buffer[0]``
    pending = b""  # the start of a character split by the chunk boundary
    with open(path, "rb") as stream:
        while True:
            chunk = stream.read(chunk_size)
            final = not chunk
            buffer = pending + chunk
            start = 0
            while True:
                try:
                    _, used = codecs.utf_8_decode(buffer[start:], "strict", final)
                    break
                except UnicodeDecodeError as error:
                    bad_start, bad_end = start + error.start, start + error.end
                    if first is None:
                        line = lines_before + buffer.count(b"\n", 0, bad_start) + 1
                        first = InvalidUtf8(buffer_offset + bad_start, line, buffer[bad_start:bad_end], 0)
                    count += 1
                    if count >= _COUNT_LIMIT:
                        return InvalidUtf8(first.offset, first.line, first.bad_bytes, count)
                    start = bad_end
            consumed = start + used
            lines_before += buffer.count(b"\n", 0, consumed)
            buffer_offset += consumed
            pending = buffer[consumed:]
            if final:
                break
    return None if first is None else InvalidUtf8(first.offset, first.line, first.bad_bytes, count)


def invalid_utf8_problem(path: str | os.PathLike[str], split: str, found: InvalidUtf8) -> DataProblem:
    """The problem of a file that is not UTF-8: the first bad bytes with their line and offset, and the two fixes."""
    path = Path(path).absolute()
    more = f"at least {found.count}" if found.count >= _COUNT_LIMIT else str(found.count)
    return DataProblem(
        path=str(path),
        split=split,
        problem=(
            f"not valid UTF-8: bytes {found.bad_bytes!r} at line {found.line}, byte offset {found.offset} "
            f"({more} invalid sequence{'s' if found.count != 1 else ''} in the file)"
        ),
        fix=(
            "The text must be UTF-8 (WikiText-103 is): download the file again, or convert it with "
            f"`iconv -f <its encoding> -t utf-8 -c {path} > {path}.utf8` (-f utf-8 drops the invalid bytes) "
            "and move the result into its place"
        ),
    )


def check_text_file(path: str | os.PathLike[str], split: str, missing_fix: str) -> list[DataProblem]:
    """The problems of one corpus text file: missing (``missing_fix`` says what to do), empty, or not UTF-8.

    Args:
        path: the text file.
        split: its split (``train``, ``valid``, ``test``), named in the problem.
        missing_fix: what to do when the file is not there (the expected layout).

    Returns:
        At most one problem (an empty list when the file is sound).
    """
    path = Path(path).absolute()
    if not path.is_file():
        return [DataProblem(str(path), split, "the file does not exist", missing_fix)]
    if path.stat().st_size == 0:
        fix = "Every split needs text: copy or download the file again (WikiText-103's smallest split is 1.1 MB)"
        return [DataProblem(str(path), split, "the file is empty (0 bytes)", fix)]
    found = find_invalid_utf8(path)
    return [] if found is None else [invalid_utf8_problem(path, split, found)]
