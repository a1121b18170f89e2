"""Pickling a frozen, slotted dataclass by its field values, for the types forked workers send back.

``dataclasses`` pickles such a class with ``_dataclass_getstate``/``_dataclass_setstate``, which walk
``dataclasses.fields(self)`` for every object: over a third of the time a ranking worker spends sending an
estimate and the parent receiving it (5,004 estimates of a 7B space, pickled and unpickled: 31 -> 19 us
each). ``by_values`` names the fields once, per class. The state is the same tuple of values, in field
order.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, TypeVar

__all__ = ["by_values"]

T = TypeVar("T")


def by_values(cls: type[T]) -> type[T]:
    """``cls`` (a frozen dataclass with ``slots=True``), pickled by its field values named once."""
    names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    get = operator.attrgetter(*names)  # one name: the value itself, not a tuple

    def __getstate__(self: T) -> tuple[Any, ...]:
        return get(self) if len(names) > 1 else (get(self),)  # type: ignore[no-any-return]

    def __setstate__(self: T, state: tuple[Any, ...]) -> None:
        for name, value in zip(names, state, strict=True):
            object.__setattr__(self, name, value)

    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    cls.__setstate__ = __setstate__  # type: ignore[attr-defined]
    return cls
