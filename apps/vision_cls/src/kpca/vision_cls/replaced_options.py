"""The removed ``data`` options of ``vision-cls``, and the new spelling a parser error about one of them adds.

jsonargparse refuses a removed option on the command line (``unrecognized arguments: --data.eval_subset=16``) and in
a config file (``Group 'data' does not accept option 'eval_subset'``); :func:`replaced_option_hint` finds the option
in that message and returns what replaced it. The tables live beside the options that replaced them: the input path's
in :data:`kpca.vision_cls.input.options.REPLACED_OPTIONS`, the evaluation sets' in
:data:`kpca.vision_cls.eval_data.REPLACED_OPTIONS`.
"""

from __future__ import annotations

import re

from kpca.vision_cls import eval_data
from kpca.vision_cls.input import options

REPLACED_OPTIONS: dict[str, str] = {**options.REPLACED_OPTIONS, **eval_data.REPLACED_OPTIONS}
"""Every removed ``data`` option, with the error text that gives its new spelling."""

_NAMES = "|".join(REPLACED_OPTIONS)
_REPLACED_KEY = re.compile(rf"\bdata\.({_NAMES})\b|'data' does not accept option '({_NAMES})'")


def replaced_option_hint(message: str) -> str | None:
    """The new spelling of the first removed ``data`` option that a parser error ``message`` names, else None."""
    match = _REPLACED_KEY.search(message)
    return REPLACED_OPTIONS[match.group(1) or match.group(2)] if match else None
