"""Snapshot -> pre-rendered exposition bytes, once per sampling tick and never per scrape.

Two profiles describe the same snapshot. ``native`` is DESIGN.md's metric contract (base units,
``gpumon_`` names); ``dcgm`` uses dcgm-exporter's names, units and labels so dashboards and
alerts written for it work unchanged; ``both`` emits the two side by side (their names never
overlap). Every series, unit and deviation from dcgm-exporter is listed in docs/metrics.md.

The snapshot becomes prometheus_client ``metrics_core`` families. Those are written by a small
writer here rather than by the library's ``generate_latest``: the library re-validates and
re-escapes every label name of every sample, which made a tick of 8 GPUs x 64 pods cost 12-16 ms
instead of 3-5 ms, and the writer renders each sample line once for both formats. ``extra``
collectors (self-metrics, histograms, ``_created`` samples) are collected once per tick and go
through the same writer (the library wrote them twice a tick, once per format, at more cost than
the 470 GPU and pod samples: issue #19); a family the writer does not handle (timestamps,
exemplars, native histograms) goes through the library. The output is byte-for-byte the
library's, which the unit tests check on every profile with hostile label values.

A renderer that keeps a :class:`LineCache` from one render to the next writes only what changed
since its last render: on the mock node (8 GPUs, 64 pods, about 900 samples) a render went from
7.6 to 4.3 ms of its thread's CPU (issue #19, docs/benchmarks.md). It also keeps each GPU's
samples of the slow fields (:class:`SlowSamples`), built again only from a new slow reading: the
render thread 0.42-0.48 -> 0.30-0.33 % of a core on the mock node.

A :class:`RenderedMetrics` holds the sample lines; each of the four bodies (text or OpenMetrics,
plain or gzip) is written on first use and kept. The render thread writes those that scrapes asked
for lately (:func:`prerender_variants`) before it publishes the payload, so a scrape is served
bytes already written, and nothing is written or compressed that nobody asks for.
"""

from __future__ import annotations

import functools
import gzip
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as _OPENMETRICS
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from gpumon.devices.model import (
    CLOCK_EVENT_REASONS,
    VIOLATION_POLICIES,
    XID_OTHER,
    FastFields,
    GpuSample,
    HealthState,
    MemoryInfo,
    MigInstance,
    MigProfiling,
    PodGpuUsage,
    Profiling,
    SlowFields,
    Snapshot,
)

CONTENT_TYPE_TEXT = CONTENT_TYPE_PLAIN_0_0_4
CONTENT_TYPE_OPENMETRICS = _OPENMETRICS

Profile = Literal["native", "dcgm", "both"]

_MIB = 1024 * 1024
# Levels 1-3 are zlib's fast strategy: on the mock node's OpenMetrics body (134 KB) level 3 took
# 0.30 ms for 8.3 KB, level 5 0.81 ms for 7.7 KB, level 6 1.09 ms for 7.3 KB. It is paid on every
# tick, the bytes only per scrape (issue #19).
_GZIP_LEVEL = 3


Format = Literal["text", "openmetrics"]
# A body a scrape can ask for: the format, and whether gzip-compressed.
Variant = tuple[Format, bool]
VARIANTS: tuple[Variant, ...] = (
    ("text", False),
    ("text", True),
    ("openmetrics", False),
    ("openmetrics", True),
)
# A variant asked for within this long is written by the render thread on each tick.
PRERENDER_SECONDS = 300.0


def prerender_variants(
    asked: Mapping[Variant, float], now: float, keep: float = PRERENDER_SECONDS
) -> frozenset[Variant]:
    """The variants scraped within ``keep`` seconds of ``now`` (``asked``: variant -> last time)."""
    return frozenset(v for v, at in asked.items() if now - at <= keep)


class RenderedMetrics:
    """One tick's payload: each body written on first use and kept (:meth:`body`).

    The render thread writes the wanted bodies before it hands the payload over; after that only
    the event loop touches it, so no lock is needed."""

    __slots__ = ("_bodies", "_families", "rendered_at", "text_bytes")

    def __init__(self, families: Sequence[_Written], rendered_at: float) -> None:
        self._families = tuple(families)
        self._bodies: dict[Variant, bytes] = {}
        self.rendered_at = rendered_at
        # The size of the text body, known without writing it (the exporter reports it).
        self.text_bytes = sum(f.text_bytes for f in self._families)

    def body(self, fmt: Format, compressed: bool = False) -> bytes:
        out = self._bodies.get((fmt, compressed))
        if out is None:
            if compressed:
                out = gzip.compress(self.body(fmt), compresslevel=_GZIP_LEVEL, mtime=0)
            elif fmt == "text":
                out = "".join([f.text for f in self._families]).encode()
            else:
                out = "".join([f.openmetrics for f in self._families]).encode() + b"# EOF\n"
            self._bodies[(fmt, compressed)] = out
        return out

    def written(self) -> frozenset[Variant]:
        """The bodies written so far (tests)."""
        return frozenset(self._bodies)

    @property
    def text(self) -> bytes:
        return self.body("text")

    @property
    def openmetrics(self) -> bytes:
        return self.body("openmetrics")

    @property
    def text_gzip(self) -> bytes:
        return self.body("text", True)

    @property
    def openmetrics_gzip(self) -> bytes:
        return self.body("openmetrics", True)


def render(
    snapshot: Snapshot,
    *,
    profile: Profile,
    extra: Sequence[Collector] = (),
    prerender: Iterable[Variant] = (),
    lines: LineCache | None = None,
) -> RenderedMetrics:
    """Render ``snapshot`` (plus ``extra`` collectors, e.g. self-metrics); the ``prerender``
    bodies are written now, the others on first use. ``lines``: the previous render's sample
    lines, reused where a series is the same (give each renderer its own); without it, every
    line is written afresh."""
    lines = lines if lines is not None else LineCache()
    families = [_write(f, lines) for f in snapshot_families(snapshot, profile, lines.slow)]
    for collector in extra:
        families.extend(_write_any(f, lines) for f in collector.collect())
    lines.rotate()
    out = RenderedMetrics(families, rendered_at=snapshot.taken_at)
    for fmt, compressed in prerender:
        out.body(fmt, compressed)
    return out


def snapshot_families(
    snapshot: Snapshot, profile: Profile, slow: SlowSamples | None = None
) -> Iterator[Metric]:
    """The non-empty metric families of ``snapshot`` in ``profile``. ``slow``: the samples the
    last build made from each GPU's slow reading, reused where the reading is the same one;
    without it, all are built afresh."""
    slow = slow if slow is not None else SlowSamples()
    if profile in ("native", "both"):
        yield from _non_empty(_native(snapshot, slow))
    if profile in ("dcgm", "both"):
        yield from _non_empty(_dcgm(snapshot, slow))


def family_names(profile: Profile) -> tuple[str, ...]:
    """Every family a snapshot can fill in ``profile``, empty or not, by its samples' base name (a
    counter's family drops the ``_total`` its samples keep). The device check lists against it
    which of them a real GPU left empty (bench/device_check)."""
    nothing = Snapshot("", None, (), (), 0.0, backend_up=True, complete=True)
    native = _native(nothing, SlowSamples()) if profile in ("native", "both") else []
    dcgm = _dcgm(nothing, SlowSamples()) if profile in ("dcgm", "both") else []
    return tuple(f.name for f in (*native, *dcgm))


# Sample lines are identical in both formats for the families written here: legacy-charset
# names, no timestamps, exemplars or native histograms, label values escaped the same way. The
# text format moves a family's OpenMetrics-only samples (``_created``, ``_gsum``, ``_gcount``)
# into gauge families of their own after it, as the library does.

_OM_ONLY_SUFFIXES = ("_created", "_gsum", "_gcount")
# The 0.0.4 text format's names and types for OpenMetrics types (prometheus_client's munging).
_TEXT_SUFFIX = {"counter": "_total", "info": "_info"}
_TEXT_TYPE = {"unknown": "untyped", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}


@dataclass(frozen=True, slots=True)
class _Written:
    """One family in both formats, as text."""

    text: str
    openmetrics: str
    text_bytes: int


def _write(family: Metric, cache: LineCache) -> _Written:
    name = family.name
    last = cache.last(family)
    if last is not None and last.family.samples == family.samples:
        cache.keep(name, last)
        return last.written
    text_name = name + _TEXT_SUFFIX.get(family.type, "")
    text_doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
    om_doc = _escape_value(family.documentation)
    om_only = {name + suffix: suffix for suffix in _OM_ONLY_SUFFIXES}
    heads = _heads(family.samples, last)
    lines: list[str] = []
    kept: list[str] = []
    moved: dict[str, list[str]] = {}
    for s, head, line in heads:
        if line is None:
            line = f"{head} {_go_float(s.value)}\n"
        lines.append(line)
        suffix = om_only.get(s.name)
        if suffix is None:
            kept.append(line)
        else:
            moved.setdefault(suffix, []).append(line)
    samples = "".join(lines)
    unit = f"# UNIT {name} {family.unit}\n" if family.unit else ""
    om = f"# HELP {name} {om_doc}\n# TYPE {name} {family.type}\n{unit}{samples}"
    text_samples = "".join(kept) if moved else samples
    text_type = _TEXT_TYPE.get(family.type, family.type)
    text = [f"# HELP {text_name} {text_doc}\n# TYPE {text_name} {text_type}\n{text_samples}"]
    for suffix, group in sorted(moved.items()):
        text.append(f"# HELP {name}{suffix} {text_doc}\n# TYPE {name}{suffix} gauge\n{''.join(group)}")
    written = _written("".join(text), om)
    cache.keep(name, _Kept(family, tuple(h for _, h, _ in heads), tuple(lines), written))
    return written


def _heads(samples: Sequence[Sample], last: _Kept | None) -> list[tuple[Sample, str, str | None]]:
    """Each sample with its line up to the value, and its whole line where the family's last
    rendering had the same sample at the same place (None: write the value)."""
    if last is None:
        return [(s, _line_head(s.name, s.labels), None) for s in samples]
    before, heads, lines = last.family.samples, last.heads, last.lines
    out: list[tuple[Sample, str, str | None]] = []
    for i, s in enumerate(samples):
        old = before[i] if i < len(before) else None
        if old is not None and old.name == s.name and old.labels == s.labels:
            out.append((s, heads[i], lines[i] if old.value == s.value else None))
        else:
            out.append((s, _line_head(s.name, s.labels), None))
    return out


def _written(text: str, openmetrics: str) -> _Written:
    return _Written(text, openmetrics, len(text) if text.isascii() else len(text.encode()))


def _write_any(family: Metric, cache: LineCache) -> _Written:
    """:func:`_write`, or the library's writers for what they do not handle."""
    if all(s.timestamp is None and s.exemplar is None and s.native_histogram is None for s in family.samples):
        return _write(family, cache)
    one = _Families([family])
    om = generate_openmetrics(one).decode()  # type: ignore[no-untyped-call]
    return _written(generate_latest(one).decode(), om.removesuffix("# EOF\n"))


@dataclass(frozen=True, slots=True)
class _Kept:
    """A family as the last render wrote it."""

    family: Metric  # its samples included: a render makes new families and never changes them
    heads: tuple[str, ...]  # each sample's line up to its value
    lines: tuple[str, ...]
    written: _Written


class LineCache:
    """What the last render wrote, family by family.

    A node's series are nearly all the same from one tick to the next, and writing their lines
    (labels sorted, escaped and joined, values formatted) was most of a render (issue #19). A
    family whose samples equal the last render's is not written again; in one that changed, a
    sample with the same name and labels at the same place keeps its labels written, and its
    whole line when its value is equal (0.0 and -0.0 are equal: a value that turns from one to
    the other keeps its text; Prometheus reads both as zero). Each render keeps only the
    families it wrote, so what went away is forgotten one render later. For one renderer at a
    time: no lock."""

    __slots__ = ("_current", "_previous", "slow")

    def __init__(self) -> None:
        self._current: dict[str, _Kept] = {}
        self._previous: dict[str, _Kept] = {}
        # The samples built from each GPU's slow reading, for the next render's families.
        self.slow = SlowSamples()

    def last(self, family: Metric) -> _Kept | None:
        """``family`` as the last render wrote it, if its name, type, help and unit are the same."""
        kept = self._previous.get(family.name)
        if kept is None:
            return None
        old = kept.family
        if (old.type, old.documentation, old.unit) != (family.type, family.documentation, family.unit):
            return None
        return kept

    def keep(self, name: str, kept: _Kept) -> None:
        self._current[name] = kept

    def rotate(self) -> None:
        """A render is over: what it wrote is what the next one compares with."""
        self._previous, self._current = self._current, {}
        self.slow.rotate()

    def __len__(self) -> int:
        return len(self._previous)


# One GPU's samples for a group of families, one tuple per family, in the group's order.
Chunks = tuple[tuple[Sample, ...], ...]


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


def _line_head(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    written = ",".join([f'{k}="{_escape_value(v)}"' for k, v in sorted(labels.items())])
    return f"{name}{{{written}}}"


class _Families:
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def _go_float(v: float) -> str:
    return floatToGoString(v)  # type: ignore[no-untyped-call,no-any-return]


def _escape_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _non_empty(families: Iterable[Metric]) -> Iterator[Metric]:
    return (f for f in families if f.samples)


# ---------------------------------------------------------------------------------------------
# Field tables shared by both profiles: one family, its series as (extra labels, value getter).

Labels = dict[str, str]
Getter = Callable[[GpuSample], float | None]
MemoryGetter = Callable[[MemoryInfo], float | None]


@dataclass(frozen=True, slots=True)
class _Field:
    name: str  # exactly as exposed; a counter's name ends in _total
    kind: Literal["gauge", "counter", "unknown"]
    doc: str
    series: tuple[tuple[Labels, Getter], ...]
    unit: str = ""
    # Every getter reads only the GPU's slow reading (``GpuSample.slow``): its samples are
    # built once per slow reading (:class:`SlowSamples`).
    slow: bool = False


def _family(name: str, kind: str, doc: str, unit: str = "") -> Metric:
    return Metric(name.removesuffix("_total") if kind == "counter" else name, doc, kind, unit)


def _add(family: Metric, labels: Labels, value: float) -> None:
    name = family.name + "_total" if family.type == "counter" else family.name
    family.samples.append(Sample(name, labels, float(value)))


def _emit(
    fields: Sequence[_Field], rows: Iterable[tuple[GpuSample, Labels]], slow: SlowSamples, group: str
) -> list[Metric]:
    """``fields``' families over ``rows``; the slow fields' samples of a GPU come from ``slow``
    under ``group`` (one name per field table)."""
    families = [_family(f.name, f.kind, f.doc, f.unit) for f in fields]
    fast = [(f, family) for f, family in zip(fields, families, strict=True) if not f.slow]
    slow_fields = tuple(f for f in fields if f.slow)
    slow_families = [family for f, family in zip(fields, families, strict=True) if f.slow]
    build = functools.partial(_series, slow_fields)
    for gpu, base in rows:
        for field, family in fast:
            family.samples.extend(_field_samples(field, gpu, base))
        # Without a slow reading a slow field has no series.
        if gpu.slow is not None and slow_fields:
            for family, chunk in zip(slow_families, slow.chunks(group, gpu, base, build), strict=True):
                family.samples.extend(chunk)
    return families


def _series(fields: Sequence[_Field], gpu: GpuSample, base: Labels) -> Chunks:
    return tuple(tuple(_field_samples(f, gpu, base)) for f in fields)


def _field_samples(field: _Field, gpu: GpuSample, base: Labels) -> Iterator[Sample]:
    # A field's name is its samples' (a counter's family drops the _total its samples keep).
    for extra, get in field.series:
        value = get(gpu)
        if value is not None:
            yield Sample(field.name, {**base, **extra} if extra else base, float(value))


def _emit_mig_memory(
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
                _add(by_name[name], labels, value)


def _memory_fields(table: Sequence[tuple[str, str, MemoryGetter]], unit: str = "") -> tuple[_Field, ...]:
    return tuple(_Field(name, "gauge", doc, _one(_memory(get)), unit) for name, doc, get in table)


def _fast(get: Callable[[FastFields], float | None]) -> Getter:
    return lambda g: None if g.fast is None else get(g.fast)


def _slow(get: Callable[[SlowFields], float | bool | None]) -> Getter:
    return lambda g: None if g.slow is None else _number(get(g.slow))


ProfilingGetter = Callable[[Profiling], float | None]


@dataclass(frozen=True, slots=True)
class _GpmField:
    """A GPM family: the whole GPU's series, and a MIG GPU instance's where GPM measures it."""

    name: str
    doc: str
    series: tuple[tuple[Labels, ProfilingGetter], ...]
    unit: str = ""


def _per_gpu(get: ProfilingGetter) -> tuple[tuple[Labels, ProfilingGetter], ...]:
    return (({}, get),)


def _prof(get: ProfilingGetter) -> Getter:
    return lambda g: None if g.slow is None or g.slow.profiling is None else get(g.slow.profiling)


def _gpm_fields(table: Sequence[_GpmField]) -> tuple[_Field, ...]:
    return tuple(
        _Field(
            f.name, "gauge", f.doc, tuple((labels, _prof(get)) for labels, get in f.series), f.unit, slow=True
        )
        for f in table
    )


def _emit_mig_profiling(
    table: Sequence[_GpmField], families: list[Metric], rows: Iterable[tuple[Profiling, Labels]]
) -> None:
    """MIG GPU instances' GPM joins the GPU's GPM families, told apart by the instance labels."""
    by_name = {f.name: f for f in families}
    for prof, labels in rows:
        for field in table:
            for extra, get in field.series:
                value = get(prof)
                if value is not None:
                    _add(by_name[field.name], {**labels, **extra} if extra else labels, value)


def _mig_profiling(g: GpuSample) -> tuple[MigProfiling, ...]:
    return g.slow.mig_profiling if g.slow is not None else ()


def _violation(policy: str, *, nanoseconds: bool = False) -> Getter:
    def get(g: GpuSample) -> float | None:
        seconds = None if g.slow is None else g.slow.violation_seconds.get(policy)
        if seconds is None or not nanoseconds:
            return seconds
        return float(round(seconds * 1e9))  # dcgm's whole nanoseconds

    return get


def _nvlink_data(direction: str) -> Getter:
    def get(g: GpuSample) -> float | None:
        return None if g.slow is None else _number(g.slow.nvlink_data_bytes.get(direction))

    return get


def _dcgm_nvlink_bandwidth(g: GpuSample) -> float | None:
    """DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as DCGM computes it (DcgmCacheManager.cpp,
    ReadAndCacheNvLinkBandwidth): the change of the KiB counters, TX plus RX, over the interval,
    per second, divided by 1000 and truncated to a whole number."""
    rate = None if g.slow is None else g.slow.nvlink_data_bytes_per_second
    return None if rate is None else float(math.floor(rate / 1024 / 1000))


def _memory(get: MemoryGetter) -> Getter:
    return _fast(lambda f: None if f.memory is None else get(f.memory))


def _number(v: float | bool | None) -> float | None:
    return None if v is None else float(v)


def _scaled(v: float | None, factor: float) -> float | None:
    # Rounded so that 0.29 becomes 29 %, not 28.999999999999996.
    return None if v is None else round(v * factor, 9)


def _mib(v: int | None) -> float | None:
    # dcgm reports whole MiB.
    return None if v is None else float(v // _MIB)


def _one(get: Getter) -> tuple[tuple[Labels, Getter], ...]:
    return (({}, get),)


def _migs(g: GpuSample) -> tuple[MigInstance, ...]:
    return g.slow.mig_instances if g.slow is not None else ()


# ---------------------------------------------------------------------------------------------
# Native profile (DESIGN.md "Metric contract").

_NATIVE_MEMORY: tuple[tuple[str, str, MemoryGetter], ...] = (
    ("gpumon_gpu_memory_total_bytes", "Framebuffer memory in total.", lambda m: m.total_bytes),
    ("gpumon_gpu_memory_used_bytes", "Framebuffer memory in use.", lambda m: m.used_bytes),
    ("gpumon_gpu_memory_free_bytes", "Framebuffer memory free.", lambda m: m.free_bytes),
    (
        "gpumon_gpu_memory_reserved_bytes",
        "Framebuffer memory reserved by the driver.",
        lambda m: m.reserved_bytes,
    ),
)

_NATIVE_GPM: tuple[_GpmField, ...] = (
    *(
        _GpmField(name, doc, series, "ratio")
        for name, doc, series in (
            (
                "gpumon_gpu_graphics_engine_active_ratio",
                "Fraction of the interval the graphics or compute engine was active (GPM).",
                _per_gpu(lambda p: p.graphics_active_ratio),
            ),
            (
                "gpumon_gpu_sm_active_ratio",
                "Fraction of the interval the SMs had at least one warp assigned (GPM).",
                _per_gpu(lambda p: p.sm_active_ratio),
            ),
            (
                "gpumon_gpu_sm_occupancy_ratio",
                "Resident warps as a fraction of the SMs' maximum (GPM).",
                _per_gpu(lambda p: p.sm_occupancy_ratio),
            ),
            (
                "gpumon_gpu_pipe_active_ratio",
                "Fraction of the interval a pipe was active, by pipe (GPM).",
                (
                    ({"pipe": "tensor"}, lambda p: p.tensor_active_ratio),
                    ({"pipe": "fp64"}, lambda p: p.fp64_active_ratio),
                    ({"pipe": "fp32"}, lambda p: p.fp32_active_ratio),
                    ({"pipe": "fp16"}, lambda p: p.fp16_active_ratio),
                ),
            ),
            (
                "gpumon_gpu_dram_active_ratio",
                "Device memory bandwidth used as a fraction of its maximum (GPM).",
                _per_gpu(lambda p: p.dram_active_ratio),
            ),
        )
    ),
    *(
        _GpmField(name, doc, (({"direction": "tx"}, tx), ({"direction": "rx"}, rx)), "bytes_per_second")
        for name, doc, tx, rx in (
            (
                "gpumon_gpu_pcie_bytes_per_second",
                "PCIe traffic, headers included, averaged over the interval, by direction (GPM).",
                lambda p: p.pcie_tx_bytes_per_second,
                lambda p: p.pcie_rx_bytes_per_second,
            ),
            (
                "gpumon_gpu_nvlink_bytes_per_second",
                "NVLink traffic over all links, averaged over the interval, by direction (GPM).",
                lambda p: p.nvlink_tx_bytes_per_second,
                lambda p: p.nvlink_rx_bytes_per_second,
            ),
        )
    ),
)

_NATIVE_FIELDS: tuple[_Field, ...] = (
    *_memory_fields(_NATIVE_MEMORY, "bytes"),
    _Field(
        "gpumon_gpu_utilization_ratio",
        "gauge",
        "Fraction of the sample period the SMs were busy.",
        _one(_fast(lambda f: f.utilization_ratio)),
        "ratio",
    ),
    _Field(
        "gpumon_gpu_memory_utilization_ratio",
        "gauge",
        "Fraction of the sample period the memory controller was busy.",
        _one(_fast(lambda f: f.memory_utilization_ratio)),
        "ratio",
    ),
    _Field(
        "gpumon_gpu_temperature_celsius",
        "gauge",
        "Temperature by sensor.",
        (
            ({"sensor": "gpu"}, _fast(lambda f: f.temperature_gpu_celsius)),
            ({"sensor": "memory"}, _fast(lambda f: f.temperature_memory_celsius)),
        ),
        "celsius",
    ),
    _Field("gpumon_gpu_power_watts", "gauge", "Power draw.", _one(_fast(lambda f: f.power_watts)), "watts"),
    _Field(
        "gpumon_gpu_power_limit_watts",
        "gauge",
        "Power management limit.",
        _one(_fast(lambda f: f.power_limit_watts)),
        "watts",
    ),
    _Field(
        "gpumon_gpu_energy_joules_total",
        "counter",
        "Energy consumed since the driver was loaded.",
        _one(_fast(lambda f: f.energy_joules)),
        "joules",
    ),
    _Field(
        "gpumon_gpu_clock_hertz",
        "gauge",
        "Current clock frequency by clock domain.",
        (
            ({"clock": "sm"}, _fast(lambda f: f.sm_clock_hertz)),
            ({"clock": "memory"}, _fast(lambda f: f.memory_clock_hertz)),
        ),
        "hertz",
    ),
    _Field(
        "gpumon_gpu_pcie_replays_total",
        "counter",
        "PCIe replays (retries).",
        _one(_slow(lambda s: s.pcie_replays)),
        slow=True,
    ),
    _Field(
        "gpumon_gpu_ecc_errors_total",
        "counter",
        "ECC errors since the last driver load (volatile).",
        (
            ({"type": "corrected"}, _slow(lambda s: s.ecc_corrected)),
            ({"type": "uncorrected"}, _slow(lambda s: s.ecc_uncorrected)),
        ),
        slow=True,
    ),
    _Field(
        "gpumon_gpu_remapped_rows",
        "gauge",
        "Memory rows remapped, by the error that caused it.",
        (
            ({"type": "correctable"}, _slow(lambda s: s.remapped_rows_correctable)),
            ({"type": "uncorrectable"}, _slow(lambda s: s.remapped_rows_uncorrectable)),
        ),
        slow=True,
    ),
    _Field(
        "gpumon_gpu_row_remap_pending",
        "gauge",
        "1 when a row remap waits for a GPU reset.",
        _one(_slow(lambda s: s.row_remap_pending)),
        slow=True,
    ),
    _Field(
        "gpumon_gpu_row_remap_failure",
        "gauge",
        "1 when a row remap has failed.",
        _one(_slow(lambda s: s.row_remap_failure)),
        slow=True,
    ),
    _Field(
        "gpumon_gpu_video_utilization_ratio",
        "gauge",
        "Fraction of the sample period the video engines were busy, by engine.",
        (
            ({"engine": "encoder"}, _slow(lambda s: s.encoder_utilization_ratio)),
            ({"engine": "decoder"}, _slow(lambda s: s.decoder_utilization_ratio)),
        ),
        "ratio",
        slow=True,
    ),
    _Field(
        "gpumon_gpu_fan_speed_ratio",
        "gauge",
        "Fan speed as a fraction of its maximum.",
        _one(_slow(lambda s: s.fan_speed_ratio)),
        "ratio",
        slow=True,
    ),
    _Field(
        "gpumon_gpu_performance_state",
        "gauge",
        "Performance state (P-state): 0 is the most performance, 15 the least.",
        _one(_slow(lambda s: s.performance_state)),
        slow=True,
    ),
    _Field(
        "gpumon_gpu_clock_violation_seconds_total",
        "counter",
        "Time clocks were held below target by a policy, since the driver loaded.",
        tuple(({"policy": p}, _violation(p)) for p in VIOLATION_POLICIES),
        "seconds",
        slow=True,
    ),
    _Field(
        "gpumon_gpu_nvlink_data_bytes_total",
        "counter",
        "NVLink data (payload) bytes moved over all links since the driver loaded.",
        tuple(({"direction": d}, _nvlink_data(d)) for d in ("tx", "rx")),
        "bytes",
        slow=True,
    ),
    _Field(
        "gpumon_gpu_vgpu_licensed",
        "gauge",
        "1 while the vGPU holds its licence, 0 while it does not (vGPU guests only).",
        _one(_slow(lambda s: s.vgpu_licensed)),
        slow=True,
    ),
    *_gpm_fields(_NATIVE_GPM),
)

_POD_LABELS = ("node", "namespace", "pod", "container", "gpu", "uuid")


def _native(snap: Snapshot, slow: SlowSamples) -> list[Metric]:
    info = _family("gpumon_gpu_info", "gauge", "GPU identity and driver versions (always 1).")
    health = _family(
        "gpumon_gpu_health",
        "gauge",
        "The exporter's health judgement, one-hot over healthy/degraded/unhealthy/lost.",
    )
    health_info = _family(
        "gpumon_gpu_health_info", "gauge", "Why a GPU is not healthy, one series per reason (always 1)."
    )
    throttled = _family("gpumon_gpu_throttled", "gauge", "1 while a clock event (throttle) reason is active.")
    xids = _family("gpumon_gpu_xid_errors_total", "counter", "Xid errors seen since the exporter started.")
    driver = snap.driver.driver_version if snap.driver else ""
    cuda = snap.driver.cuda_version if snap.driver else ""

    present: list[tuple[GpuSample, Labels]] = []
    for g in snap.gpus:
        ident = g.identity
        base = {"node": snap.node, "gpu": str(ident.index), "uuid": ident.uuid}
        _add(
            info,
            {
                **base,
                "model": ident.model,
                "pci_bus_id": ident.pci_bus_id,
                "driver_version": driver,
                "cuda_version": cuda,
            },
            1,
        )
        for state in HealthState:
            _add(health, {**base, "state": state.value}, 1 if g.health.state is state else 0)
        for reason, detail in dict.fromkeys((r.code, r.detail) for r in g.health.reasons) or [("", "")]:
            _add(health_info, {**base, "reason": reason, "detail": detail}, 1)
        # Xids are events the exporter received, still true of a GPU that is lost since (79,
        # fallen off the bus, is the one that explains the loss).
        for code, count in sorted(g.xid_counts.items()):
            _add(xids, {**base, "xid": "other" if code == XID_OTHER else str(code)}, count)
        if g.lost:
            continue  # no reading a lost GPU gives can be trusted
        present.append((g, base))
        if g.fast is not None and g.fast.throttle_reasons is not None:
            active = g.fast.throttle_reasons
            for reason in (*CLOCK_EVENT_REASONS, *sorted(active - CLOCK_EVENT_REASONS.keys())):
                _add(throttled, {**base, "reason": reason}, 1 if reason in active else 0)

    per_gpu = _emit(_NATIVE_FIELDS, present, slow, "native")
    nvlink_errors = _family(
        _NVLINK_ERRORS,
        "counter",
        "NVLink data-link errors on one link since the driver loaded, by type (replay, recovery, crc).",
    )
    for g, base in present:
        if g.slow is not None:
            (chunk,) = slow.chunks("native_nvlink_errors", g, base, _nvlink_errors)
            nvlink_errors.samples.extend(chunk)
    _emit_mig_memory(
        _NATIVE_MEMORY,
        per_gpu,
        ((mig, {**base, **_mig_labels(mig)}) for g, base in present for mig in _migs(g)),
    )
    # A GPU instance's GPM covers all its compute instances: no compute_instance label.
    _emit_mig_profiling(
        _NATIVE_GPM,
        per_gpu,
        (
            (m.profiling, {**base, "gpu_instance": str(m.gpu_instance), "mig_profile": m.profile})
            for g, base in present
            for m in _mig_profiling(g)
        ),
    )
    return [info, *per_gpu, nvlink_errors, throttled, xids, health, health_info, *_native_pods(snap)]


_NVLINK_ERRORS = "gpumon_gpu_nvlink_errors_total"


def _nvlink_errors(g: GpuSample, base: Labels) -> Chunks:
    assert g.slow is not None
    return (
        tuple(
            Sample(_NVLINK_ERRORS, {**base, "link": str(link), "type": kind}, float(count))
            for (link, kind), count in sorted(g.slow.nvlink_errors.items())
        ),
    )


def _mig_labels(mig: MigInstance) -> Labels:
    return {
        "gpu_instance": str(mig.gpu_instance),
        "compute_instance": str(mig.compute_instance),
        "mig_profile": mig.profile,
    }


def _native_pods(snap: Snapshot) -> list[Metric]:
    used = _family(
        "gpumon_pod_gpu_memory_used_bytes", "gauge", "GPU memory used by the container's processes.", "bytes"
    )
    util = _family(
        "gpumon_pod_gpu_utilization_ratio",
        "gauge",
        "SM busy fraction of the container's processes, summed.",
        "ratio",
    )
    alloc_mem = _family(
        "gpumon_pod_gpu_memory_allocated_bytes",
        "gauge",
        "GPU memory allocated to the container on a shared GPU.",
        "bytes",
    )
    alloc_core = _family(
        "gpumon_pod_gpu_core_allocated_ratio",
        "gauge",
        "Share of GPU cores allocated to the container on a shared GPU.",
        "ratio",
    )
    allocated = _family(
        "gpumon_pod_gpu_allocated",
        "gauge",
        "1 when the device is assigned whole to the container (kubelet pod-resources).",
    )
    unallocated = _family(
        "gpumon_pod_gpu_unallocated_use",
        "gauge",
        "1 when the container's processes use a GPU no source allocated to its pod.",
    )
    claims = _family(
        "gpumon_pod_dra_claim_info",
        "gauge",
        "The DRA ResourceClaim device that gives the container this GPU or MIG device (always 1).",
    )
    for p in snap.pods:
        labels = dict(
            zip(
                _POD_LABELS,
                (snap.node, p.ref.namespace, p.ref.pod, p.ref.container, str(p.gpu_index), p.device_uuid),
                strict=True,
            )
        )
        if p.mig is not None:
            labels |= _mig_labels(p.mig)
        for family, value in (
            (used, p.used_memory_bytes),
            (util, p.utilization_ratio),
            (alloc_mem, p.allocated_memory_bytes),
            (alloc_core, p.allocated_core_ratio),
        ):
            if value is not None:
                _add(family, labels, value)
        for resource in p.allocated_resources:
            _add(allocated, {**labels, "resource": resource}, 1)
        if p.unallocated:
            _add(unallocated, labels, 1)
        for c in p.claims:
            _add(
                claims,
                {
                    **labels,
                    "claim_namespace": c.claim.namespace,
                    "claim_name": c.claim.name,
                    "driver": c.device.driver,
                    "pool": c.device.pool,
                    "device": c.device.device,
                },
                1,
            )
    return [used, util, alloc_mem, alloc_core, allocated, unallocated, claims]


# ---------------------------------------------------------------------------------------------
# dcgm profile: dcgm-exporter's field names, units and help texts (etc/default-counters.csv).
# prometheus_client's text renderer always names a counter family "<name>_total" and OpenMetrics
# requires counter samples to end in "_total"; dcgm's counter fields do not, so they are typed
# "unknown" (untyped in text) to keep dcgm's exact sample names, which is what queries use.


def _throttle_mask(f: FastFields) -> float | None:
    if f.throttle_reasons is None:
        return None
    return float(sum(CLOCK_EVENT_REASONS.get(r, 0) for r in f.throttle_reasons))


_DCGM_MEMORY: tuple[tuple[str, str, MemoryGetter], ...] = (
    ("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", lambda m: _mib(m.total_bytes)),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda m: _mib(m.free_bytes)),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda m: _mib(m.used_bytes)),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", lambda m: _mib(m.reserved_bytes)),
)

_DCGM_XID = _Field(
    "DCGM_FI_DEV_XID_ERRORS",
    "gauge",
    "Value of the last XID error encountered.",
    _one(lambda g: float(g.last_xid or 0)),
)

# dcgm-exporter's profiling fields: one series per GPU (and per MIG GPU instance where GPM
# measures it), in dcgm's units (ratios and bytes per second, as GPM gives them).
_DCGM_GPM: tuple[_GpmField, ...] = tuple(
    _GpmField(name, doc, _per_gpu(get))
    for name, doc, get in (
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine is active.",
            lambda p: p.graphics_active_ratio,
        ),
        (
            "DCGM_FI_PROF_SM_ACTIVE",
            "The ratio of cycles an SM has at least 1 warp assigned.",
            lambda p: p.sm_active_ratio,
        ),
        (
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "The ratio of number of warps resident on an SM.",
            lambda p: p.sm_occupancy_ratio,
        ),
        (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            lambda p: p.tensor_active_ratio,
        ),
        (
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of cycles the device memory interface is active sending or receiving data.",
            lambda p: p.dram_active_ratio,
        ),
        (
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            "Ratio of cycles the fp64 pipes are active.",
            lambda p: p.fp64_active_ratio,
        ),
        (
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            "Ratio of cycles the fp32 pipes are active.",
            lambda p: p.fp32_active_ratio,
        ),
        (
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            "Ratio of cycles the fp16 pipes are active.",
            lambda p: p.fp16_active_ratio,
        ),
        (
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            (
                "The rate of data transmitted over the PCIe bus - including both protocol headers and data"
                " payloads - in bytes per second."
            ),
            lambda p: p.pcie_tx_bytes_per_second,
        ),
        (
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            (
                "The rate of data received over the PCIe bus - including both protocol headers and data"
                " payloads - in bytes per second."
            ),
            lambda p: p.pcie_rx_bytes_per_second,
        ),
        (
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
            lambda p: p.nvlink_tx_bytes_per_second,
        ),
        (
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
            "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
            lambda p: p.nvlink_rx_bytes_per_second,
        ),
    )
)

_DCGM_FIELDS: tuple[_Field, ...] = (
    _Field(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        _one(_fast(lambda f: _scaled(f.sm_clock_hertz, 1e-6))),
    ),
    _Field(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        _one(_fast(lambda f: _scaled(f.memory_clock_hertz, 1e-6))),
    ),
    _Field(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        _one(_fast(lambda f: f.temperature_memory_celsius)),
    ),
    _Field(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        _one(_fast(lambda f: f.temperature_gpu_celsius)),
    ),
    _Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", _one(_fast(lambda f: f.power_watts))),
    _Field(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "gauge",
        "Power management limit (in W).",
        _one(_fast(lambda f: f.power_limit_watts)),
    ),
    _Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "unknown",
        "Total energy consumption since boot (in mJ).",
        _one(_fast(lambda f: _scaled(f.energy_joules, 1e3))),
    ),
    _Field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "unknown",
        "Total number of PCIe retries.",
        _one(_slow(lambda s: s.pcie_replays)),
        slow=True,
    ),
    _Field(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        _one(_fast(lambda f: _scaled(f.utilization_ratio, 100.0))),
    ),
    _Field(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        _one(_fast(lambda f: _scaled(f.memory_utilization_ratio, 100.0))),
    ),
    _Field(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask of nvmlClocksEventReason*).",
        _one(_fast(_throttle_mask)),
    ),
    *_memory_fields(_DCGM_MEMORY),
    _Field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "unknown",
        "Total number of single-bit volatile ECC errors.",
        _one(_slow(lambda s: s.ecc_corrected)),
        slow=True,
    ),
    _Field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "unknown",
        "Total number of double-bit volatile ECC errors.",
        _one(_slow(lambda s: s.ecc_uncorrected)),
        slow=True,
    ),
    _Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "unknown",
        "Number of remapped rows for uncorrectable errors",
        _one(_slow(lambda s: s.remapped_rows_uncorrectable)),
        slow=True,
    ),
    _Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "unknown",
        "Number of remapped rows for correctable errors",
        _one(_slow(lambda s: s.remapped_rows_correctable)),
        slow=True,
    ),
    _Field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        _one(_slow(lambda s: s.row_remap_failure)),
        slow=True,
    ),
    _Field(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gauge",
        "Whether remapping of rows is pending",
        _one(_slow(lambda s: s.row_remap_pending)),
        slow=True,
    ),
    _DCGM_XID,
    _Field(
        "DCGM_FI_DEV_ENC_UTIL",
        "gauge",
        "Encoder utilization (in %).",
        _one(_slow(lambda s: _scaled(s.encoder_utilization_ratio, 100.0))),
        slow=True,
    ),
    _Field(
        "DCGM_FI_DEV_DEC_UTIL",
        "gauge",
        "Decoder utilization (in %).",
        _one(_slow(lambda s: _scaled(s.decoder_utilization_ratio, 100.0))),
        slow=True,
    ),
    _Field(
        "DCGM_FI_DEV_FAN_SPEED",
        "gauge",
        "Fan speed (in 0-100%).",
        _one(_slow(lambda s: _scaled(s.fan_speed_ratio, 100.0))),
        slow=True,
    ),
    _Field(
        "DCGM_FI_DEV_PSTATE",
        "gauge",
        "Performance state (P-State) 0-15.",
        _one(_slow(lambda s: s.performance_state)),
        slow=True,
    ),
    *(
        _Field(
            f"DCGM_FI_DEV_{name}_VIOLATION",
            "unknown",
            f"Throttling duration due to {why} (in ns).",
            _one(_violation(policy, nanoseconds=True)),
            slow=True,
        )
        for name, policy, why in (
            ("POWER", "power", "power constraints"),
            ("THERMAL", "thermal", "thermal constraints"),
            ("SYNC_BOOST", "sync_boost", "sync-boost constraints"),
            ("BOARD_LIMIT", "board_limit", "board limit constraints"),
            ("LOW_UTIL", "low_utilization", "low utilization"),
            ("RELIABILITY", "reliability", "reliability constraints"),
        )
    ),
    _Field(
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "gauge",
        "vGPU License status",
        _one(_slow(lambda s: s.vgpu_licensed)),
        slow=True,
    ),
    _Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "unknown",
        "Total number of NVLink bandwidth counters for all lanes.",
        _one(_dcgm_nvlink_bandwidth),
        slow=True,
    ),
    *_gpm_fields(_DCGM_GPM),
)


def _dcgm(snap: Snapshot, slow: SlowSamples) -> list[Metric]:
    holders = _sole_holders(snap)
    host = {"Hostname": snap.node}
    if snap.driver is not None:
        host["DCGM_FI_DRIVER_VERSION"] = snap.driver.driver_version
    present: list[tuple[GpuSample, Labels]] = []
    lost: list[tuple[GpuSample, Labels]] = []
    mig_rows: list[tuple[MigInstance, Labels]] = []
    mig_gpm_rows: list[tuple[Profiling, Labels]] = []
    for g in snap.gpus:
        ident = g.identity
        device = {
            "gpu": str(ident.index),
            "UUID": ident.uuid,
            "pci_bus_id": ident.pci_bus_id,
            "device": f"nvidia{ident.index}",
            "modelName": ident.model,
        }
        row = (g, {**device, **host, **holders.get((ident.uuid, None), {})})
        if not g.lost:
            present.append(row)
            instance_labels = functools.partial(_dcgm_instance, device, host, holders, ident.uuid)
            mig_rows.extend((mig, instance_labels(mig.gpu_instance, mig.profile)) for mig in _migs(g))
            mig_gpm_rows.extend(
                (m.profiling, instance_labels(m.gpu_instance, m.profile)) for m in _mig_profiling(g)
            )
        elif g.last_xid is not None:
            # dcgm has no health family: the last Xid (79, fallen off the bus, typically) is what
            # dcgm users alert on, and it is event data, still true of a lost GPU.
            lost.append(row)
    families = _emit(_DCGM_FIELDS, present, slow, "dcgm")
    _emit_mig_memory(_DCGM_MEMORY, families, mig_rows)
    _emit_mig_profiling(_DCGM_GPM, families, mig_gpm_rows)
    xid = families[_DCGM_FIELDS.index(_DCGM_XID)]
    for g, labels in lost:
        xid.samples.extend(_field_samples(_DCGM_XID, g, labels))
    return families


def _dcgm_instance(
    device: Labels,
    host: Labels,
    holders: Mapping[tuple[str, int | None], Labels],
    uuid: str,
    gpu_instance: int,
    profile: str,
) -> Labels:
    """A MIG GPU instance's labels as dcgm-exporter writes them: the card's, the instance's
    profile and id, the host's, and the pod given that instance."""
    return {
        **device,
        "GPU_I_PROFILE": profile,
        "GPU_I_ID": str(gpu_instance),
        **host,
        **holders.get((uuid, gpu_instance), {}),
    }


def _sole_holders(snap: Snapshot) -> dict[tuple[str, int | None], Labels]:
    """pod/namespace/container labels for each device one container uses: a card (its UUID,
    None) or a MIG instance on it (the card's UUID and its GPU instance id, which is how
    dcgm-exporter tells MIG series apart: ``UUID`` stays the card's, ``GPU_I_ID`` names the
    instance).

    dcgm-exporter puts the pod assigned a device on every series of that device. A device several
    containers share keeps no pod labels, so sums over devices stay right; per-container shares are
    in the native profile's gpumon_pod_* families. A device the container holds through one DRA
    claim device also gets dcgm-exporter's ``dra_*`` labels (:func:`_dra_labels`)."""
    users: dict[tuple[str, int | None], list[PodGpuUsage]] = {}
    for p in snap.pods:
        device = (p.gpu_uuid, None if p.mig is None else p.mig.gpu_instance)
        users.setdefault(device, []).append(p)
    holders: dict[tuple[str, int | None], Labels] = {}
    for device, ps in users.items():
        if len({p.ref for p in ps}) != 1:
            continue
        p = ps[0]
        holders[device] = {
            "pod": p.ref.pod,
            "namespace": p.ref.namespace,
            "container": p.ref.container,
            **_dra_labels(p),
        }
    return holders


def _dra_labels(p: PodGpuUsage) -> Labels:
    """dcgm-exporter's labels for a device held through DRA (internal/pkg/transformation,
    kubernetes.go and const.go): the claim and the (driver, pool, device) of its allocation, and
    for a MIG device its profile and UUID. None when several claim devices give the container
    this device: one series cannot name them all."""
    if len(p.claims) != 1:
        return {}
    c = p.claims[0]
    labels = {
        "dra_claim_name": c.claim.name,
        "dra_claim_namespace": c.claim.namespace,
        "dra_driver_name": c.device.driver,
        "dra_pool_name": c.device.pool,
        "dra_device_name": c.device.device,
    }
    if p.mig is not None:
        labels |= {"dra_mig_profile": p.mig.profile, "dra_mig_device_uuid": p.mig.uuid}
    return labels
