"""The exporter's HTTP face (aiohttp): cached bytes out, never a device call on a request.

Routes: ``/metrics`` (Prometheus text or OpenMetrics, plain or gzip, written once per tick for
the variants scraped: :class:`~gpumon.exporter.exposition.RenderedMetrics`), ``/healthz``,
``/readyz``, ``/api/v1/snapshot`` (JSON), ``/api/v1/watch`` (health transitions as
newline-delimited JSON), plus the routes the caller passes in (the simulator's ``/api/v1/faults``,
added by the wiring that picks the simulated backend: this module knows no simulator).
Authentication, when configured (:mod:`gpumon.httpauth`), guards everything but the two probes,
which the kubelet calls without credentials.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from prometheus_client import CollectorRegistry

from gpumon.config import ExporterConfig
from gpumon.devices.backend import DeviceBackend
from gpumon.exporter.exposition import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT
from gpumon.exporter.render_thread import RENDER_SWITCH_INTERVAL
from gpumon.exporter.sampler import Sampler, reopen_delay
from gpumon.exporter.self_metrics import SelfMetrics
from gpumon.exporter.sources import PodAttributor
from gpumon.exporter.watch_events import BackendChange, WatchEvent
from gpumon.exporter.watchers import Watcher
from gpumon.gpu.model import Snapshot
from gpumon.httpauth.guard import Guard, guard
from gpumon.httpauth.kubernetes import ReviewApi
from gpumon.runtime.tasks import Supervisor
from gpumon.runtime.threadnames import name_os_thread
from gpumon.wire import v1 as wire

log = logging.getLogger(__name__)

WATCH_HEARTBEAT_SECONDS = 10.0


# ---------------------------------------------------------------------------------------------
# Content negotiation (pure)


def _media_ranges(header: str) -> list[tuple[str, float]]:
    out = []
    for part in header.split(","):
        fields = [f.strip() for f in part.split(";")]
        if not fields[0]:
            continue
        q = 1.0
        for f in fields[1:]:
            if f.startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        out.append((fields[0].lower(), q))
    return out


def choose_format(accept: str) -> Literal["text", "openmetrics"]:
    """OpenMetrics when the client ranks it at least as high as plain text, as Prometheus does."""
    om = text = 0.0
    for media, q in _media_ranges(accept):
        if media == "application/openmetrics-text":
            om = max(om, q)
        elif media in ("text/plain", "text/*", "*/*"):
            text = max(text, q)
    return "openmetrics" if om > 0 and om >= text else "text"


def accepts_gzip(accept_encoding: str) -> bool:
    return any(media in ("gzip", "*") and q > 0 for media, q in _media_ranges(accept_encoding))


# ---------------------------------------------------------------------------------------------
# Watch lines (pure): the schema is gpumon.wire.v1's


def event_line(ev: WatchEvent, *, node: str) -> wire.WatchLine:
    if isinstance(ev, BackendChange):
        return wire.backend_line(ev.up, node=node, at=ev.at)
    previous = ev.previous.state if ev.previous is not None else None
    return wire.health_line(ev.sample, ev.pods, previous, node=node, at=ev.at)


# ---------------------------------------------------------------------------------------------
# The application


@dataclass(slots=True)
class ExporterState:
    """Everything the handlers share, built by :func:`make_app` and owned by the app."""

    config: ExporterConfig
    sampler: Sampler
    executor: ThreadPoolExecutor
    auth: Guard
    wall_clock: Callable[[], float]
    # The sampler runs under it: restarted with backoff if it ever dies (gpumon/runtime/tasks.py).
    supervisor: Supervisor = field(default_factory=lambda: Supervisor(delay=reopen_delay))
    watch_tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    snapshot_json: tuple[Snapshot | None, bytes] = (None, b"")


STATE = web.AppKey("state", ExporterState)


def make_app(
    config: ExporterConfig,
    backend: DeviceBackend,
    *,
    metrics: SelfMetrics | None = None,
    attributor: PodAttributor | None = None,
    wall_clock: Callable[[], float] = time.time,
    routes: Iterable[web.AbstractRouteDef] = (),
    reviews: ReviewApi | None = None,
) -> web.Application:
    """The exporter app; the sampler starts with the app and stops with it (``cleanup_ctx``).

    ``routes`` are what the backend adds beside the exporter's own (the simulator's fault
    injection); the authentication middleware guards them like the rest. ``reviews`` carries
    ``auth.mode: kubernetes``'s TokenReviews and SubjectAccessReviews; without it the app opens
    its own client (the pod's service account, else the kubeconfig)."""
    metrics = metrics or SelfMetrics(CollectorRegistry(auto_describe=True), backend=backend.name)
    # Threads start on demand; one per GPU per cadence at most, plus open and close.
    executor = ThreadPoolExecutor(
        max_workers=2 * 64 + 2, thread_name_prefix="gpumon-device", initializer=name_os_thread
    )
    sampler = Sampler(
        backend,
        node=config.node_name,
        profile=config.metrics_profile,
        sampling=config.sampling,
        policy=config.health.policy(),
        executor=executor,
        metrics=metrics,
        attributor=attributor,
        wall_clock=wall_clock,
    )
    supervisor = Supervisor(
        delay=reopen_delay, on_restart=lambda task: metrics.task_restarts.labels(task).inc()
    )
    auth = guard(
        config.auth,
        on_error=lambda kind: metrics.record_error("auth", kind),
        supervisor=supervisor,
        api=reviews,
    )
    state = ExporterState(config, sampler, executor, auth, wall_clock, supervisor=supervisor)
    app = web.Application(middlewares=[auth.middleware])
    app[STATE] = state
    app.cleanup_ctx.append(auth.lifespan)
    app.cleanup_ctx.append(_sampling)
    app.on_shutdown.append(_end_watches)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/api/v1/snapshot", _snapshot)
    app.router.add_get("/api/v1/watch", _watch)
    app.router.add_routes(routes)
    return app


async def _sampling(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(RENDER_SWITCH_INTERVAL)
    state.supervisor.start("gpumon-sampler", state.sampler.run)
    yield
    sys.setswitchinterval(switch_interval)
    await state.supervisor.stop()
    await state.sampler.shutdown()
    # A hung device call cannot be interrupted; do not wait for it.
    state.executor.shutdown(wait=False, cancel_futures=True)


async def _end_watches(app: web.Application) -> None:
    # Watch streams never end by themselves; without this a graceful stop would wait for them.
    for task in list(app[STATE].watch_tasks):
        task.cancel()


async def _metrics(request: web.Request) -> web.Response:
    rendered = request.app[STATE].sampler.rendered
    if rendered is None:
        return web.Response(status=503, text="no sample rendered yet\n", headers={"Retry-After": "1"})
    fmt = choose_format(request.headers.get("Accept", ""))
    openmetrics = fmt == "openmetrics"
    gzip = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    # Written by the render thread when asked for lately, else now, once for this tick.
    request.app[STATE].sampler.asked((fmt, gzip))
    body = rendered.body(fmt, gzip)
    headers = {
        "Content-Type": CONTENT_TYPE_OPENMETRICS if openmetrics else CONTENT_TYPE_TEXT,
        "Vary": "Accept, Accept-Encoding",
    }
    if gzip:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


async def _healthz(request: web.Request) -> web.Response:
    supervisor = request.app[STATE].supervisor
    if not supervisor.tasks:
        return web.Response(status=500, text="sampler not running\n")
    # One restart heals in place; only a sampler that keeps dying asks the kubelet for a new process.
    if supervisor.crashlooping():
        return web.Response(status=500, text="sampler keeps dying\n")
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    sampler = state.sampler
    restarting = state.supervisor.restarting()
    if restarting:
        return web.Response(
            status=503, text=f"not ready: {restarting[0].name} restarted: {restarting[0].error}\n"
        )
    if sampler.ready:
        return web.Response(text="ready\n")
    reason = (
        "device backend down" if sampler.publishes and not sampler.backend_up else "no complete sample yet"
    )
    return web.Response(status=503, text=f"not ready: {reason}\n")


async def _snapshot(request: web.Request) -> web.Response:
    state = request.app[STATE]
    snapshot = state.sampler.snapshot
    if snapshot is None:
        return web.json_response({"error": "no sample yet"}, status=503)
    cached_for, body = state.snapshot_json
    if cached_for is not snapshot:
        body = wire.snapshot_document(snapshot).model_dump_json().encode()
        state.snapshot_json = (snapshot, body)
    return web.Response(body=body, content_type="application/json")


async def _watch(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    sampler = state.sampler
    return await watch_stream(
        request,
        node=state.config.node_name,
        subscribe=sampler.subscribe,
        unsubscribe=sampler.unsubscribe,
        current=lambda: sampler.snapshot,
        wall_clock=state.wall_clock,
        streams=state.watch_tasks,
    )


async def watch_stream(
    request: web.Request,
    *,
    node: str,
    subscribe: Callable[[], Watcher],
    unsubscribe: Callable[[Watcher], None],
    current: Callable[[], Snapshot | None],
    wall_clock: Callable[[], float],
    streams: set[asyncio.Task[Any]],
) -> web.StreamResponse:
    """Answer a ``/api/v1/watch`` request: the state, then every transition the watcher gets,
    heartbeats in between. Also serves the bench's farm of simulated exporters."""
    try:
        heartbeat = float(request.query.get("heartbeat", WATCH_HEARTBEAT_SECONDS))
    except ValueError:
        heartbeat = -1.0
    if not 0.1 <= heartbeat <= 300:
        return web.json_response({"error": "heartbeat must be seconds between 0.1 and 300"}, status=400)
    response = web.StreamResponse(
        headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"}
    )
    await response.prepare(request)
    task = asyncio.current_task()
    assert task is not None
    streams.add(task)
    # Subscribe and take the state in one step (no await between): no transition can fall
    # into a gap between the two.
    watcher = subscribe()
    try:
        await response.write(wire.encode(wire.state_line(current(), node=node, now=wall_clock())))
        while True:
            try:
                async with asyncio.timeout(heartbeat):
                    ev = await watcher.queue.get()
            except TimeoutError:
                await response.write(wire.encode(wire.heartbeat_line(node=node, at=wall_clock())))
                continue
            if ev is None:  # this client fell behind and lost events: resend everything
                line: wire.WatchLine = wire.state_line(current(), node=node, now=wall_clock())
            else:
                line = event_line(ev, node=node)
            await response.write(wire.encode(line))
    except ConnectionResetError:
        return response
    finally:
        unsubscribe(watcher)
        streams.discard(task)
