"""Bytes an informer's cache holds per object (pure): the controller's slim views beside the
decoded full objects an informer keeping whole objects would hold; and the same for what the
direct signal source keeps of each exporter's stream, beside the parsed wire models.

Sizes are ``sys.getsizeof`` summed over everything reachable from the held values
(``gc.get_referents``), each object counted once across the whole cache, as memory is: a string
or a dict key shared by many objects is paid once. Classes, modules and functions are the
program's, not the cache's, and are left out; so are the cache's own keys and index, which both
designs need alike.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumon.controller.shell.signal_sources.direct import ExporterView, on_line
from gpumon.wire import v1 as wire

_PROGRAM = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def deep_size(roots: Iterable[object]) -> int:
    """Bytes of ``roots`` and of everything they reach, each object once."""
    seen: set[int] = set()
    total = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _PROGRAM):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


@dataclass(frozen=True, slots=True)
class CacheSize:
    """One kind's sample: ``listed`` objects as the API server returned them, ``kept`` of them
    held as views (the rest are left out of the cache)."""

    kind: str
    listed: int
    kept: int
    view_bytes: int  # all the views held
    full_bytes: int  # all the decoded objects

    @property
    def view_per_object(self) -> float:
        return self.view_bytes / self.kept if self.kept else 0.0

    @property
    def full_per_object(self) -> float:
        return self.full_bytes / self.listed if self.listed else 0.0

    @property
    def ratio(self) -> float:
        """How many times less memory the slim cache holds per object listed."""
        return self.full_bytes / self.view_bytes if self.view_bytes else float("inf")


def cache_size(
    kind: str, objects: Sequence[Mapping[str, Any]], convert: Callable[[Mapping[str, Any]], object | None]
) -> CacheSize:
    """``objects`` (decoded JSON, as listed) against what ``convert`` keeps of them."""
    views = [v for v in map(convert, objects) if v is not None]
    return CacheSize(kind, len(objects), len(views), deep_size(views), deep_size(objects))


def stream_size(lines: Sequence[bytes], now: float) -> CacheSize:
    """Exporter watch state lines (as served) per GPU: what the direct source keeps of each
    (:class:`~gpumon.controller.shell.signal_sources.direct.ExporterView`) against the parsed
    wire models a source keeping the lines' models would hold."""
    parsed = [wire.parse_watch_line(line) for line in lines]
    states = [p for p in parsed if isinstance(p, wire.StateLine)]
    views = [on_line(ExporterView(s.node), s, now)[0].gpus for s in states]
    gpus = sum(len(s.gpus) for s in states)
    return CacheSize(
        "exporter streams (a GPU each)",
        gpus,
        sum(len(v) for v in views),
        deep_size(views),
        deep_size([s.gpus for s in states]),
    )
