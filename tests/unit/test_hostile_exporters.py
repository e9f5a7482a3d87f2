"""Issue #18, the controller's side: what one exporter sends cannot hurt the other nodes.

Each exporter here is a scripted server on a real port; the direct source reads it as it would
a real one. A refusal is counted by kind and per node, withdraws that node's reading at once
(unknown, never unhealthy) and ends the connection; every other node goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from direct_harness import base_url, running_source, wait_for
from prometheus_client import CollectorRegistry

from gpumon.config.controller import ControllerConfig
from gpumon.controller.app import _build_source
from gpumon.controller.configure import build_policy
from gpumon.controller.core.backoff import Backoff
from gpumon.controller.shell.metrics import ControllerMetrics
from gpumon.controller.shell.signal_sources import direct
from gpumon.controller.shell.signal_sources.direct import (
    DirectSettings,
    DirectSource,
    ExporterView,
    LineBudget,
    LogThrottle,
    on_line,
    spend_line,
)
from gpumon.controller.shell.signal_sources.endpoints import StaticEndpoints, _exporter_endpoint
from gpumon.gpu.model import GpuIdentity, GpuSample, HealthState, HealthVerdict, Snapshot
from gpumon.runtime.tasks import cancel_and_wait
from gpumon.wire import v1 as wire

QUICK = Backoff(initial_seconds=0.01, max_seconds=0.01)
# Long enough that a withdrawn node cannot come back before the test has looked.
SLOW = Backoff(initial_seconds=30.0, max_seconds=30.0)


def status(uuid: str, gpu: int = 0) -> wire.GpuStatus:
    return wire.GpuStatus(
        gpu=gpu, uuid=uuid, health=wire.Verdict(state=HealthState.HEALTHY), temperature_celsius=50.0
    )


def state(node: str) -> bytes:
    line = wire.StateLine(schema_version=1, node=node, time=1.0, backend_up=True, gpus=(status("G0"),))
    return wire.encode(line)


def health(node: str, uuid: str) -> wire.HealthLine:
    return wire.HealthLine(
        schema_version=1, node=node, time=1.0, previous=HealthState.HEALTHY, gpu=status(uuid)
    )


def heartbeat(node: str) -> bytes:
    return wire.encode(wire.heartbeat_line(node=node, at=1.0))


Script = Callable[[web.StreamResponse, int], Awaitable[None]]


@contextlib.asynccontextmanager
async def exporter(
    script: Script, *, snapshot: bytes | None = None, queries: list[dict[str, str]] | None = None
) -> AsyncIterator[tuple[str, list[int]]]:
    """A watch endpoint running ``script(response, connection number)``, then heartbeats until
    the client goes (or only a snapshot endpoint, with ``snapshot``); yields its URL and the
    connections (or snapshot requests) served. Each watch request's query goes to ``queries``."""
    served: list[int] = []

    async def watch(request: web.Request) -> web.StreamResponse:
        if queries is not None:
            queries.append(dict(request.query))
        resp = web.StreamResponse()
        await resp.prepare(request)
        served.append(len(served))
        with contextlib.suppress(ConnectionError):
            await script(resp, served[-1])
            while True:
                await asyncio.sleep(0.05)
                await resp.write(heartbeat("n"))
        return resp

    async def snap(request: web.Request) -> web.Response:
        served.append(len(served))
        assert snapshot is not None
        return web.Response(body=snapshot, content_type="application/json")

    app = web.Application()
    if snapshot is None:
        app.router.add_get("/api/v1/watch", watch)
    else:
        app.router.add_get("/api/v1/snapshot", snap)
    server = TestServer(app)
    await server.start_server()
    try:
        yield base_url(server), served
    finally:
        await server.close()


def good(node: str) -> Script:
    async def script(resp: web.StreamResponse, n: int) -> None:
        await resp.write(state(node))

    return script


# --- reproductions -----------------------------------------------------------------------------


def _snapshot(node: str) -> bytes:
    sample = GpuSample(GpuIdentity(0, "G0", "m", "b"), None, None, HealthVerdict(HealthState.HEALTHY), 1.0)
    return wire.encode(wire.snapshot_document(Snapshot(node, None, (sample,), (), 1.0, True, True)))


async def test_a_malformed_snapshot_is_refused_and_every_other_node_is_still_polled():
    """#18: `{"gpus":[{"identity":{"index":"abc"}}]}` once killed the snapshot poller for all."""
    bad_doc = b'{"gpus":[{"identity":{"index":"abc"}}]}'
    refused: list[tuple[str, str]] = []
    settings = DirectSettings(poll_interval_seconds=0.05)
    async with (
        exporter(good("n1"), snapshot=bad_doc) as (bad, _),
        exporter(good("n2"), snapshot=_snapshot("n2")) as (ok, ok_served),
        running_source(
            {"bad": bad, "ok": ok}, settings, on_refusal=lambda n, k: refused.append((n, k))
        ) as src,
    ):
        await wait_for(lambda: len(ok_served) >= 5 and src.errors["schema"] >= 3, "polls after refusals")
        assert "ok" in src.current().nodes and "bad" not in src.current().nodes
        assert {n for n, _ in refused} == {"bad"}


async def test_a_line_that_is_no_object_or_overflows_is_refused_and_the_watch_comes_back():
    """#18: `[]` or `gpu: 1e999` once ended that node's watch for good, uncounted."""
    overflow = json.loads(wire.encode(health("n1", "G0")))
    overflow["gpu"]["gpu"] = "1e999"
    lines = [b"[]\n", b'"text"\n', b"17\n", json.dumps(overflow).replace('"1e999"', "1e999").encode() + b"\n"]

    async def script(resp: web.StreamResponse, n: int) -> None:
        await resp.write(lines[n] if n < len(lines) else state("n1"))

    async with (
        exporter(script) as (url, served),
        running_source({"n1": url}, DirectSettings(), backoff=QUICK) as src,
    ):
        await wait_for(lambda: "n1" in src.current().nodes, "the good state line after the bad ones")
        assert sum(src.errors.values()) == len(lines) and "internal" not in src.errors
        assert len(served) == len(lines) + 1


def test_health_lines_with_new_uuids_stop_at_the_gpu_limit():
    """#18: a stream of `health` lines with new UUIDs grew one node to 18,001 GPUs."""
    view = ExporterView("n1")
    for i in range(wire.MAX_GPUS):
        view, _ = on_line(view, health("n1", f"G{i}"), 1.0)
    assert len(view.gpus) == wire.MAX_GPUS
    # A GPU it has may still change...
    view, _ = on_line(view, health("n1", "G0"), 2.0)
    # ...one more may not.
    with pytest.raises(wire.WireError) as refused:
        on_line(view, health("n1", "one too many"), 2.0)
    assert refused.value.kind == "oversize"


async def test_new_uuids_over_the_limit_end_the_connection_and_withdraw_the_node():
    async def script(resp: web.StreamResponse, n: int) -> None:
        await resp.write(state("n1"))
        if n == 0:
            for i in range(wire.MAX_GPUS + 10):
                await resp.write(wire.encode(health("n1", f"new-{i}")))

    async with (
        exporter(script) as (url, _),
        running_source({"n1": url}, DirectSettings(), backoff=SLOW) as src,
    ):
        await wait_for(lambda: src.errors["oversize"] == 1, "the refusal")
        assert "n1" not in src.current().nodes


# --- a violation: per node, at once, the others unaffected --------------------------------------


async def test_a_refusal_withdraws_only_that_node_at_once():
    go = asyncio.Event()

    async def hostile(resp: web.StreamResponse, n: int) -> None:
        await resp.write(state("n1"))
        await go.wait()
        await resp.write(b"not json\n")

    refused: list[tuple[str, str]] = []
    changes: list[str] = []
    async with (
        exporter(hostile) as (bad, _),
        exporter(good("n2")) as (ok, _),
        running_source(
            {"n1": bad, "n2": ok},
            DirectSettings(heartbeat_seconds=0.2),
            backoff=SLOW,
            on_change=changes.extend,
            on_refusal=lambda n, k: refused.append((n, k)),
        ) as src,
    ):
        await wait_for(lambda: {"n1", "n2"} <= set(src.current().nodes), "both nodes")
        changes.clear()
        go.set()
        # Withdrawn at once, not when the reconnect (30 s away) brings a state line.
        await wait_for(lambda: "n1" not in src.current().nodes, "the hostile node withdrawn")
        assert refused == [("n1", "invalid")] and "n1" in changes
        before = src.current().nodes["n2"].observed_at
        await wait_for(lambda: src.current().nodes["n2"].observed_at > before, "the other node heard on")


async def test_a_flooding_exporter_is_dropped_counted_and_logged_once(caplog: pytest.LogCaptureFixture):
    async def flood(resp: web.StreamResponse, n: int) -> None:
        await resp.write(state("n1"))
        beat = heartbeat("n1") * 100
        while True:
            await resp.write(beat)

    refused: list[tuple[str, str]] = []
    settings = DirectSettings(heartbeat_seconds=0.2, lines_per_second=50, line_burst=100)
    caplog.set_level(logging.WARNING, logger=direct.__name__)
    async with (
        exporter(flood) as (bad, _),
        exporter(good("n2")) as (ok, _),
        running_source(
            {"n1": bad, "n2": ok}, settings, backoff=QUICK, on_refusal=lambda n, k: refused.append((n, k))
        ) as src,
    ):
        await wait_for(lambda: src.errors["flood"] >= 3, "three floods dropped")
        assert set(refused) == {("n1", "flood")}
        assert "n2" in src.current().nodes
    floods = [
        r for r in caplog.records if getattr(r, "node", None) == "n1" and getattr(r, "kind", "") == "flood"
    ]
    assert len(floods) == 1 and floods[0].suppressed == 0  # type: ignore[attr-defined]


def test_a_node_is_logged_once_per_interval_with_what_was_left_out():
    throttle = LogThrottle(60.0)
    assert throttle.allow("n1", 0.0) == 0
    assert [throttle.allow("n1", t) for t in (1.0, 2.0, 59.0)] == [None, None, None]
    assert throttle.allow("n2", 3.0) == 0  # another node has its own interval
    assert throttle.allow("n1", 60.0) == 3
    assert throttle.allow("n1", 61.0) is None


def test_a_line_budget_allows_a_burst_then_the_rate():
    budget: Any = LineBudget(3.0, 0.0)
    for _ in range(3):
        budget = spend_line(budget, 0.0, rate=10.0, burst=3.0)
        assert budget is not None
    assert spend_line(budget, 0.0, rate=10.0, burst=3.0) is None
    # 0.1 s buys one line back; a long quiet spell never more than the burst.
    assert spend_line(budget, 0.1, rate=10.0, burst=3.0) is not None
    assert spend_line(budget, 100.0, rate=10.0, burst=3.0) == LineBudget(2.0, 100.0)


# --- a bad exporter cannot get another node quarantined -----------------------------------------


async def test_an_exporter_naming_another_node_speaks_only_for_its_own():
    """Readings are keyed by the endpoint the controller found (the exporter pod's
    spec.nodeName), never by the `node` an exporter writes in its lines."""
    fatal = wire.GpuStatus(
        gpu=0,
        uuid="G0",
        health=wire.Verdict(
            state=HealthState.UNHEALTHY,
            reasons=(wire.Reason(code="XidFatal", detail="Xid 79", state=HealthState.UNHEALTHY),),
        ),
    )
    liar = wire.StateLine(schema_version=1, node="n2", time=1.0, backend_up=True, gpus=(fatal,))

    async def lies(resp: web.StreamResponse, n: int) -> None:
        await resp.write(wire.encode(liar))

    async with (
        exporter(lies) as (bad, _),
        exporter(good("n2")) as (ok, _),
        running_source({"n1": bad, "n2": ok}, DirectSettings(heartbeat_seconds=0.2)) as src,
    ):
        await wait_for(lambda: {"n1", "n2"} <= set(src.current().nodes), "both nodes")
        nodes = src.current().nodes
        assert nodes["n2"].gpus[0].health.state is HealthState.HEALTHY
        assert nodes["n1"].gpus[0].health.state is HealthState.UNHEALTHY


def test_discovered_exporters_are_keyed_by_their_pods_node():
    convert = _exporter_endpoint(9400, "http")
    pod = {
        "metadata": {"name": "gpumon-exporter-n2", "labels": {"node": "n2"}},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running", "podIP": "10.0.0.7"},
    }
    assert convert(pod) == ("n1", "http://10.0.0.7:9400")
    assert convert({**pod, "spec": {}}) is None  # not placed yet: speaks for no node


async def test_a_restarted_source_subscribes_again_without_an_endpoint_change():
    """The supervisor calls run() again after a death: it must not wait for the endpoints to
    change before watching the exporters it already knows."""
    async with exporter(good("n1")) as (url, served), aiohttp.ClientSession() as session:
        src = DirectSource(DirectSettings(heartbeat_seconds=0.2), StaticEndpoints({"n1": url}), session)
        first = asyncio.create_task(src.run(lambda nodes: None))
        await wait_for(lambda: len(served) == 1 and "n1" in src.current().nodes, "the first subscription")
        await cancel_and_wait([first])
        second = asyncio.create_task(src.run(lambda nodes: None))
        try:
            await wait_for(lambda: len(served) == 2, "a second subscription")
        finally:
            await cancel_and_wait([second])


async def test_a_failure_of_our_own_on_one_node_is_logged_and_that_watch_starts_over(
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.ERROR, logger=direct.__name__)
    calls: list[str] = []

    def on_change(nodes: Any) -> None:
        calls.extend(nodes)
        if len(calls) == 1:
            raise RuntimeError("a bug downstream")

    async with (
        exporter(good("n1")) as (url, served),
        running_source(
            {"n1": url}, DirectSettings(heartbeat_seconds=0.2), backoff=QUICK, on_change=on_change
        ) as src,
    ):
        await wait_for(lambda: len(served) == 2 and "n1" in src.current().nodes, "the watch started over")
        assert src.errors["internal"] == 1
    crashed = [r for r in caplog.records if getattr(r, "node", None) == "n1" and r.exc_info]
    assert len(crashed) == 1 and "a bug downstream" in str(crashed[0].exc_info[1])  # type: ignore[index]


class MovingEndpoints:
    """Endpoints the test changes, as the exporter-pods informer would when a node goes."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.changed = asyncio.Event()
        self.changed.set()

    def current(self) -> dict[str, str]:
        return dict(self.urls)


async def test_a_refused_nodes_series_are_deleted_when_its_exporter_leaves():
    # Issue #18: per-node refusal series were never deleted, so every hostile node that ever
    # left the cluster kept its series in the controller's /metrics for good.
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)

    def count(node: str, kind: str) -> float | None:
        return registry.get_sample_value(
            "gpumon_controller_exporter_refusals_total", {"node": node, "kind": kind}
        )

    async with (
        exporter(lambda resp, n: resp.write(b"[]\n")) as (bad, _),
        exporter(good("n2")) as (ok, _),
        aiohttp.ClientSession() as session,
    ):
        endpoints = MovingEndpoints({"n1": bad, "n2": ok})
        src = DirectSource(
            DirectSettings(heartbeat_seconds=0.2),
            endpoints,
            session,
            backoff=QUICK,
            on_refusal=lambda node, kind: metrics.exporter_refusals.labels(node, kind).inc(),
            on_refusals_forgotten=metrics.forget_refusals,
        )
        task = asyncio.create_task(src.run(lambda nodes: None))
        try:
            await wait_for(lambda: (count("n1", "invalid") or 0) >= 2, "n1 refused")
            await wait_for(lambda: "n2" in src.current().nodes, "n2 read")
            endpoints.urls = {"n2": ok}  # n1's exporter pod is gone (its node left)
            endpoints.changed.set()
            await wait_for(lambda: count("n1", "invalid") is None, "n1's series deleted")
            assert "n1" not in src.current().nodes and "n2" in src.current().nodes
        finally:
            await cancel_and_wait([task])


@contextlib.asynccontextmanager
async def configured_source(
    session: aiohttp.ClientSession, url: str, signals: dict[str, Any]
) -> AsyncIterator[DirectSource]:
    """The direct source as the controller builds it from ``signals`` (its config section),
    reading one exporter, ``n1`` at ``url``."""
    direct_config = {**signals.get("direct", {}), "endpoints": {"n1": url}}
    config = ControllerConfig.model_validate(
        {"signals": {**signals, "source": "direct", "direct": direct_config}}
    )
    metrics = ControllerMetrics(CollectorRegistry())
    endpoints = StaticEndpoints(config.signals.direct.endpoints)
    src = _build_source(config, build_policy(config), endpoints, session, metrics, time.time, None)
    assert isinstance(src, DirectSource)
    task = asyncio.create_task(src.run(lambda nodes: None))
    try:
        yield src
    finally:
        await cancel_and_wait([task])


@pytest.mark.parametrize(
    ("signals", "asked"),
    [
        ({}, "20"),  # a third of the default 60 s staleness
        ({"stale_after_seconds": 30}, "10"),
        ({"direct": {"heartbeat_seconds": 4}}, "4"),
    ],
)
async def test_the_heartbeat_asked_for_follows_the_staleness(signals: dict[str, Any], asked: str):
    queries: list[dict[str, str]] = []
    async with (
        exporter(good("n1"), queries=queries) as (url, _),
        aiohttp.ClientSession() as session,
        configured_source(session, url, signals) as src,
    ):
        await wait_for(lambda: "n1" in src.current().nodes, "n1 read")
    assert [q["heartbeat"] for q in queries] == [asked]


@pytest.mark.parametrize("stale_after", [30.0, 60.0, 600.0])
def test_by_default_a_silent_stream_is_opened_again_before_its_node_goes_stale(stale_after: float):
    signals = ControllerConfig.model_validate({"signals": {"stale_after_seconds": stale_after}}).signals
    settings = DirectSettings(heartbeat_seconds=signals.heartbeat_seconds)
    # Ended at most a sweep after its read timeout; then reconnected and read at once.
    assert settings.read_timeout + settings.sweep_seconds < stale_after


@pytest.mark.parametrize(("burst", "floods"), [(None, False), (100, True)])
async def test_the_flood_limits_come_from_the_controller_config(burst: int | None, floods: bool):
    # 150 lines at once: within the default burst (2,000), a flood under a configured 100.
    async def eager(resp: web.StreamResponse, n: int) -> None:
        await resp.write(state("n1") + heartbeat("n1") * 149)

    limits = {} if burst is None else {"line_burst": burst, "lines_per_second": 1}
    async with (
        exporter(eager) as (url, _),
        aiohttp.ClientSession() as session,
        configured_source(session, url, {"direct": limits}) as src,
    ):
        if floods:
            await wait_for(lambda: src.errors["flood"] >= 1, "a flood under the configured burst")
        else:
            await wait_for(lambda: "n1" in src.current().nodes, "n1 read")
            first = src.current().nodes["n1"].observed_at
            # A heartbeat after the 150 lines: all of them were read, none was a flood.
            await wait_for(lambda: src.current().nodes["n1"].observed_at > first, "a later heartbeat")
            assert src.errors["flood"] == 0


async def test_a_stream_gone_silent_is_ended_and_opened_again_and_a_talking_one_is_not():
    async def silent_after_state(resp: web.StreamResponse, n: int) -> None:
        await resp.write(state("n1"))
        if n == 0:
            await asyncio.Event().wait()  # the connection stays open; nothing more comes

    settings = DirectSettings(heartbeat_seconds=0.1, read_timeout_seconds=0.5)
    async with (
        exporter(silent_after_state) as (silent, silent_served),
        exporter(good("n2")) as (talking, talking_served),
        running_source({"n1": silent, "n2": talking}, settings, backoff=QUICK) as src,
    ):
        await wait_for(lambda: len(silent_served) >= 2, "the silent stream opened again")
        assert src.errors["connection"] >= 1
        assert talking_served == [0]  # heartbeats every 0.05 s: never taken for silence


async def test_a_watch_whose_set_up_never_answers_gives_its_place_back():
    async def never_answers(request: web.Request) -> web.StreamResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_get("/api/v1/watch", never_answers)
    server = TestServer(app)
    await server.start_server()
    # One watch set up at a time: n2 is opened only once n1's set-up has timed out.
    settings = DirectSettings(heartbeat_seconds=0.1, read_timeout_seconds=0.5, max_connecting=1)
    try:
        async with (
            exporter(good("n2")) as (talking, _),
            running_source({"n1": base_url(server), "n2": talking}, settings, backoff=SLOW) as src,
        ):
            await wait_for(lambda: "n2" in src.current().nodes, "n2 heard")
            assert src.errors["connection"] >= 1
    finally:
        await server.close()


class Cut:
    """Stands in for a stream's entered ``asyncio.timeout``: records when it was set to fire."""

    when: float | None = None

    def reschedule(self, when: float | None) -> None:
        self.when = when


async def test_a_sweep_copies_out_only_the_silent_streams():
    # A copy of every stream's entry each sweep lived long enough to count toward the garbage
    # collector's full collections, which then walked everything the streams hold (0.014
    # cores at 10,000 streams): the sweep allocates for the silent ones alone.
    now = 1000.0
    src = DirectSource(
        DirectSettings(heartbeat_seconds=20.0), StaticEndpoints({}), None, monotonic=lambda: now
    )  # type: ignore[arg-type]
    cuts = {f"n{i}": Cut() for i in range(10_000)}
    src._silence.update(cuts)  # type: ignore[arg-type]
    src._read_at.update(dict.fromkeys(cuts, now))
    src._read_at["n7"] = now - 60.0  # past the 45 s read timeout
    tracemalloc.start()
    try:
        src._sweep()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert set(cuts) - set(src._silence) == {"n7"}
    assert [n for n, c in cuts.items() if c.when is not None] == ["n7"]  # its read is cut at once
    assert peak < 16_384, f"a sweep of 10,000 streams allocated {peak} bytes at its peak"
