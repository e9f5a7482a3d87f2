"""What a metric catalog is made of, and how a catalog becomes metric families.

A catalog (:mod:`~gpumon.exporter.catalog_native`, :mod:`~gpumon.exporter.catalog_dcgm`) is a
table of :class:`Field`: one family each, with its name, type, help, unit and the value getter of
each of its series. :func:`emit` turns a table into ``prometheus_client`` families over a
snapshot's GPUs; the writer (:mod:`~gpumon.exporter.exposition`) writes those. A new GPU field
becomes a series by one entry in a catalog's table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from gpumon.gpu.model import (
    FastFields,
    GpuSample,
    MemoryInfo,
    MigInstance,
    MigProfiling,
    Profiling,
    SlowFields,
)

# A field is one family, its series as (extra labels, value getter).
Labels = dict[str, str]
Getter = Callable[[GpuSample], float | None]
MemoryGetter = Callable[[MemoryInfo], float | None]
ProfilingGetter = Callable[[Profiling], float | None]
# One GPU's samples for a group of families, one tuple per family, in the group's order.
Chunks = tuple[tuple[Sample, ...], ...]


@dataclass(frozen=True, slots=True)
class Field:
    name: str  # exactly as exposed; a counter's name ends in _total
    kind: Literal["gauge", "counter", "unknown"]
    doc: str
    series: tuple[tuple[Labels, Getter], ...]
    unit: str = ""
    # Every getter reads only the GPU's slow reading (``GpuSample.slow``): its samples are
    # built once per slow reading (:class:`SlowSamples`).
    slow: bool = False


def new_family(name: str, kind: str, doc: str, unit: str = "") -> Metric:
    return Metric(name.removesuffix("_total") if kind == "counter" else name, doc, kind, unit)


def add_sample(family: Metric, labels: Labels, value: float) -> None:
    name = family.name + "_total" if family.type == "counter" else family.name
    family.samples.append(Sample(name, labels, float(value)))


def emit(
    fields: Sequence[Field], rows: Iterable[tuple[GpuSample, Labels]], slow: SlowSamples, group: str
) -> list[Metric]:
    """``fields``' families over ``rows``; the slow fields' samples of a GPU come from ``slow``
    under ``group`` (one name per field table)."""
    families = [new_family(f.name, f.kind, f.doc, f.unit) for f in fields]
    fast = [(f, family) for f, family in zip(fields, families, strict=True) if not f.slow]
    slow_fields = tuple(f for f in fields if f.slow)
    slow_families = [family for f, family in zip(fields, families, strict=True) if f.slow]
    build = functools.partial(_series, slow_fields)
    for gpu, base in rows:
        for field, family in fast:
            family.samples.extend(field_samples(field, gpu, base))
        # Without a slow reading a slow field has no series.
        if gpu.slow is not None and slow_fields:
            for family, chunk in zip(slow_families, slow.chunks(group, gpu, base, build), strict=True):
                family.samples.extend(chunk)
    return families


def _series(fields: Sequence[Field], gpu: GpuSample, base: Labels) -> Chunks:
    return tuple(tuple(field_samples(f, gpu, base)) for f in fields)


def field_samples(field: Field, gpu: GpuSample, base: Labels) -> Iterator[Sample]:
    # A field's name is its samples' (a counter's family drops the _total its samples keep).
    for extra, get in field.series:
        value = get(gpu)
        if value is not None:
            yield Sample(field.name, {**base, **extra} if extra else base, float(value))


def emit_mig_memory(
    table: Sequence[tuple[str, str, MemoryGetter]],
    families: list[Metric],
    rows: Iterable[tuple[MigInstance, Labels]],
) -> None:
    """MIG instances' memory joins the GPU memory families, told apart by the instance labels."""
    by_name = {f.name: f for f in families}
    for mig, labels in rows:
        if mig.memory is None:
            continue
        for name, _doc, get in table:
            value = get(mig.memory)
            if value is not None:
                add_sample(by_name[name], labels, value)


def memory_fields(table: Sequence[tuple[str, str, MemoryGetter]], unit: str = "") -> tuple[Field, ...]:
    return tuple(Field(name, "gauge", doc, one(_memory(get)), unit) for name, doc, get in table)


def from_fast(get: Callable[[FastFields], float | None]) -> Getter:
    return lambda g: None if g.fast is None else get(g.fast)


def from_slow(get: Callable[[SlowFields], float | bool | None]) -> Getter:
    return lambda g: None if g.slow is None else number(get(g.slow))


@dataclass(frozen=True, slots=True)
class GpmField:
    """A GPM family: the whole GPU's series, and a MIG GPU instance's where GPM measures it."""

    name: str
    doc: str
    series: tuple[tuple[Labels, ProfilingGetter], ...]
    unit: str = ""


def per_gpu(get: ProfilingGetter) -> tuple[tuple[Labels, ProfilingGetter], ...]:
    return (({}, get),)


def _prof(get: ProfilingGetter) -> Getter:
    return lambda g: None if g.slow is None or g.slow.profiling is None else get(g.slow.profiling)


def gpm_fields(table: Sequence[GpmField]) -> tuple[Field, ...]:
    return tuple(
        Field(
            f.name, "gauge", f.doc, tuple((labels, _prof(get)) for labels, get in f.series), f.unit, slow=True
        )
        for f in table
    )


def emit_mig_profiling(
    table: Sequence[GpmField], families: list[Metric], rows: Iterable[tuple[Profiling, Labels]]
) -> None:
    """MIG GPU instances' GPM joins the GPU's GPM families, told apart by the instance labels."""
    by_name = {f.name: f for f in families}
    for prof, labels in rows:
        for field in table:
            for extra, get in field.series:
                value = get(prof)
                if value is not None:
                    add_sample(by_name[field.name], {**labels, **extra} if extra else labels, value)


def mig_profiling(g: GpuSample) -> tuple[MigProfiling, ...]:
    return g.slow.mig_profiling if g.slow is not None else ()


def violation(policy: str, *, nanoseconds: bool = False) -> Getter:
    def get(g: GpuSample) -> float | None:
        seconds = None if g.slow is None else g.slow.violation_seconds.get(policy)
        if seconds is None or not nanoseconds:
            return seconds
        return float(round(seconds * 1e9))  # dcgm's whole nanoseconds

    return get


def _memory(get: MemoryGetter) -> Getter:
    return from_fast(lambda f: None if f.memory is None else get(f.memory))


def number(v: float | bool | None) -> float | None:
    return None if v is None else float(v)


def one(get: Getter) -> tuple[tuple[Labels, Getter], ...]:
    return (({}, get),)


def migs(g: GpuSample) -> tuple[MigInstance, ...]:
    return g.slow.mig_instances if g.slow is not None else ()


class SlowSamples:
    """The samples each GPU's slow reading gave, kept while that reading is the current one.

    Slow fields are read every 10 s, and on the mock node they are nearly half of the samples
    (432 of 912, 288 of them the per-link NVLink error counters): building them again on every
    tick was about half of what was left of a render (issue #19). A GPU's slow reading is one
    immutable object until the next slow read replaces it, so the samples built from it are
    reused while the GPU's reading is that same object and its labels are equal. Each build
    keeps only what it used, so a GPU that went away is forgotten one build later. For one
    builder at a time: no lock."""

    __slots__ = ("_current", "_previous")

    def __init__(self) -> None:
        # (group, GPU UUID) -> (the slow reading, the GPU's labels, the samples built from them)
        self._current: dict[tuple[str, str], tuple[SlowFields, Labels, Chunks]] = {}
        self._previous: dict[tuple[str, str], tuple[SlowFields, Labels, Chunks]] = {}

    def chunks(
        self, group: str, gpu: GpuSample, labels: Labels, build: Callable[[GpuSample, Labels], Chunks]
    ) -> Chunks:
        """``build(gpu, labels)``, or what it gave for the same slow reading and labels last time;
        ``gpu.slow`` must not be None."""
        slow = gpu.slow
        assert slow is not None
        key = (group, gpu.identity.uuid)
        kept = self._previous.get(key)
        if kept is not None and kept[0] is slow and kept[1] == labels:
            self._current[key] = kept
            return kept[2]
        made = build(gpu, labels)
        self._current[key] = (slow, labels, made)
        return made

    def rotate(self) -> None:
        """A build is over: what it used is what the next one may reuse."""
        self._previous, self._current = self._current, {}
