"""The argument parser of every app's command: Lightning's, with errors that a user reads in one line.

:func:`project_parser` gives the parser class :class:`kpca.training.cli.ProjectCLI` builds its main and subcommand
parsers from. Prefix matching is off (``--trainer.max_step`` is refused, not read as ``max_steps``); a refusal of a
removed ``data`` option also gives its new spelling (:mod:`kpca.training.replaced_options`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

from lightning.pytorch.cli import LightningArgumentParser

from kpca.training.replaced_options import replaced_option_hint


def project_parser(replaced: Mapping[str, str]) -> type[LightningArgumentParser]:
    """The parser class of an app whose removed ``data`` options are ``replaced`` (name -> new spelling's text)."""

    class ProjectArgumentParser(LightningArgumentParser):
        """Lightning's parser without prefix matching; an error naming a removed option ends with its new spelling."""

        def __init__(self, *args, **kwargs) -> None:
            kwargs.setdefault("allow_abbrev", False)
            super().__init__(*args, **kwargs)

        def error(self, message: str, ex: Exception | None = None) -> NoReturn:
            """Exit (or raise) with ``message``, plus the new spelling if it names a removed ``data`` option."""
            hint = replaced_option_hint(message, replaced)
            super().error(f"{message}\n{hint}" if hint else message, ex)

    return ProjectArgumentParser
