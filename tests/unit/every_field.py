"""Frozen values with every field set, none to its default, and no two scalars alike: whatever a
conversion drops, swaps or leaves at its default shows when the value comes back. Built from the
dataclass's type hints, so a field added to a model gets a value here without a change."""

from __future__ import annotations

import dataclasses
import enum
import itertools
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def every_field(cls: type[T]) -> T:
    return _Values().of(cls)


class _Values:
    def __init__(self) -> None:
        self._n: Iterator[int] = itertools.count(1)

    def of(self, tp: Any) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            return self.of(next(a for a in args if a is not type(None)))
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return (self.of(args[0]), self.of(args[0]))
            return tuple(self.of(a) for a in args)
        if origin is frozenset:
            return frozenset((self.of(args[0]), self.of(args[0])))
        if origin is Mapping:
            return {self.of(args[0]): self.of(args[1]) for _ in range(2)}
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self._dataclass(tp)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return list(tp)[-1]  # not the first member, which is the usual default
        if tp is bool:
            return True
        if tp is int:
            return next(self._n)
        if tp is float:
            return next(self._n) + 0.25
        if tp is str:
            return f"s{next(self._n)}"
        raise TypeError(f"every_field: no value for {tp!r}; teach tests/unit/every_field.py the type")

    def _dataclass(self, cls: type[Any]) -> Any:
        hints = typing.get_type_hints(cls)
        values = {f.name: self.of(hints[f.name]) for f in dataclasses.fields(cls)}
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert values[f.name] != default, f"{cls.__name__}.{f.name}: the value made for it is its default"
        return cls(**values)
