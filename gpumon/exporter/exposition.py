"""Snapshot -> pre-rendered exposition bytes, once per sampling tick and never per scrape.

Two profiles describe the same snapshot. ``native`` is gpumon's metric contract (base units,
``gpumon_`` names); ``dcgm`` uses dcgm-exporter's names, units and labels so dashboards and
alerts written for it work unchanged; ``both`` emits the two side by side (their names never
overlap). Every series, unit and deviation from dcgm-exporter is listed in docs/metrics.md.

The snapshot becomes prometheus_client ``metrics_core`` families through each profile's catalog
(:mod:`~gpumon.exporter.catalog_native`, :mod:`~gpumon.exporter.catalog_dcgm`: what is exported,
and from which field). Those are written by a small writer here rather than by the library's
``generate_latest``: the library re-validates and re-escapes every label name of every sample,
which made a tick of 8 GPUs x 64 pods cost 12-16 ms instead of 3-5 ms, and the writer renders
each sample line once for both formats. ``extra`` collectors (self-metrics, histograms,
``_created`` samples) are collected once per tick and go through the same writer (the library
wrote them twice a tick, once per format, at more cost than the 470 GPU and pod samples: issue
#19); a family the writer does not handle (timestamps, exemplars, native histograms) goes through
the library. The output is byte-for-byte the library's, which the unit tests check on every
profile with hostile label values.

A renderer that keeps a :class:`LineCache` from one render to the next writes only what changed
since its last render: on the mock node (8 GPUs, 64 pods, about 900 samples) a render went from
7.6 to 4.3 ms of its thread's CPU (issue #19, docs/benchmarks.md). It also keeps each GPU's
samples of the slow fields (:class:`~gpumon.exporter.catalog.SlowSamples`), built again only
from a new slow reading: the render thread 0.42-0.48 -> 0.30-0.33 % of a core on the mock node.

A :class:`RenderedMetrics` holds the sample lines; each of the four bodies (text or OpenMetrics,
plain or gzip) is written on first use and kept. The render thread writes those that scrapes asked
for lately (:func:`prerender_variants`) before it publishes the payload, so a scrape is served
bytes already written, and nothing is written or compressed that nobody asks for.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as _OPENMETRICS
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from gpumon.exporter.catalog import SlowSamples
from gpumon.exporter.catalog_dcgm import dcgm_families
from gpumon.exporter.catalog_native import native_families
from gpumon.gpu.model import Snapshot

CONTENT_TYPE_TEXT = CONTENT_TYPE_PLAIN_0_0_4
CONTENT_TYPE_OPENMETRICS = _OPENMETRICS

Profile = Literal["native", "dcgm", "both"]

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
        yield from _non_empty(native_families(snapshot, slow))
    if profile in ("dcgm", "both"):
        yield from _non_empty(dcgm_families(snapshot, slow))


def family_names(profile: Profile) -> tuple[str, ...]:
    """Every family a snapshot can fill in ``profile``, empty or not, by its samples' base name (a
    counter's family drops the ``_total`` its samples keep). The device check lists against it
    which of them a real GPU left empty (bench/device_check)."""
    nothing = Snapshot("", None, (), (), 0.0, backend_up=True, complete=True)
    native = native_families(nothing, SlowSamples()) if profile in ("native", "both") else []
    dcgm = dcgm_families(nothing, SlowSamples()) if profile in ("dcgm", "both") else []
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
