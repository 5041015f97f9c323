"""Data options that moved into a group, read at their new place from what runs saved before the move.

An app's datamodule lists its moved options in ``moved_options``, ``{old name: new dotted name}`` under ``data``
(e.g. ``{"re_prob": "train.re_prob"}``). A checkpoint's saved DataModule hyper-parameters and a config file given
with ``-c`` (a run folder's ``config.yaml``) that still spell an option the old way are read as the new spelling
(:func:`move_options`, :meth:`MovedConfigs.rewrite`), and each move is named once (:attr:`Move.text`). An old key typed
on the command line stays an unknown option for the parser to refuse.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

INIT_ARGS = "init_args"


@dataclass(frozen=True)
class Move:
    """One option read at its new place.

    Attributes:
        old: the old spelling under ``data`` (``re_prob``).
        new: the new one (``train.re_prob``).
        where: what held the old spelling (``--ckpt_path <file>``, or ``config <file>`` as typed).
    """

    old: str
    new: str
    where: str

    @property
    def text(self) -> str:
        """``<where>: data option <old> is now data.<new> (read as such)``."""
        return f"{self.where}: data option {self.old} is now data.{self.new} (read as such)"


def move_options(options: Mapping, moved: Mapping[str, str], where: str) -> tuple[dict, list[Move]]:
    """``options`` (a ``data`` section) with each old key of ``moved`` put at its new dotted place.

    A value already set at the new place stays (the old one is dropped, still named). A ``data`` section given by
    class path moves inside its ``init_args``.

    Returns:
        The moved options (a new dict; ``options`` is left as it is) and the moves made, in ``options``' order.
    """
    if isinstance(options.get(INIT_ARGS), Mapping):
        init_args, moves = move_options(options[INIT_ARGS], moved, where)
        return {**options, INIT_ARGS: init_args}, moves
    result, moves = dict(options), []
    for old in [key for key in options if key in moved]:
        *groups, name = moved[old].split(".")
        target = result
        for group in groups:
            target[group] = dict(target.get(group) or {})
            target = target[group]
        value = result.pop(old)
        target.setdefault(name, value)
        moves.append(Move(old, moved[old], where))
    return result, moves


class MovedConfigs:
    """Config files rewritten with moved options at their new place, in a temporary folder removed at exit.

    Each rewritten copy keeps the file's name (in a folder of its own), so that what a parser error names is still
    recognisable; the copy is plain YAML, so its comments are gone.
    """

    def __init__(self) -> None:
        self._folder: Path | None = None

    def rewrite(self, args: Sequence[str], moved: Mapping[str, str]) -> tuple[list[str], list[Move]]:
        """``args`` with each ``-c``/``--config`` file that spells a moved option the old way replaced by a copy.

        A file that cannot be read as YAML, or holds no ``data`` mapping with an old key, stays as it is (the parser
        names its problem). Only the ``data`` section at the top of a file moves.

        Returns:
            The arguments to parse and the moves made, one per old key and file.
        """
        words, moves = list(args), []
        for index, word in enumerate(words):
            prefix = "--config=" if word.startswith("--config=") else ""
            if not prefix and not (index > 0 and words[index - 1] in ("-c", "--config")):
                continue
            path = word.removeprefix(prefix)
            tree = _yaml_file(path)
            if not isinstance(tree, dict) or not isinstance(tree.get("data"), Mapping):
                continue
            data, file_moves = move_options(tree["data"], moved, f"config {path}")
            if file_moves:
                words[index] = prefix + str(self._copy(path, {**tree, "data": data}, index))
                moves += file_moves
        return words, moves

    def _copy(self, path: str, tree: dict, index: int) -> Path:
        """Write ``tree`` as ``<temporary folder>/<index>/<name of path>``."""
        if self._folder is None:  # kept to the end: the parser reads the copies again for what was typed
            self._folder = Path(tempfile.mkdtemp(prefix="kpca-moved-options-"))
            atexit.register(shutil.rmtree, self._folder, ignore_errors=True)
        copy = self._folder / str(index) / Path(path).name
        copy.parent.mkdir()
        copy.write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
        return copy


def _yaml_file(path: str) -> object:
    """The YAML content of file ``path``; None if it is no readable YAML file."""
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
