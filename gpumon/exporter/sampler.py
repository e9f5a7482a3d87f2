"""The background sampler: read devices on two cadences, build one snapshot, have it rendered.

Fast fields (memory, utilization, temperature, power, clocks, processes) are read every
``sampling.fast_interval_seconds``, slow ones (ECC, remapped rows, PCIe replays, MIG) every
``sampling.slow_interval_seconds``. Every backend call runs in the sampler's own thread pool with
a timeout; a GPU whose earlier call is still hung is skipped (and counted) rather than given
another thread. Xid events come from one dedicated thread blocked in ``wait_xids``. A batch
after a quiet fast interval is published at once, without waiting for the next tick; batches
that follow it within the interval are folded into the state and ride the next tick's render,
so a storm of Xids costs no render of its own, and logs at most ``XID_LOG_BURST`` lines per
``XID_LOG_WINDOW_SECONDS``. Each snapshot is rendered off the loop
(:mod:`gpumon.exporter.render_thread`); scrapes are served the last finished payload.

This is the imperative shell: clocks, threads, timeouts and logs. What a reading does to a GPU's
state is :mod:`gpumon.exporter.gpu_state`, what a watcher is told is
:mod:`gpumon.exporter.watch_events`, both pure.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from gpumon.config import SamplingConfig
from gpumon.devices.backend import (
    BackendError,
    BackendUnavailable,
    DeviceBackend,
    DeviceCallError,
    GpuLostError,
)
from gpumon.exporter.exposition import Profile, RenderedMetrics, Variant
from gpumon.exporter.gpu_state import (
    GpuState,
    carry_over,
    to_sample,
    with_fast,
    with_lost,
    with_recovery_action,
    with_slow,
    with_xids,
)
from gpumon.exporter.render_thread import RenderThread
from gpumon.exporter.self_metrics import SelfMetrics
from gpumon.exporter.sources import PodAttributor
from gpumon.exporter.watch_events import HealthChange, watch_events
from gpumon.exporter.watchers import Watcher
from gpumon.exporter.xid_handover import Handover
from gpumon.gpu.health import HealthPolicy
from gpumon.gpu.model import (
    DriverInfo,
    FastFields,
    PodGpuUsage,
    SlowFields,
    Snapshot,
    XidEvent,
)
from gpumon.runtime.threadnames import name_os_thread

log = logging.getLogger(__name__)

T = TypeVar("T")

REOPEN_BACKOFF_BASE_SECONDS = 1.0
REOPEN_BACKOFF_CAP_SECONDS = 30.0
_XID_WAIT_SECONDS = 1.0
# One warning per Xid is what an operator wants from a rare event; in a storm (thousands a
# second) the lines themselves become the outage. Past the burst, Xids are only counted (the
# metric counts every one) and the number not logged is logged once the window ends.
XID_LOG_BURST = 10
XID_LOG_WINDOW_SECONDS = 10.0
# Health changes are rarer than Xids, but a storm of varied codes changes a verdict's reasons on
# every render: the same kind of budget, with room for every GPU of a node to change at once.
HEALTH_LOG_BURST = 32


def reopen_delay(failures: int) -> float:
    """Seconds to wait before the next attempt to open the backend after ``failures`` in a row."""
    return min(REOPEN_BACKOFF_CAP_SECONDS, REOPEN_BACKOFF_BASE_SECONDS * 2.0 ** max(0, failures - 1))


class _Skipped(Exception):
    """The previous call for this key is still hung."""


_OPEN_KEY = ("open",)


class LogBudget:
    """At most ``burst`` lines per ``window`` seconds; the rest are counted, not written."""

    def __init__(self, burst: int, window: float) -> None:
        self._burst = burst
        self._window = window
        self._started = float("-inf")
        self._used = 0
        self.suppressed = 0

    def take(self, now: float) -> bool:
        if now - self._started >= self._window:
            self._started, self._used = now, 0
        if self._used < self._burst:
            self._used += 1
            return True
        self.suppressed += 1
        return False

    def flush(self, now: float) -> int:
        """Lines held back, once their window has ended (then forgotten); 0 before that."""
        if not self.suppressed or now - self._started < self._window:
            return 0
        n, self.suppressed = self.suppressed, 0
        return n


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
        self._rendered_complete = False  # a complete snapshot's payload has been served
        self._hung: dict[Hashable, Future[Any]] = {}
        self._watchers: set[Watcher] = set()
        self._stop = threading.Event()
        self._xids_allowed = threading.Event()  # set while the backend is open
        self._xid_thread: threading.Thread | None = None
        # When the last Xid batch came (loop time): one after a quiet interval renders at once.
        self._last_xid_at = float("-inf")
        # GPUs whose recovery action is to be read again (an Xid came), and the one task reading.
        self._recovery_due: set[int] = set()
        self._recovery_reader: asyncio.Task[None] | None = None
        self._xid_log = LogBudget(XID_LOG_BURST, XID_LOG_WINDOW_SECONDS)
        self._health_log = LogBudget(HEALTH_LOG_BURST, XID_LOG_WINDOW_SECONDS)
        self.snapshot: Snapshot | None = None
        self._render = RenderThread(
            profile=profile,
            extra=(metrics.registry,),
            on_rendered=self._rendered,
            on_failed=lambda: metrics.record_error("render", "unexpected"),
        )
        self.publishes = 0
        metrics.backend_up.set(0)

    # -- what the server reads -----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """After the first complete sample is rendered, and not while the backend is down."""
        return self._rendered_complete and self._up

    @property
    def rendered(self) -> RenderedMetrics | None:
        """The last payload rendered: what a scrape is served, never waiting for a render."""
        return self._render.rendered

    def asked(self, variant: Variant) -> None:
        """A scrape asked for ``variant``: the next renders write it before they publish."""
        self._render.asked(variant)

    async def rendered_latest(self) -> RenderedMetrics | None:
        """The payload once every snapshot published so far is rendered."""
        return await self._render.idle()

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
        # A restarted run (gpumon/runtime/tasks.py's Supervisor) keeps the Xid thread it already has.
        if self._xid_thread is None or not self._xid_thread.is_alive():
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
        if self._recovery_reader is not None:
            self._recovery_reader.cancel()
        try:
            async with asyncio.timeout(self._sampling.call_timeout_seconds):
                await asyncio.wrap_future(self._executor.submit(self._backend.close))
        except Exception as e:  # shutting down: report, never raise
            log.warning("closing the device backend failed: %s", e or type(e).__name__)
        if self._xid_thread is not None:
            await asyncio.to_thread(self._xid_thread.join, _XID_WAIT_SECONDS * 2)
        self._render.close()

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
            if self._up:
                self._metrics.last_sample.labels("fast").set(now)
        else:
            self._complete = False
        if suppressed := self._xid_log.flush(self._now_monotonic()):
            log.warning("Xid events not logged (rate limit)", extra={"suppressed": suppressed})
        if suppressed := self._health_log.flush(self._now_monotonic()):
            log.warning("GPU health changes not logged (rate limit)", extra={"suppressed": suppressed})
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
        name_os_thread()
        source = f"{self._backend.name}.wait_xids"
        # Real time even under a test's clocks: this thread paces itself, it decides nothing.
        clock = time.monotonic
        handover = Handover()
        while not self._stop.is_set():
            if not self._xids_allowed.wait(_XID_WAIT_SECONDS) or self._stop.is_set():
                continue
            try:
                events = self._backend.wait_xids(handover.wait_seconds(clock(), _XID_WAIT_SECONDS))
            except BackendUnavailable:
                # The sampler's next read notices and re-opens; nothing to do here but wait.
                self._stop.wait(_XID_WAIT_SECONDS)
                continue
            except Exception:
                self._metrics.record_error(source, "unexpected")
                log.exception("waiting for Xid events failed")
                self._stop.wait(_XID_WAIT_SECONDS)
                continue
            handover, due = handover.add(events, clock())
            if due:
                try:
                    loop.call_soon_threadsafe(self.ingest_xids, due)
                except RuntimeError:  # the loop closed under us: shutting down
                    return

    def ingest_xids(self, events: Sequence[XidEvent]) -> None:
        """Count Xid events (on the event loop); publish at once after a quiet fast interval,
        else leave them to the next tick's render: in a storm, each render on the loop is a
        scrape kept waiting."""
        by_uuid = {s.identity.uuid: i for i, s in self._states.items()}
        now = self._now_monotonic()
        by_gpu: dict[int, list[XidEvent]] = {}
        for ev in events:
            index = by_uuid.get(ev.uuid, ev.index)
            if index is None or index not in self._states:
                self._metrics.record_error(f"{self._backend.name}.wait_xids", "unknown_gpu")
                continue
            by_gpu.setdefault(index, []).append(ev)
            if self._xid_log.take(now):
                log.warning("Xid event", extra={"gpu": index, "uuid": ev.uuid, "xid": ev.xid})
        for index, gpu_events in by_gpu.items():
            self._states[index] = with_xids(self._states[index], gpu_events)
        quiet = now - self._last_xid_at >= self._sampling.fast_interval_seconds
        self._last_xid_at = now
        if quiet:
            self._publish()
        self._read_recovery_actions(by_gpu)

    def _read_recovery_actions(self, indices: Iterable[int]) -> None:
        """Have the recovery action of these GPUs read again: an Xid is when the driver changes
        it. One task reads, one call per GPU at a time, however many Xids a storm brings."""
        self._recovery_due.update(indices)
        if self._recovery_due and (self._recovery_reader is None or self._recovery_reader.done()):
            self._recovery_reader = asyncio.get_running_loop().create_task(self._recovery_actions())

    async def _recovery_actions(self) -> None:
        source = f"{self._backend.name}.read_recovery_action"
        while self._recovery_due and self._up:
            indices = sorted(self._recovery_due)
            self._recovery_due.clear()
            results = await asyncio.gather(
                *(self._call(("gpu", i), source, self._backend.read_recovery_action, i) for i in indices),
                return_exceptions=True,
            )
            before = dict(self._states)
            for index, result in zip(indices, results, strict=True):
                if index not in self._states:
                    continue
                if isinstance(result, BaseException):
                    self._handle_failure(index, "read_recovery_action", result)
                else:
                    self._states[index] = with_recovery_action(self._states[index], result)
            if self._states != before:
                self._publish()

    # -- publish -----------------------------------------------------------------------------------

    def _rendered(self, snapshot: Snapshot, rendered: RenderedMetrics) -> None:
        self._rendered_complete |= snapshot.complete
        self._metrics.scrape_bytes.set(rendered.text_bytes)

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
        self._render.submit(snapshot)
        self.publishes += 1
        events = watch_events(previous, snapshot, hot_celsius=self._policy.temperature_degraded_celsius)
        logged_at = self._now_monotonic()
        for ev in events:
            if (
                isinstance(ev, HealthChange)
                and ev.verdict_changed
                and ev.previous is not None
                and self._health_log.take(logged_at)
            ):
                log.warning(
                    "GPU health changed",
                    extra={
                        "gpu": ev.sample.identity.index,
                        "uuid": ev.sample.identity.uuid,
                        "from": ev.previous.state.value,
                        "to": ev.sample.health.state.value,
                        "reason": ev.sample.health.detail,
                    },
                )
        for w in self._watchers:
            w.push(events)
