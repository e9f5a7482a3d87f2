"""The background sampler: read devices on two cadences, build one snapshot, render it once.

Fast fields (memory, utilization, temperature, power, clocks, processes) are read every
``sampling.fast_interval_seconds``, slow ones (ECC, remapped rows, PCIe replays, MIG) every
``sampling.slow_interval_seconds``. Every backend call runs in the sampler's own thread pool with
a timeout; a GPU whose earlier call is still hung is skipped (and counted) rather than given
another thread. Xid events come from one dedicated thread blocked in ``wait_xids`` and are
published at once, without waiting for the next tick.

The per-GPU bookkeeping (:class:`GpuState` and the functions beside it) is pure; the
:class:`Sampler` is the imperative shell around it.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpumon import __version__, build
from gpumon.config import SamplingConfig
from gpumon.devices.backend import (
    BackendError,
    BackendUnavailable,
    DeviceBackend,
    DeviceCallError,
    GpuLostError,
)
from gpumon.devices.model import (
    DriverInfo,
    FastFields,
    GpuIdentity,
    GpuSample,
    HealthVerdict,
    PodGpuUsage,
    PodRef,
    SlowFields,
    Snapshot,
    XidEvent,
)
from gpumon.exporter.exposition import Profile, RenderedMetrics, render
from gpumon.exporter.sources import PodAttributor
from gpumon.gpu_health import HealthPolicy, judge
from gpumon.wire.v1 import MAX_XIDS_PER_GPU, placement

log = logging.getLogger(__name__)

T = TypeVar("T")

REOPEN_BACKOFF_BASE_SECONDS = 1.0
REOPEN_BACKOFF_CAP_SECONDS = 30.0
WATCH_QUEUE_SIZE = 256
_XID_WAIT_SECONDS = 1.0

_NO_COUNTS: Mapping[int, int] = MappingProxyType({})
_NO_XIDS: Mapping[int, XidEvent] = MappingProxyType({})


def reopen_delay(failures: int) -> float:
    """Seconds to wait before the next attempt to open the backend after ``failures`` in a row."""
    return min(REOPEN_BACKOFF_CAP_SECONDS, REOPEN_BACKOFF_BASE_SECONDS * 2.0 ** max(0, failures - 1))


# ---------------------------------------------------------------------------------------------
# Pure per-GPU bookkeeping


@dataclass(frozen=True, slots=True)
class GpuState:
    """What the sampler knows about one GPU between ticks."""

    identity: GpuIdentity
    fast: FastFields | None = None
    slow: SlowFields | None = None
    sampled_at: float = 0.0  # wall time of the last good fast read; 0 = never
    lost: bool = False
    xid_counts: Mapping[int, int] = field(default_factory=lambda: _NO_COUNTS)
    # Xid code -> its latest event, as the backend delivered it (timestamp included), oldest
    # first; at most MAX_XIDS_PER_GPU codes, so a storm of new codes cannot grow it.
    xids: Mapping[int, XidEvent] = field(default_factory=lambda: _NO_XIDS)
    last_xid: int | None = None


def with_fast(state: GpuState, fields: FastFields, now: float) -> GpuState:
    return replace(state, fast=fields, sampled_at=now, lost=False)


def with_slow(state: GpuState, fields: SlowFields) -> GpuState:
    return replace(state, slow=fields, lost=False)


def with_lost(state: GpuState) -> GpuState:
    # A lost GPU reports nothing: keeping its last readings would pretend it still works.
    return replace(state, fast=None, slow=None, lost=True)


def with_xid(state: GpuState, event: XidEvent) -> GpuState:
    counts = dict(state.xid_counts)
    counts[event.xid] = counts.get(event.xid, 0) + 1
    latest = {code: ev for code, ev in state.xids.items() if code != event.xid}
    latest[event.xid] = event
    while len(latest) > MAX_XIDS_PER_GPU:
        del latest[next(iter(latest))]
    return replace(
        state,
        xid_counts=MappingProxyType(counts),
        xids=MappingProxyType(latest),
        last_xid=event.xid,
    )


def to_sample(state: GpuState, *, now: float, policy: HealthPolicy) -> GpuSample:
    verdict = judge(
        fast=state.fast,
        slow=state.slow,
        recent_xids=state.xids.values(),
        lost=state.lost,
        now=now,
        policy=policy,
    )
    return GpuSample(
        identity=state.identity,
        fast=state.fast,
        slow=state.slow,
        health=verdict,
        sampled_at=state.sampled_at,
        xid_counts=state.xid_counts,
        lost=state.lost,
        last_xid=state.last_xid,
        xids=tuple(sorted(state.xids.values(), key=lambda e: e.xid)),
    )


def carry_over(old: Mapping[int, GpuState], identities: Sequence[GpuIdentity]) -> dict[int, GpuState]:
    """States for a fresh device list: a GPU seen before (same UUID) keeps its counters."""
    by_uuid = {s.identity.uuid: s for s in old.values()}
    out = {}
    for ident in identities:
        prev = by_uuid.get(ident.uuid)
        out[ident.index] = replace(prev, identity=ident) if prev is not None else GpuState(ident)
    return out


# ---------------------------------------------------------------------------------------------
# Watch events: what /api/v1/watch streams


@dataclass(frozen=True, slots=True)
class HealthChange:
    """A GPU changed in something its watch line carries (docs/exporter.md)."""

    sample: GpuSample
    pods: tuple[PodRef, ...]  # the pods attributed to the GPU
    previous: HealthVerdict | None  # None: a GPU seen for the first time
    at: float


@dataclass(frozen=True, slots=True)
class BackendChange:
    up: bool
    at: float


WatchEvent = HealthChange | BackendChange


def _codes(v: HealthVerdict) -> tuple[str, ...]:
    return (v.state.value, *(r.code for r in v.reasons))


def _line_key(g: GpuSample, pods: tuple[PodRef, ...], hot_celsius: float) -> tuple[object, ...]:
    """What makes a GPU's watch line worth sending again. Discrete evidence counts on every
    change; the temperature only at or above ``hot_celsius`` (the exporter's degraded
    threshold), to the whole degree, so the cool majority of a fleet is quiet on the wire."""
    temp = g.fast.temperature_gpu_celsius if g.fast is not None else None
    # Unknown, cool (any value below the threshold), or hot to the degree.
    heat = None if temp is None else round(temp) if temp >= hot_celsius else "cool"
    slow = g.slow or SlowFields()
    return (
        _codes(g.health),
        heat,
        slow.ecc_uncorrected,
        slow.row_remap_pending,
        slow.row_remap_failure,
        g.lost,
        tuple((e.xid, e.timestamp) for e in g.xids),
        pods,
    )


def watch_events(
    previous: Snapshot | None, current: Snapshot, *, hot_celsius: float
) -> tuple[WatchEvent, ...]:
    """What changed between two snapshots: the backend going up or down, and every GPU whose
    watch line would differ (see :func:`_line_key`)."""
    events: list[WatchEvent] = []
    if previous is None or previous.backend_up != current.backend_up:
        events.append(BackendChange(current.backend_up, current.taken_at))
    before = {g.identity.uuid: g for g in previous.gpus} if previous else {}
    pods_before = placement(previous.pods) if previous else {}
    pods_now = placement(current.pods)
    for g in current.gpus:
        uuid = g.identity.uuid
        old, pods = before.get(uuid), pods_now.get(uuid, ())
        if old is None or _line_key(old, pods_before.get(uuid, ()), hot_celsius) != _line_key(
            g, pods, hot_celsius
        ):
            events.append(HealthChange(g, pods, old.health if old else None, current.taken_at))
    return tuple(events)


class Watcher:
    """One subscriber's queue of watch events. ``None`` in the queue means "events were lost
    because you fell behind: re-send the whole state"."""

    def __init__(self, maxsize: int = WATCH_QUEUE_SIZE) -> None:
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue(maxsize)

    def push(self, events: Sequence[WatchEvent]) -> None:
        for ev in events:
            try:
                self.queue.put_nowait(ev)
            except asyncio.QueueFull:
                while not self.queue.empty():
                    self.queue.get_nowait()
                self.queue.put_nowait(None)
                return


# ---------------------------------------------------------------------------------------------
# Self-metrics


class SelfMetrics:
    """The exporter's own series, in a registry of its own (never the global one)."""

    def __init__(self, registry: CollectorRegistry, *, backend: str) -> None:
        self.registry = registry
        Gauge(
            "gpumon_exporter_build_info",
            "gpumon exporter build (package version, image git revision), Python version and device backend.",
            ["version", "revision", "python_version", "backend"],
            registry=registry,
        ).labels(__version__, build.current().revision, platform.python_version(), backend).set(1)
        self.sample_duration = Histogram(
            "gpumon_exporter_sample_duration_seconds",
            "Time taken by one sampling tick, by cadence.",
            ["cadence"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )
        self.last_sample = Gauge(
            "gpumon_exporter_last_sample_timestamp_seconds",
            "Unix time of the last tick that read the devices, by cadence.",
            ["cadence"],
            registry=registry,
        )
        self.errors = Counter(
            "gpumon_exporter_errors",
            "Failed reads and other errors, by source and kind.",
            ["source", "kind"],
            registry=registry,
        )
        self.backend_up = Gauge(
            "gpumon_exporter_nvml_up",
            "1 when the device backend (NVML or simulated) is open and answering.",
            registry=registry,
        )
        self.scrape_bytes = Gauge(
            "gpumon_exporter_scrape_bytes",
            "Size of the previous rendered Prometheus text payload, uncompressed.",
            registry=registry,
        )
        self.skipped = Counter(
            "gpumon_exporter_skipped_reads",
            "Device reads not attempted because the GPU's previous call was still hung.",
            registry=registry,
        )

    def record_error(self, source: str, kind: str) -> None:
        """An :data:`~gpumon.devices.backend.ErrorSink`; safe from any thread."""
        self.errors.labels(source, kind).inc()


# ---------------------------------------------------------------------------------------------
# The sampler


class _Skipped(Exception):
    """The previous call for this key is still hung."""


_OPEN_KEY = ("open",)


class Sampler:
    def __init__(
        self,
        backend: DeviceBackend,
        *,
        node: str,
        profile: Profile,
        sampling: SamplingConfig,
        policy: HealthPolicy,
        executor: ThreadPoolExecutor,
        metrics: SelfMetrics,
        attributor: PodAttributor | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self._backend = backend
        self._node = node
        self._profile: Profile = profile
        self._sampling = sampling
        self._policy = policy
        self._executor = executor
        self._metrics = metrics
        self._attributor = attributor
        self._wall = wall_clock
        self._monotonic = monotonic
        self._open_lock = asyncio.Lock()
        self._up = False
        self._open_failures = 0
        self._next_open_at = float("-inf")
        self._driver: DriverInfo | None = None
        self._states: dict[int, GpuState] = {}
        self._pods: tuple[PodGpuUsage, ...] = ()
        self._complete = False
        self._ever_complete = False
        self._hung: dict[Hashable, Future[Any]] = {}
        self._watchers: set[Watcher] = set()
        self._stop = threading.Event()
        self._xids_allowed = threading.Event()  # set while the backend is open
        self._xid_thread: threading.Thread | None = None
        self.snapshot: Snapshot | None = None
        self.rendered: RenderedMetrics | None = None
        self.renders = 0
        metrics.backend_up.set(0)

    # -- what the server reads -----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """After the first complete sample, and not while the backend is down."""
        return self._ever_complete and self._up

    @property
    def backend_up(self) -> bool:
        return self._up

    @property
    def hung_calls(self) -> int:
        """Device calls that timed out and have not returned yet."""
        return sum(not f.done() for f in self._hung.values())

    def subscribe(self) -> Watcher:
        w = Watcher()
        self._watchers.add(w)
        return w

    def unsubscribe(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Sample until cancelled. Slow fields first, so the first fast tick can be complete."""
        self._xid_thread = threading.Thread(
            target=self._pump_xids, args=(asyncio.get_running_loop(),), name="gpumon-xid", daemon=True
        )
        self._xid_thread.start()
        await self._guarded(self.sample_slow)
        await self._guarded(self.sample_fast)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._every(self._sampling.fast_interval_seconds, self.sample_fast))
            tg.create_task(self._every(self._sampling.slow_interval_seconds, self.sample_slow))

    async def shutdown(self) -> None:
        """Stop the Xid thread and close the backend; call after cancelling :meth:`run`."""
        self._stop.set()
        self._xids_allowed.set()  # wake the thread if it waits for the backend
        try:
            async with asyncio.timeout(self._sampling.call_timeout_seconds):
                await asyncio.wrap_future(self._executor.submit(self._backend.close))
        except Exception as e:  # shutting down: report, never raise
            log.warning("closing the device backend failed: %s", e or type(e).__name__)
        if self._xid_thread is not None:
            await asyncio.to_thread(self._xid_thread.join, _XID_WAIT_SECONDS * 2)

    async def _every(self, interval: float, tick: Callable[[], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            await self._guarded(tick)
            # After an overrun, skip the missed ticks instead of running them back to back.
            due = max(due + interval, loop.time())

    async def _guarded(self, tick: Callable[[], Awaitable[None]]) -> None:
        try:
            await tick()
        except Exception:
            self._metrics.record_error("sampler", "unexpected")
            log.exception("sampling tick failed")

    def _now_monotonic(self) -> float:
        return self._monotonic() if self._monotonic else asyncio.get_running_loop().time()

    # -- ticks ---------------------------------------------------------------------------------

    async def sample_fast(self) -> None:
        started = self._now_monotonic()
        if await self._ensure_open():
            results = await self._read_all("read_fast")
            now = self._wall()
            fresh = set()
            for index, result in results.items():
                if isinstance(result, FastFields):
                    self._states[index] = with_fast(self._states[index], result, now)
                    fresh.add(index)
                elif self._handle_failure(index, "read_fast", result):
                    fresh.add(index)
            self._complete = self._up and all(
                i in fresh and (s.lost or s.slow is not None) for i, s in self._states.items()
            )
            self._ever_complete |= self._complete
            if self._up:
                self._metrics.last_sample.labels("fast").set(now)
        else:
            self._complete = False
        self._publish(attribute=True)
        self._metrics.sample_duration.labels("fast").observe(self._now_monotonic() - started)

    async def sample_slow(self) -> None:
        started = self._now_monotonic()
        if await self._ensure_open():
            results = await self._read_all("read_slow")
            for index, result in results.items():
                if isinstance(result, SlowFields):
                    self._states[index] = with_slow(self._states[index], result)
                else:
                    self._handle_failure(index, "read_slow", result)
            if self._up:
                self._metrics.last_sample.labels("slow").set(self._wall())
            self._publish()
        if self._attributor is not None:
            await self._refresh_pods(self._attributor)
        self._metrics.sample_duration.labels("slow").observe(self._now_monotonic() - started)

    async def _refresh_pods(self, attributor: PodAttributor) -> None:
        try:
            async with asyncio.timeout(self._sampling.slow_interval_seconds):
                await attributor.refresh()
        except TimeoutError:
            self._metrics.record_error("pods.refresh", "timeout")
        except Exception:
            self._metrics.record_error("pods.refresh", "unexpected")
            log.exception("pod attribution refresh failed")

    async def _read_all(self, method: Literal["read_fast", "read_slow"]) -> dict[int, object]:
        indices = sorted(self._states)
        fn = getattr(self._backend, method)
        source = f"{self._backend.name}.{method}"
        results = await asyncio.gather(
            *(self._call(("gpu", i), source, fn, i) for i in indices), return_exceptions=True
        )
        return dict(zip(indices, results, strict=True))

    def _handle_failure(self, index: int, method: str, error: object) -> bool:
        """Account for a failed read; True when the GPU's state is known anyway (lost)."""
        source = f"{self._backend.name}.{method}"
        match error:
            case GpuLostError():
                if not self._states[index].lost:
                    self._metrics.record_error(source, "lost")
                    log.warning("GPU lost", extra={"gpu": index, "uuid": self._states[index].identity.uuid})
                self._states[index] = with_lost(self._states[index])
                return True
            case BackendUnavailable():
                self._mark_down(source, error)
            case DeviceCallError():
                self._metrics.record_error(source, error.kind)
            case TimeoutError() | _Skipped():
                pass  # counted where it happened
            case BaseException():
                self._metrics.record_error(source, "unexpected")
                log.error("device read failed", exc_info=error, extra={"gpu": index})
        return False

    # -- backend open / down ---------------------------------------------------------------------

    async def _ensure_open(self) -> bool:
        async with self._open_lock:
            if self._up:
                return True
            now = self._now_monotonic()
            if now < self._next_open_at:
                return False
            source = f"{self._backend.name}.open"
            try:
                driver = await self._call(_OPEN_KEY, source, self._backend.open)
                identities = await self._call(_OPEN_KEY, source, self._backend.devices)
            except (BackendError, TimeoutError, _Skipped) as e:
                self._open_failures += 1
                delay = reopen_delay(self._open_failures)
                self._next_open_at = now + delay
                if isinstance(e, BackendError):
                    self._metrics.record_error(source, "unavailable")
                log.warning(
                    "device backend unavailable, retrying",
                    extra={
                        "backend": self._backend.name,
                        "error": str(e) or type(e).__name__,
                        "retry_in": delay,
                    },
                )
                return False
            self._driver = driver
            self._states = carry_over(self._states, identities)
            self._up = True
            self._open_failures = 0
            self._metrics.backend_up.set(1)
            self._xids_allowed.set()
            log.info(
                "device backend open",
                extra={
                    "backend": self._backend.name,
                    "gpus": len(identities),
                    "driver": driver.driver_version,
                },
            )
            return True

    def _mark_down(self, source: str, error: object) -> None:
        if not self._up:
            return
        self._up = False
        self._complete = False
        self._xids_allowed.clear()
        self._next_open_at = self._now_monotonic()  # first retry on the next tick, then back off
        self._metrics.backend_up.set(0)
        self._metrics.record_error(source, "unavailable")
        log.error("device backend went away; serving last data marked stale", extra={"error": str(error)})

    # -- calls into the backend -------------------------------------------------------------------

    async def _call(self, key: Hashable, source: str, fn: Callable[..., T], *args: Any) -> T:
        hung = self._hung.get(key)
        if hung is not None:
            if not hung.done():
                self._metrics.skipped.inc()
                raise _Skipped(source)
            del self._hung[key]
        future = self._executor.submit(fn, *args)
        try:
            async with asyncio.timeout(self._sampling.call_timeout_seconds):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            # A call still queued is cancelled; one already running cannot be, so remember it
            # and give this GPU no second thread until it returns.
            if not future.cancel():
                self._hung[key] = future
            self._metrics.record_error(source, "timeout")
            raise

    # -- Xid events ------------------------------------------------------------------------------

    def _pump_xids(self, loop: asyncio.AbstractEventLoop) -> None:
        source = f"{self._backend.name}.wait_xids"
        while not self._stop.is_set():
            if not self._xids_allowed.wait(_XID_WAIT_SECONDS) or self._stop.is_set():
                continue
            try:
                events = self._backend.wait_xids(_XID_WAIT_SECONDS)
            except BackendUnavailable:
                # The sampler's next read notices and re-opens; nothing to do here but wait.
                self._stop.wait(_XID_WAIT_SECONDS)
                continue
            except Exception:
                self._metrics.record_error(source, "unexpected")
                log.exception("waiting for Xid events failed")
                self._stop.wait(_XID_WAIT_SECONDS)
                continue
            if events:
                try:
                    loop.call_soon_threadsafe(self.ingest_xids, events)
                except RuntimeError:  # the loop closed under us: shutting down
                    return

    def ingest_xids(self, events: Sequence[XidEvent]) -> None:
        """Count Xid events and publish at once (on the event loop)."""
        by_uuid = {s.identity.uuid: i for i, s in self._states.items()}
        for ev in events:
            index = by_uuid.get(ev.uuid, ev.index)
            if index is None or index not in self._states:
                self._metrics.record_error(f"{self._backend.name}.wait_xids", "unknown_gpu")
                continue
            self._states[index] = with_xid(self._states[index], ev)
            log.warning("Xid event", extra={"gpu": index, "uuid": ev.uuid, "xid": ev.xid})
        self._publish()

    # -- publish -----------------------------------------------------------------------------------

    def _publish(self, *, attribute: bool = False) -> None:
        now = self._wall()
        gpus = tuple(to_sample(self._states[i], now=now, policy=self._policy) for i in sorted(self._states))
        if attribute and self._attributor is not None:
            try:
                self._pods = self._attributor.attribute(gpus)
            except Exception:
                self._metrics.record_error("pods.attribute", "unexpected")
                log.exception("pod attribution failed; keeping the last pods")
        snapshot = Snapshot(
            node=self._node,
            driver=self._driver,
            gpus=gpus,
            pods=self._pods,
            taken_at=now,
            backend_up=self._up,
            complete=self._complete,
        )
        previous, self.snapshot = self.snapshot, snapshot
        try:
            self.rendered = render(snapshot, profile=self._profile, extra=(self._metrics.registry,))
            self._metrics.scrape_bytes.set(len(self.rendered.text))
        except Exception:
            self._metrics.record_error("render", "unexpected")
            log.exception("rendering the snapshot failed; serving the previous payload")
        self.renders += 1
        events = watch_events(previous, snapshot, hot_celsius=self._policy.temperature_degraded_celsius)
        for ev in events:
            if isinstance(ev, HealthChange) and ev.previous is not None:
                health = ev.sample.health
                if _codes(health) == _codes(ev.previous):
                    continue  # a number, an Xid's time or the pods changed, not the verdict
                log.warning(
                    "GPU health changed",
                    extra={
                        "gpu": ev.sample.identity.index,
                        "uuid": ev.sample.identity.uuid,
                        "from": ev.previous.state.value,
                        "to": health.state.value,
                        "reason": health.detail,
                    },
                )
        for w in self._watchers:
            w.push(events)
