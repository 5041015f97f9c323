"""One rule per choice: an option's allowed values are its ``Literal`` type's, checked by :func:`check_choice`.

A table of data per choice is a dict keyed by the values, checked against the type (:func:`keyed_by_choices`).
A string option is typed ``Literal[...]`` (LightningCLI reads its choices from the type), and code that checks a
value at run time derives the same choices from that type instead of repeating them in a hand-written tuple::

    BadFilesMode = Literal["error", "skip"]
    check_choice("data.bad_files", value, BadFilesMode)

Imports nothing but :mod:`typing` and :mod:`kpca.training.errors`, so plain ``nn.Module`` code can use it.
"""

from __future__ import annotations

import types
from typing import Literal, TypeVar, Union, get_args, get_origin

from kpca.training.errors import OptionError

V = TypeVar("V")


def choices(choice_type: object) -> tuple[object, ...]:
    """The values of a ``Literal`` type, in order: ``Literal["a", "b"]`` -> ``("a", "b")``.

    A union of ``Literal`` types and None (``Literal["digits"] | None``) gives their values in order, None included.

    Raises:
        TypeError: if ``choice_type`` is no ``Literal`` (nor such a union).
    """
    origin = get_origin(choice_type)
    if origin is Literal:
        return get_args(choice_type)
    if origin is Union or origin is types.UnionType:
        return tuple(value for arg in get_args(choice_type) for value in _union_member(arg))
    raise TypeError(f"{choice_type!r} is not a Literal type (nor a union of Literal types and None)")


def _union_member(arg: object) -> tuple[object, ...]:
    """The values one member of a union contributes: None for ``NoneType``, else a Literal's values."""
    return (None,) if arg is type(None) else choices(arg)


def is_choice(value: object, choice_type: object) -> bool:
    """Whether ``value`` is one of ``choice_type``'s values, of the same type (``True`` is not ``1``)."""
    return any(_same(value, choice) for choice in choices(choice_type))


def _same(value: object, choice: object) -> bool:
    if isinstance(value, bool) or isinstance(choice, bool) or value is None or choice is None:
        return value is choice
    return isinstance(value, type(choice)) and value == choice


def check_choice(name: str, value: object, choice_type: object, fix: str = "") -> None:
    """Raise OptionError (a ValueError) naming the option, the value and the allowed values, unless ``value`` is one.

    Args:
        name: the option as the user writes it, e.g. ``"data.bad_files"``.
        value: the value given.
        choice_type: the option's ``Literal`` type (see :func:`choices`), the one source of its values.
        fix: what to do, when more than choosing one of the values helps (e.g. what each value means); the message
            always lists the values.

    Raises:
        OptionError: ``<name>=<value> is not one of 'a', 'b'; <fix>`` (the fix defaults to "choose one of them").
    """
    if is_choice(value, choice_type):
        return
    allowed = ", ".join(repr(choice) for choice in choices(choice_type))
    raise OptionError(f"{name}={value!r} is not one of {allowed}; {fix.rstrip('.') or 'choose one of them'}.")


def keyed_by_choices(choice_type: object, table: dict[str, V]) -> dict[str, V]:
    """``table`` in the order of ``choice_type``'s values, once its keys are checked to be exactly those values.

    Raises:
        TypeError: A value of the ``Literal`` without an entry, or an entry for no value (a table and its ``Literal``
            that drifted apart).
    """
    names = choices(choice_type)
    if set(table) != set(names):
        raise TypeError(f"the table's keys {sorted(table)} are not the values of {choice_type} ({list(names)})")
    return {name: table[name] for name in names}
