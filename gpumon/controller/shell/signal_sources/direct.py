"""Signals straight from the exporters, no Prometheus: pushed, not polled.

Each exporter is subscribed to once, at ``/api/v1/watch`` (schema :mod:`gpumon.wire.v1`, see
docs/exporter.md): every GPU on connect, then a line whenever a GPU changes in something the
policy or the drain reads (the exporter's verdict, the uncorrectable ECC count, row-remap flags,
lost, an Xid with its time, the temperature while hot, the pods on the GPU), and a heartbeat
when nothing changes. That costs next to nothing for the healthy majority of a fleet, and a
watched exporter is never polled. An exporter without the watch endpoint (404) has its
``/api/v1/snapshot`` fetched every poll interval instead, with a bounded pool.

Every line and document is parsed with the wire schema's models and limits, and a node never
holds more than :data:`~gpumon.wire.v1.MAX_GPUS` GPUs across lines either. Input they refuse
(too long, another schema version, wrong types, too many GPUs or pods), and a connection over
its line budget (``flood``), is counted by kind in :attr:`DirectSource.errors` and per node
(``on_refusal``), logged at most once per interval per node, withdraws that node's reading at
once (unknown until the reconnect's state line) and ends that connection; each refusal in a row
lengthens the wait before the next connect. Nothing is ever buffered beyond the limits, and a
node's lines yield the loop every few dozen, so one node's flood cannot starve the others or
the lease renewal.

Freshness: a node counts as observed when its exporter last spoke (a heartbeat says "no
change"); an exporter whose device backend is down, or that cannot be reached, yields no reading.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final

import aiohttp

from gpumon.controller.core.backoff import Backoff
from gpumon.controller.core.signals import ChangeCallback, FleetSignals, GpuReading, NodeReading, XidSeen
from gpumon.controller.shell.signal_sources.endpoints import Endpoints
from gpumon.runtime.tasks import cancel_and_wait
from gpumon.wire import v1 as wire

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# What the controller knows about one exporter (pure)


_QUIET = "the Prometheus source's alone (it asks only for values some rule holds for): every value comes here"

# The GpuReading fields each of this source's two readers leaves unknown, with why; they fill
# every other one (tests/unit/test_gpu_reading_coverage.py holds them to it).
NOT_ON_THE_STREAM: Final[Mapping[str, str]] = {
    "memory_utilization_ratio": (
        "it changes on every fast read: a line per GPU per tick for the whole fleet; "
        "memory_utilization rules need the Prometheus source (or an exporter without the watch endpoint)"
    ),
    "custom": "values of promql rules: the Prometheus source's alone",
    "quiet": _QUIET,
}
NOT_IN_THE_SNAPSHOT: Final[Mapping[str, str]] = {
    "custom": "values of promql rules: the Prometheus source's alone",
    "quiet": _QUIET,
}


def _xids(xids: Iterable[wire.Xid]) -> tuple[XidSeen, ...]:
    return tuple(XidSeen(x.code, x.at) for x in xids)


def gpu_reading(s: wire.GpuStatus, at: float) -> GpuReading:
    """One GPU of a watch line, as observed at ``at`` (the stream confirms it until it changes:
    :func:`reading_of` dates it by the stream's latest line)."""
    return GpuReading(
        uuid=s.uuid,
        index=s.gpu,
        observed_at=at,
        temperature_celsius=s.temperature_celsius,
        ecc_uncorrectable=s.ecc_uncorrected,
        row_remap_failure=s.row_remap_failure,
        recovery_action=s.recovery_action,
        lost=s.lost,
        health=wire.health_verdict(s.health),
        xids=_xids(s.xids),
        pods=tuple(wire.pod_ref(p) for p in s.pods),
    )


def snapshot_readings(doc: wire.SnapshotDoc, now: float) -> tuple[GpuReading, ...]:
    """The GPUs of an ``/api/v1/snapshot`` document (exporters without a watch endpoint)."""
    pods: dict[str, list[wire.Pod]] = {}
    for p in doc.pods:
        pods.setdefault(p.gpu_uuid, []).append(p.ref)
    out = []
    for g in doc.gpus:
        fast, slow = g.fast, g.slow
        out.append(
            GpuReading(
                uuid=g.identity.uuid,
                index=g.identity.index,
                observed_at=min(g.sampled_at, now),
                temperature_celsius=None if fast is None else fast.temperature_gpu_celsius,
                memory_utilization_ratio=None if fast is None else fast.memory_utilization_ratio,
                ecc_uncorrectable=None if slow is None else slow.ecc_uncorrected,
                row_remap_failure=None if slow is None else slow.row_remap_failure,
                recovery_action=None if slow is None else slow.recovery_action,
                lost=g.lost,
                health=wire.health_verdict(g.health),
                xids=_xids(g.xids),
                pods=tuple(wire.pod_ref(p) for p in pods.get(g.identity.uuid, ())),
            )
        )
    return tuple(out)


_NO_GPUS: Mapping[str, GpuReading] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ExporterView:
    node: str
    heard_at: float | None = None
    backend_up: bool = True
    # Streamed: each GPU as its latest line told it, by UUID. Converted as the line arrives, the
    # wire models are never kept: a parsed GpuStatus (a pydantic model with its verdict and pod
    # models) holds 2.4 KiB against 0.5 as a GpuReading (the scale curve's cache table), and
    # at 10,000 nodes the kept models were about 180 of the controller's 467 MiB (tracemalloc).
    gpus: Mapping[str, GpuReading] = field(default_factory=lambda: _NO_GPUS)
    # Polled (no watch endpoint): the GPUs of the latest snapshot.
    polled: tuple[GpuReading, ...] | None = None


def _unchanged(old: GpuReading | None, new: GpuReading) -> bool:
    """The same reading but for when it was observed. Unlike a polled source's comparison
    (core/signals.py, ``says_the_same``), an Xid's new time is a change: the stream sends a line
    only when something changed."""
    return old is not None and replace(old, observed_at=new.observed_at) == new


def on_line(view: ExporterView, line: wire.WatchLine, now: float) -> tuple[ExporterView, bool]:
    """Fold one watch line in; also says whether anything but the time changed."""
    match line:
        case wire.HeartbeatLine():
            return replace(view, heard_at=now), False
        case wire.BackendLine(up=up):
            return replace(view, heard_at=now, backend_up=up), up != view.backend_up
        case wire.StateLine(backend_up=up, gpus=gpus):
            by_uuid = {g.uuid: gpu_reading(g, now) for g in gpus}
            changed = (
                up != view.backend_up
                or by_uuid.keys() != view.gpus.keys()
                or not all(_unchanged(view.gpus[u], g) for u, g in by_uuid.items())
            )
            return replace(view, heard_at=now, backend_up=up, gpus=MappingProxyType(by_uuid)), changed
        case wire.HealthLine(gpu=status):
            previous = view.gpus.get(status.uuid)
            # The bound holds across lines too: a stream of new UUIDs must not grow one node
            # without limit (and the copy below stays at most MAX_GPUS entries).
            if previous is None and len(view.gpus) >= wire.MAX_GPUS:
                raise wire.WireError("oversize", f"a GPU beyond the {wire.MAX_GPUS} this node already has")
            gpu = gpu_reading(status, now)
            changed = not _unchanged(previous, gpu)
            return replace(view, heard_at=now, gpus=MappingProxyType({**view.gpus, gpu.uuid: gpu})), changed


def on_snapshot(view: ExporterView, doc: wire.SnapshotDoc, now: float) -> ExporterView:
    return replace(view, heard_at=now, backend_up=doc.backend_up, polled=snapshot_readings(doc, now))


@dataclass(frozen=True, slots=True)
class LineBudget:
    """A token bucket over one connection's lines: ``burst`` at once, ``rate`` a second after."""

    tokens: float
    at: float


def spend_line(budget: LineBudget, now: float, rate: float, burst: float) -> LineBudget | None:
    """The budget after one more line at ``now``, or None when the connection is over it."""
    tokens = min(burst, budget.tokens + (now - budget.at) * rate)
    return LineBudget(tokens - 1.0, now) if tokens >= 1.0 else None


def reading_of(view: ExporterView) -> NodeReading | None:
    if view.heard_at is None or not view.backend_up:
        return None
    if view.polled is not None:
        gpus = view.polled
    else:
        at = view.heard_at
        gpus = tuple(replace(g, observed_at=at) for g in sorted(view.gpus.values(), key=lambda g: g.index))
    # The exporter places pods on GPUs when it names any; otherwise the drain takes every GPU pod.
    busy = any(g.pods for g in gpus)
    return NodeReading(view.node, view.heard_at, gpus, pods_attributed=busy, busy=busy)


class _LazyReadings(Mapping[str, NodeReading]):
    """Readings built on first access and cached until that exporter's view changes."""

    def __init__(
        self, views: Mapping[str, ExporterView], cache: dict[str, tuple[ExporterView, NodeReading | None]]
    ):
        self._views = views
        self._cache = cache

    def __getitem__(self, node: str) -> NodeReading:
        view = self._views[node]
        hit = self._cache.get(node)
        if hit is None or hit[0] is not view:
            hit = (view, reading_of(view))
            self._cache[node] = hit
        if hit[1] is None:
            raise KeyError(node)
        return hit[1]

    def get(self, node: str, default: Any = None) -> Any:
        try:
            return self[node]
        except KeyError:
            return default

    def __contains__(self, node: object) -> bool:
        return isinstance(node, str) and self.get(node) is not None

    def __iter__(self) -> Iterator[str]:
        return (n for n in list(self._views) if n in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True, slots=True)
class DirectSettings:
    heartbeat_seconds: float = 20.0  # the config's default: a third of the 60 s staleness
    poll_interval_seconds: float = 5.0
    timeout_seconds: float = 5.0
    max_concurrency: int = 32
    bearer_token: str | None = None
    # https: the name the exporters' certificate is checked against (they are reached by IP).
    server_name: str | None = None
    # One exporter's watch lines: a connection may send ``line_burst`` at once and
    # ``lines_per_second`` after. An honest exporter sends a state line per connect, a line per
    # GPU change and a heartbeat; beyond this the connection is dropped and counted as ``flood``.
    lines_per_second: float = 200.0
    line_burst: float = 2000.0
    # A misbehaving node is logged at most once per this many seconds, with what was suppressed.
    log_interval_seconds: float = 60.0
    # Watches being set up at once (connect, request, first line). Unbounded, a restart opened
    # all of a fleet's at once: at 5,000 nodes the event loop could not finish them within the
    # connect timeout, so they failed, backed off and came back together, and the fleet took
    # minutes to be heard (docs/benchmarks.md). A connection holds its place only until its
    # first line.
    max_connecting: int = 200
    # A stream silent for this long (no line, not even a heartbeat) is ended and opened again;
    # None: two heartbeats and 5 s, so that at the default heartbeat (a third of the staleness)
    # a stream stalled for a while is opened again, and its node read, before it goes stale.
    # Also the bound on a watch's set-up (connect to first line).
    read_timeout_seconds: float | None = None

    @property
    def read_timeout(self) -> float:
        t = self.read_timeout_seconds
        return 2 * self.heartbeat_seconds + 5 if t is None else t

    @property
    def sweep_seconds(self) -> float:
        """How often silent streams are looked for: a stream is ended at most this long after
        its read timeout. One sweep reads a time per stream (2.5 ms at 10,000)."""
        return min(self.heartbeat_seconds, self.read_timeout) / 4


class LogThrottle:
    """At most one log line per key and interval, saying how many were left out since."""

    def __init__(self, interval_seconds: float) -> None:
        self._interval = interval_seconds
        # Per key: when it was last logged, and how many were not logged since.
        self._logged: dict[str, tuple[float, int]] = {}

    def allow(self, key: str, now: float) -> int | None:
        """None to stay quiet; else log now, saying this many were suppressed before."""
        last, suppressed = self._logged.get(key, (float("-inf"), 0))
        if now - last < self._interval:
            self._logged[key] = (last, suppressed + 1)
            return None
        self._logged[key] = (now, 0)
        return suppressed

    def forget(self, key: str) -> None:
        self._logged.pop(key, None)


# Lines parsed before letting the rest of the loop run, within one buffered chunk.
_LINES_BETWEEN_YIELDS = 64


class Flooded(Exception):
    """An exporter's connection went over its line budget."""


RECONNECT_BACKOFF = Backoff(initial_seconds=0.5, max_seconds=30.0)


async def read_bounded(chunks: AsyncIterable[bytes], limit: int) -> bytes:
    """A whole body, refused (``oversize``) as soon as it passes ``limit`` bytes."""
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise wire.WireError("oversize", f"a document longer than {limit} bytes")
    return bytes(body)


class DirectSource:
    """A :class:`SignalSource` subscribed to every exporter's watch stream."""

    name = "direct"

    def __init__(
        self,
        settings: DirectSettings,
        endpoints: Endpoints,
        session: aiohttp.ClientSession,
        *,
        wall_clock: Callable[[], float] = time.time,
        backoff: Backoff = RECONNECT_BACKOFF,
        on_error: Callable[[str], None] = lambda kind: None,
        on_refusal: Callable[[str, str], None] = lambda node, kind: None,
        on_refusals_forgotten: Callable[[str, frozenset[str]], None] = lambda node, kinds: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._s = settings
        self._endpoints = endpoints
        self._session = session
        self._clock = wall_clock
        self._backoff = backoff
        self._views: dict[str, ExporterView] = {}
        self._cache: dict[str, tuple[ExporterView, NodeReading | None]] = {}
        self._watchers: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._polled: set[str] = set()  # exporters without a watch endpoint
        self._limit = asyncio.Semaphore(settings.max_concurrency)
        self._connecting = asyncio.Semaphore(settings.max_connecting)
        self._on_change: ChangeCallback = lambda nodes: None
        # Failures by kind: the wire schema's refusals (oversize, schema, invalid) and
        # connection (unreachable, HTTP error, cut stream).
        self.errors: collections.Counter[str] = collections.Counter()
        self._on_error = on_error
        self._on_refusal = on_refusal
        # The kinds each node has been refused for (what ``on_refusal`` was told), until the
        # node's exporter leaves the endpoints: then ``on_refusals_forgotten`` is told, so that
        # per-node series of nodes long gone do not pile up.
        self._on_refusals_forgotten = on_refusals_forgotten
        self._refused_kinds: dict[str, set[str]] = {}
        self._monotonic = monotonic
        self._log_throttle = LogThrottle(settings.log_interval_seconds)
        # Streams past their set-up: when each last sent anything (monotonic), and the timeout
        # the sweep fires when that is longer ago than the read timeout.
        self._read_at: dict[str, float] = {}
        self._silence: dict[str, asyncio.Timeout] = {}

    # -- the SignalSource face ----------------------------------------------------------------

    def current(self) -> FleetSignals:
        return FleetSignals(_LazyReadings(self._views, self._cache), source_up=True)

    @property
    def connected(self) -> int:
        return sum(1 for _, t in self._watchers.values() if not t.done())

    # -- I/O ----------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._s.bearer_token}"} if self._s.bearer_token else {}

    def _failed(self, node: str, kind: str, error: Exception, what: str) -> None:
        """An exporter that could not be reached or whose stream was cut: its reading ages."""
        self.errors[kind] += 1
        self._on_error(kind)
        log.debug(what, extra={"node": node, "error": str(error) or repr(error)})

    def _crashed(self, node: str, what: str) -> None:
        """A failure of our own code on one node's input: logged with its traceback (call it
        from an ``except`` block) and counted, never the end of that node's reading for good."""
        self.errors["internal"] += 1
        self._on_error("internal")
        log.exception(what, extra={"node": node})

    def _refused(self, node: str, kind: str, error: Exception, what: str) -> None:
        """An exporter that sent what the wire refuses, or sent too much of it."""
        self.errors[kind] += 1
        self._on_error(kind)
        # The node broke the wire: what it said is not evidence either way, so its reading is
        # withdrawn (unknown: never unhealthy, never remediated) until a good state line.
        self._on_refusal(node, kind)
        self._refused_kinds.setdefault(node, set()).add(kind)
        view = self._views.get(node)
        if view is not None and view.heard_at is not None:
            self._views[node] = ExporterView(node)
            self._on_change((node,))
        # A node refusing line after line must not flood the log: once per interval per node.
        suppressed = self._log_throttle.allow(node, self._monotonic())
        if suppressed is not None:
            log.warning(
                what, extra={"node": node, "kind": kind, "error": str(error), "suppressed": suppressed}
            )

    async def _watch(self, node: str, url: str) -> None:
        attempt = 0
        # Connections in a row that ended in a refusal: a hostile exporter connects fine every
        # time, so this (not the connect) decides how soon it is read again.
        strikes = 0
        hb = self._s.heartbeat_seconds
        # No sock_read: aiohttp re-arms that timer on every chunk of every stream (17 % of a
        # 10,000-node controller's loop, py-spy); a silent stream is found by one sweep instead.
        timeout = aiohttp.ClientTimeout(sock_connect=self._s.timeout_seconds)
        while True:
            # Held from the connect to the first line (the timeouts count from there), or to
            # the end of a connection that never sent one.
            await self._connecting.acquire()
            setting_up = True
            # Bounds the set-up (request, headers, first line); then it waits for the sweep.
            silence = asyncio.timeout(self._s.read_timeout)
            try:
                async with (
                    silence,
                    self._session.get(
                        url.rstrip("/") + "/api/v1/watch",
                        params={"heartbeat": f"{hb:g}"},
                        headers=self._headers(),
                        timeout=timeout,
                        server_hostname=self._s.server_name,
                    ) as resp,
                ):
                    if resp.status == 404:
                        self._connecting.release()
                        setting_up = False
                        silence.reschedule(None)  # the snapshot fetch has its own timeout
                        log.info("exporter has no watch endpoint; polling it", extra={"node": node})
                        self._polled.add(node)
                        await self._fetch_snapshot(node, url)
                        return
                    resp.raise_for_status()
                    attempt = 0
                    # A (re)connect's first line makes a stale node fresh even when its
                    # GPUs are the same as before: tell the reconciler.
                    reconnected = True
                    lines = wire.LineSplitter()
                    rate, burst = self._s.lines_per_second, self._s.line_burst
                    budget: LineBudget | None = LineBudget(burst, self._monotonic())
                    async for chunk in resp.content.iter_any():
                        self._read_at[node] = self._monotonic()
                        for i, raw in enumerate(lines.feed(chunk)):
                            if i and i % _LINES_BETWEEN_YIELDS == 0:
                                await asyncio.sleep(0)
                            budget = spend_line(budget, self._monotonic(), rate, burst) if budget else None
                            if budget is None:
                                raise Flooded(f"more than {rate:g} lines a second after {burst:g}")
                            view = self._views.get(node) or ExporterView(node)
                            view, changed = on_line(view, wire.parse_watch_line(raw), self._clock())
                            self._views[node] = view
                            if changed or reconnected:
                                self._on_change((node,))
                            reconnected = False
                            if setting_up:
                                self._connecting.release()
                                setting_up = False
                                silence.reschedule(None)
                                self._silence[node] = silence
                        # A chunk already buffered is handed over without suspending: let the
                        # lease renewal and the other nodes run between this node's chunks.
                        await asyncio.sleep(0)
                    strikes = 0
            except wire.WireError as e:
                self._refused(node, e.kind, e, "exporter watch line refused; reconnecting")
                strikes += 1
            except Flooded as e:
                self._refused(node, "flood", e, "exporter watch over its line rate; reconnecting")
                strikes += 1
            except (aiohttp.ClientError, TimeoutError) as e:
                self._failed(node, "connection", e, "exporter watch ended")
                strikes = 0
            except Exception:
                # A bug of ours on this node's input: the traceback is logged and the watcher
                # starts over like any other failure, rather than the node going dark for good.
                self._crashed(node, "exporter watch failed; reconnecting")
            finally:
                self._silence.pop(node, None)
                self._read_at.pop(node, None)
                if setting_up:
                    self._connecting.release()
            attempt += 1
            await asyncio.sleep(self._backoff.delay(attempt + strikes, salt=len(node)))

    def _sweep(self) -> None:
        """End the streams silent for longer than the read timeout (each watch then counts a
        connection failure and opens its stream again)."""
        now, limit = self._monotonic(), self._s.read_timeout
        at = asyncio.get_running_loop().time()
        # Only the silent ones are copied out. A copy of every (node, timeout) pair, 10,000
        # tuples a sweep, lived long enough to count toward the garbage collector's full
        # collections: at 10,000 streams and a sweep every 5 s those walked the million objects
        # the streams hold for 0.56 s every 40 s, 0.014 cores (gc.callbacks, in-process).
        silent = [node for node in self._silence if now - self._read_at.get(node, now) > limit]
        for node in silent:
            self._silence.pop(node).reschedule(at)

    async def _sweeps(self) -> None:
        while True:
            await asyncio.sleep(self._s.sweep_seconds)
            self._sweep()

    async def _fetch_snapshot(self, node: str, url: str) -> None:
        async with self._limit:
            try:
                timeout = aiohttp.ClientTimeout(total=self._s.timeout_seconds)
                async with self._session.get(
                    url.rstrip("/") + "/api/v1/snapshot",
                    headers=self._headers(),
                    timeout=timeout,
                    server_hostname=self._s.server_name,
                ) as resp:
                    resp.raise_for_status()
                    body = await read_bounded(resp.content.iter_any(), wire.MAX_DOCUMENT_BYTES)
                doc = wire.parse_snapshot(body)
            except wire.WireError as e:
                self._refused(node, e.kind, e, "exporter snapshot refused")
                return
            except (aiohttp.ClientError, TimeoutError) as e:
                self._failed(node, "connection", e, "snapshot fetch failed")
                return
        try:
            view = self._views.get(node) or ExporterView(node)
            new = on_snapshot(view, doc, self._clock())
            changed = reading_of(new) != reading_of(view)
        except Exception:
            # A bug of ours on one node's document must not end the poll of every node.
            self._crashed(node, "exporter snapshot could not be read")
            return
        self._views[node] = new
        if changed:
            self._on_change((node,))

    def _sync_watchers(self) -> None:
        urls = self._endpoints.current()
        for node, (url, task) in list(self._watchers.items()):
            if urls.get(node) != url:
                task.cancel()
                del self._watchers[node]
                self._polled.discard(node)
        for node in [n for n in self._views if n not in urls]:
            del self._views[node]
            self._cache.pop(node, None)
            self._on_change((node,))
        for node in [n for n in self._refused_kinds if n not in urls]:
            self._log_throttle.forget(node)
            self._on_refusals_forgotten(node, frozenset(self._refused_kinds.pop(node)))
        for node, url in urls.items():
            if node not in self._watchers:
                self._watchers[node] = (
                    url,
                    asyncio.create_task(self._watch(node, url), name=f"watch {node}"),
                )

    async def _poll(self) -> None:
        """Exporters without a watch endpoint, every poll interval (each watch task fetched its
        node's first snapshot the moment it found the endpoint missing)."""
        while True:
            await asyncio.sleep(self._s.poll_interval_seconds)
            urls = self._endpoints.current()
            await asyncio.gather(*(self._fetch_snapshot(n, urls[n]) for n in list(self._polled) if n in urls))

    async def run(self, on_change: ChangeCallback) -> None:
        self._on_change = on_change
        poller = asyncio.create_task(self._poll(), name="direct snapshot poller")
        sweeper = asyncio.create_task(self._sweeps(), name="direct stream sweep")
        try:
            # A restarted source has no watchers yet, and the endpoints may not change again.
            self._sync_watchers()
            while True:
                await self._endpoints.changed.wait()
                self._endpoints.changed.clear()
                self._sync_watchers()
        finally:
            # Forget them first: a run cancelled meanwhile ends at the first await below, and a
            # restarted run must subscribe to every exporter again.
            tasks = [poller, sweeper, *(t for _, t in self._watchers.values())]
            self._watchers.clear()
            self._polled.clear()
            await cancel_and_wait(tasks)
