"""The attention library's one error type of its own: an option value it cannot use.

:class:`AttentionOptionError` is a ``ValueError`` raised by the checks of what a caller chooses (an attention kind's
settings, a backend name, a module's sizes), with a message naming the value and the fix. A tensor of the wrong
shape, dtype or device inside a call is the calling code's bug and raises a plain ``ValueError`` or ``TypeError``.
The library has no exit-status policy: the commands built on it decide how an error ends a command
(``kpca.training.errors`` prints an ``AttentionOptionError`` from an option typed on the command line as one line).
"""

from __future__ import annotations


class AttentionOptionError(ValueError):
    """An attention option's value cannot be used: out of range, not one of the choices, or not going with another."""
