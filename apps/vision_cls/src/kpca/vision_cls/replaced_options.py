"""The removed ``data`` options of ``vision-cls``, with the text that gives each one's new spelling.

``VisionCLI.replaced_data_options`` is this table: a parser error about one of them ends with that text
(:mod:`kpca.training.replaced_options`). The tables live beside the options that replaced them: the input path's in
:data:`kpca.vision_cls.input.options.REPLACED_OPTIONS`, the evaluation sets' in
:data:`kpca.vision_cls.eval_data.REPLACED_OPTIONS`.
"""

from __future__ import annotations

from kpca.vision_cls import eval_data
from kpca.vision_cls.input import options

REPLACED_OPTIONS: dict[str, str] = {**options.REPLACED_OPTIONS, **eval_data.REPLACED_OPTIONS}
"""Every removed ``data`` option, with the error text that gives its new spelling."""
