"""Both signal sources: their pure folding of answers, and the direct source against real
exporters (the exporter app on simulated GPUs, in-process)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cancellation import assert_ends_cancelled
from controller_fakes import load_rules

from gpumon.config import ExporterConfig, SamplingConfig
from gpumon.controller.core.policy import Rule
from gpumon.controller.shell.signal_sources.direct import (
    DirectSettings,
    DirectSource,
    ExporterView,
    GpuHealth,
    StaticEndpoints,
    gpu_from_verdict,
    on_message,
    on_snapshot,
    reading_of,
    verdict_from_json,
)
from gpumon.controller.shell.signal_sources.prometheus import (
    FRESHNESS,
    PODS,
    PrometheusSettings,
    PrometheusSource,
    Sample,
    parse_vector,
    queries_for,
    readings_from_results,
)
from gpumon.devices.model import GpuSample, HealthState, PodGpuUsage, PodRef
from gpumon.devices.simulated import SimulatedBackend, parse_fault
from gpumon.exporter.server import make_app
from gpumon.gpu_health import Op, Scope, Severity, Signal

# --- direct: pure ------------------------------------------------------------------------------


def verdict_doc(
    state: str = "healthy", *reasons: tuple[str, str], xids: tuple[int, ...] = ()
) -> dict[str, Any]:
    return {
        "state": state,
        "reasons": [{"code": c, "detail": d, "state": state} for c, d in reasons],
        "recent_xids": list(xids),
    }


def state_msg(*gpus: dict[str, Any], up: bool = True) -> dict[str, Any]:
    return {"type": "state", "node": "n1", "time": 1.0, "backend_up": up, "gpus": list(gpus)}


def health(doc: dict[str, Any], index: int = 1) -> GpuHealth:
    return GpuHealth(index, verdict_from_json(doc), frozenset(doc["recent_xids"]))


def test_verdict_derived_reading_knows_what_the_verdict_implies():
    ecc = ("EccUncorrectable", "3 uncorrectable ECC errors (volatile)")
    g = gpu_from_verdict(
        "GPU-1", health(verdict_doc("unhealthy", ("XidFatal", "Xid 79"), ecc, xids=(79,))), 5.0
    )
    assert g.recent_xids == {79} and g.ecc_uncorrectable == 3 and not g.lost and not g.row_remap_failure
    assert g.temperature_celsius is None and g.health.state is HealthState.UNHEALTHY and g.index == 1
    hot = gpu_from_verdict("GPU-1", health(verdict_doc("degraded", ("Thermal", "temperature 91 C"))), 5.0)
    assert hot.temperature_celsius == 91.0 and hot.ecc_uncorrectable == 0 and hot.recent_xids == frozenset()
    lost = gpu_from_verdict("GPU-1", health(verdict_doc("lost", ("GpuLost", "x"))), 5.0)
    assert lost.lost
    remap = gpu_from_verdict(
        "GPU-1",
        health(verdict_doc("unhealthy", ("RowRemapFailure", "row remapping failed"), xids=(64,))),
        5.0,
    )
    assert remap.row_remap_failure and remap.recent_xids == {64}


def test_xid_codes_come_from_the_structured_field_not_the_reason_text():
    # An informational code is in recent_xids but in no reason; a reason's text is not parsed.
    doc = verdict_doc("unhealthy", ("XidFatal", "Xid 79"), xids=(13, 79))
    view, _ = on_message(ExporterView("n1"), state_msg({"gpu": 0, "uuid": "G0", **doc}), now=1.0)
    assert reading_of(view).gpus[0].recent_xids == {13, 79}
    view, changed = on_message(
        view, {"type": "health", "gpu": 0, "uuid": "G0", **verdict_doc(xids=(13,))}, now=2.0
    )
    assert changed and reading_of(view).gpus[0].recent_xids == {13}
    # An exporter that does not send the field cannot tell: unknown, not "no Xid".
    silent = {"type": "health", "gpu": 0, "uuid": "G0", "state": "unhealthy", "reasons": []}
    view, _ = on_message(view, silent, now=3.0)
    assert reading_of(view).gpus[0].recent_xids is None


def test_watch_messages_fold_into_a_view():
    view = ExporterView("n1")
    assert reading_of(view) is None  # never heard from
    view, changed = on_message(view, state_msg({"gpu": 0, "uuid": "G0", **verdict_doc()}), now=10.0)
    assert changed
    r = reading_of(view)
    assert r.observed_at == 10.0 and [(g.uuid, g.index, g.observed_at) for g in r.gpus] == [("G0", 0, 10.0)]
    view, changed = on_message(view, {"type": "heartbeat"}, now=20.0)
    assert (
        not changed and reading_of(view).observed_at == 20.0 and reading_of(view).gpus[0].observed_at == 20.0
    )
    view, changed = on_message(
        view,
        {
            "type": "health",
            "gpu": 0,
            "uuid": "G0",
            **verdict_doc("unhealthy", ("XidFatal", "Xid 79"), xids=(79,)),
        },
        now=21.0,
    )
    assert changed and view.troubled and reading_of(view).gpus[0].recent_xids == {79}
    view, changed = on_message(view, {"type": "backend", "up": False}, now=22.0)
    assert changed and reading_of(view) is None  # a node whose NVML is down tells nothing
    view, _ = on_message(view, state_msg({"gpu": 0, "uuid": "G0", **verdict_doc()}), now=23.0)
    assert reading_of(view) is not None and not view.troubled
    # The same state again is no change.
    assert not on_message(view, state_msg({"gpu": 0, "uuid": "G0", **verdict_doc()}), now=24.0)[1]
    assert not on_message(view, {"type": "mystery"}, now=25.0)[1]


def snapshot_doc(
    *, temp: float = 50.0, xids: tuple[int, ...] = (), pods=(), sampled: float = 30.0
) -> dict[str, Any]:
    return {
        "node": "n1",
        "taken_at": 30.0,
        "backend_up": True,
        "gpus": [
            {
                "identity": {"index": 0, "uuid": "G0"},
                "fast": {"temperature_gpu_celsius": temp, "memory_utilization_ratio": 0.5},
                "slow": {"ecc_uncorrected": 0, "row_remap_failure": False},
                "health": verdict_doc(),
                "sampled_at": sampled,
                "xid_counts": {str(x): 1 for x in xids},
                "recent_xids": list(xids),
                "lost": False,
            }
        ],
        "pods": [
            {
                "ref": {"namespace": "ml", "pod": p, "container": "c", "uid": ""},
                "gpu_index": 0,
                "gpu_uuid": "G0",
            }
            for p in pods
        ],
    }


def test_snapshot_gives_raw_fields_pods_and_recent_xids():
    view, _ = on_message(ExporterView("n1"), state_msg({"gpu": 0, "uuid": "G0", **verdict_doc()}), now=10.0)
    view = on_snapshot(view, snapshot_doc(xids=(13,), pods=["a"]), now=31.0)
    r = reading_of(view)
    g = r.gpus[0]
    assert (g.temperature_celsius, g.memory_utilization_ratio, g.ecc_uncorrectable, g.row_remap_failure) == (
        50.0,
        0.5,
        0,
        False,
    )
    assert g.observed_at == 30.0  # the exporter's sample time, not the fetch
    assert g.recent_xids == {13}
    assert r.pods_attributed and g.pods == (PodRef("ml", "a", "c", ""),)
    view = on_snapshot(view, snapshot_doc(xids=(13, 31)), now=40.0)
    assert reading_of(view).gpus[0].recent_xids == {13, 31}
    view = on_snapshot(view, snapshot_doc(), now=700.0)
    assert reading_of(view).gpus[0].recent_xids == frozenset()  # aged out of the exporter's window
    # A transition newer than the snapshot wins until the next snapshot.
    view, _ = on_message(
        view, {"type": "health", "gpu": 0, "uuid": "G0", **verdict_doc("lost", ("GpuLost", "x"))}, now=701.0
    )
    assert reading_of(view).gpus[0].lost and not reading_of(view).pods_attributed


# --- prometheus: pure --------------------------------------------------------------------------


def s(value: float, **labels: str) -> Sample:
    return Sample(labels, value)


def test_queries_cover_the_signals_rules_use_plus_freshness_and_pods():
    q = queries_for(load_rules(), 600)
    assert set(q) == {
        FRESHNESS,
        PODS,
        "xid",
        "gpu_lost",
        "ecc_uncorrectable",
        "row_remap_failure",
        "temperature",
    }
    assert "offset 600s" in q["xid"] and "increase(gpumon_gpu_xid_errors_total[600s])" in q["xid"]
    custom = Rule("nv", Signal.PROMQL, Severity.UNHEALTHY, query="sum by (node) (x)", scope=Scope.NODE)
    health = Rule("h", Signal.EXPORTER_HEALTH, Severity.UNHEALTHY)
    q = queries_for((custom, health), 600)
    assert q["rule:nv"] == "sum by (node) (x)" and "__health_info" in q and "exporter_health" in q


def test_results_fold_into_readings_per_node():
    rules = (
        *load_rules(),
        Rule("h", Signal.EXPORTER_HEALTH, Severity.UNHEALTHY),
        Rule("nv", Signal.PROMQL, Severity.UNHEALTHY, Op.GT, 0, query="x", scope=Scope.NODE),
        Rule("g", Signal.PROMQL, Severity.DEGRADED, Op.GT, 0, query="y"),
    )
    results = {
        FRESHNESS: [
            s(95.0, node="a", gpu="0", uuid="A0"),
            s(96.0, node="a", gpu="1", uuid="A1"),
            s(200.0, node="b", gpu="0", uuid="B0"),
        ],
        "temperature": [s(70.0, node="a", gpu="0", uuid="A0")],
        "ecc_uncorrectable": [s(2, node="a", gpu="1", uuid="A1")],
        "gpu_lost": [s(0, node="a", gpu="0", uuid="A0"), s(1, node="a", gpu="1", uuid="A1")],
        "xid": [s(1, node="a", gpu="1", uuid="A1", xid="79"), s(1, node="zz", gpu="0", uuid="Z", xid="79")],
        "exporter_health": [s(1, node="a", gpu="1", uuid="A1", state="lost")],
        "__health_info": [s(1, node="a", gpu="1", uuid="A1", reason="GpuLost", detail="gone")],
        PODS: [s(1, node="a", gpu="1", uuid="A1", namespace="ml", pod="p", container="c")],
        "rule:nv": [s(3, node="b")],
        "rule:g": [s(1, node="a", gpu="0")],  # no uuid label: matched by index
    }
    nodes = readings_from_results(results, rules, now=100.0)
    assert set(nodes) == {"a", "b"}
    a = nodes["a"]
    assert a.observed_at == 96.0 and a.pods_attributed
    g0, g1 = a.gpus
    assert (g0.temperature_celsius, g0.lost, g0.ecc_uncorrectable, g0.recent_xids) == (
        70.0,
        False,
        None,
        frozenset(),
    )
    assert g0.custom == {"g": 1.0}
    assert (g1.lost, g1.ecc_uncorrectable, g1.recent_xids, g1.temperature_celsius) == (True, 2, {79}, None)
    assert g1.health.state is HealthState.LOST and g1.health.reasons[0].code == "GpuLost"
    assert g1.pods == (PodRef("ml", "p", "c"),)
    b = nodes["b"]
    assert b.observed_at == 100.0  # a timestamp from the future is clamped to now
    assert b.custom == {"nv": 3.0} and not b.pods_attributed


def test_parse_vector_accepts_vectors_only():
    ok = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"a": "1"}, "value": [1, "2.5"]}, {"metric": {}, "value": [1, "NaN?"]}],
        },
    }
    assert parse_vector(ok) == [Sample({"a": "1"}, 2.5)]
    with pytest.raises(ValueError, match="bad_data"):
        parse_vector({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(ValueError, match="matrix"):
        parse_vector({"status": "success", "data": {"resultType": "matrix", "result": []}})


async def test_prometheus_source_rounds_retries_and_outages():
    """Against an HTTP server answering like Prometheus' query API (parsing is covered above;
    here: retries, the all-or-nothing round, and readings kept through an outage)."""
    answers: dict[str, Any] = {}
    failures = {"left": 0}

    async def query(request: web.Request) -> web.Response:
        if failures["left"]:
            failures["left"] -= 1
            return web.Response(status=503, text="overloaded")
        q = request.query["query"]
        result = answers.get(q, [])
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    server = TestServer(app)
    await server.start_server()
    rules = load_rules(
        builtin=False, inline=[{"name": "lost", "signal": "gpu_lost", "severity": "unhealthy"}]
    )
    q = queries_for(rules, 600)
    answers[q[FRESHNESS]] = [{"metric": {"node": "a", "gpu": "0", "uuid": "A0"}, "value": [100, "99"]}]
    answers[q["gpu_lost"]] = [{"metric": {"node": "a", "gpu": "0", "uuid": "A0"}, "value": [100, "1"]}]
    async with aiohttp.ClientSession() as session:
        src = PrometheusSource(
            PrometheusSettings(str(server.make_url("/")), retries=2, timeout_seconds=5),
            rules,
            session,
            wall_clock=lambda: 100.0,
        )
        failures["left"] = 2  # two failed attempts, then the retry succeeds
        assert set(await src.poll_once()) == {"a"}
        fleet = src.current()
        assert fleet.source_up and fleet.nodes["a"].gpus[0].lost
        assert list(await src.poll_once()) == []  # nothing changed
        failures["left"] = 100
        assert list(await src.poll_once()) == []
        assert not src.current().source_up and "a" in src.current().nodes  # kept, will age
    await server.close()


# --- direct: against real exporters ------------------------------------------------------------


class Pods:
    """Stands in for the kubelet's view of which pod holds which GPU."""

    def __init__(self, placement: dict[int, str]) -> None:
        self.placement = placement

    async def refresh(self) -> None:
        return None

    def attribute(self, gpus: Any) -> tuple[PodGpuUsage, ...]:
        by_index: dict[int, GpuSample] = {g.identity.index: g for g in gpus}
        return tuple(
            PodGpuUsage(
                PodRef("ml", pod, "main"),
                i,
                by_index[i].identity.uuid,
                allocated_resources=("nvidia.com/gpu",),
            )
            for i, pod in self.placement.items()
            if i in by_index
        )


@pytest.fixture
async def exporters() -> AsyncIterator[Callable[..., Awaitable[tuple[str, SimulatedBackend, TestServer]]]]:
    servers: list[TestServer] = []

    async def start(node: str, *, placement: dict[int, str] | None = None, gpus: int = 4):
        backend = SimulatedBackend(gpus, seed=len(servers))
        cfg = ExporterConfig(
            node_name=node,
            backend="simulated",
            sampling=SamplingConfig(
                fast_interval_seconds=0.1, slow_interval_seconds=0.2, call_timeout_seconds=5
            ),
        )
        server = TestServer(make_app(cfg, backend, attributor=Pods(placement or {})))
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/"), backend, server

    yield start
    for server in servers:
        await server.close()


async def wait_for(predicate: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():  # noqa: ASYNC110 - polling a real process with a deadline
            await asyncio.sleep(0.02)


async def test_direct_source_streams_transitions_and_fetches_detail_for_troubled_nodes(exporters):
    url1, backend1, _ = await exporters("n1", placement={0: "a", 1: "b", 2: "c"})
    url2, _, _ = await exporters("n2")
    changes: list[str] = []
    async with aiohttp.ClientSession() as session:
        src = DirectSource(
            DirectSettings(heartbeat_seconds=0.2, poll_interval_seconds=0.2),
            StaticEndpoints({"n1": url1, "n2": url2}),
            session,
        )
        task = asyncio.create_task(src.run(changes.extend))
        try:

            def healthy(node: str) -> bool:
                r = src.current().nodes.get(node)
                return r is not None and len(r.gpus) == 4

            await wait_for(lambda: healthy("n1") and healthy("n2"), "both exporters heard")
            assert src.connected == 2
            r = src.current().nodes["n2"]
            assert all(
                g.health.state is HealthState.HEALTHY and g.temperature_celsius is None for g in r.gpus
            )
            backend1.inject(parse_fault({"gpu": 1, "fault": "xid", "code": 79}))

            def detail() -> bool:
                r = src.current().nodes.get("n1")
                return r is not None and r.pods_attributed and 79 in r.gpus[1].recent_xids

            await wait_for(detail, "the Xid, with pod placement")
            r = src.current().nodes["n1"]
            assert r.gpus[1].pods == (PodRef("ml", "b", "main"),)
            assert r.gpus[1].temperature_celsius is not None  # raw fields from the snapshot
            assert "n1" in changes
            # Heartbeats keep a quiet node fresh.
            before = src.current().nodes["n2"].observed_at
            await wait_for(lambda: src.current().nodes["n2"].observed_at > before, "a heartbeat")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_direct_source_sees_an_exporter_go_dark_and_come_back(exporters):
    url, backend, _ = await exporters("n1")
    async with aiohttp.ClientSession() as session:
        src = DirectSource(
            DirectSettings(heartbeat_seconds=0.2, poll_interval_seconds=0.2),
            StaticEndpoints({"n1": url}),
            session,
        )
        task = asyncio.create_task(src.run(lambda nodes: None))
        try:
            await wait_for(lambda: "n1" in src.current().nodes, "exporter heard")
            backend.inject(parse_fault({"fault": "unavailable"}))
            await wait_for(lambda: "n1" not in src.current().nodes, "backend down means no reading")
            backend.clear_all()
            await wait_for(lambda: "n1" in src.current().nodes, "back")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_direct_source_polls_exporters_without_a_watch_endpoint(exporters):
    _, _, server = await exporters("n1")
    # An older exporter: only /api/v1/snapshot.
    snap_app = web.Application()

    async def snapshot(request: web.Request) -> web.StreamResponse:
        async with aiohttp.ClientSession() as s, s.get(server.make_url("/api/v1/snapshot")) as r:
            return web.Response(body=await r.read(), content_type="application/json")

    snap_app.router.add_get("/api/v1/snapshot", snapshot)
    old = TestServer(snap_app)
    await old.start_server()
    async with aiohttp.ClientSession() as session:
        src = DirectSource(
            DirectSettings(poll_interval_seconds=0.2),
            StaticEndpoints({"n1": str(old.make_url("")).rstrip("/")}),
            session,
        )
        task = asyncio.create_task(src.run(lambda nodes: None))
        try:
            await wait_for(
                lambda: (
                    "n1" in src.current().nodes
                    and src.current().nodes["n1"].gpus[0].temperature_celsius is not None
                ),
                "polled",
            )
            assert src.connected == 0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await old.close()


async def test_direct_source_stops_when_cancelled_as_its_poller_wakes():
    """A troubled node's first line wakes the snapshot poller; the change callback cancels the
    source in that same loop turn. Python 3.11's asyncio.wait_for handed the poller its wake-up
    and dropped the cancellation, so run() waited for the poller for ever."""

    async def watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        bad = verdict_doc("unhealthy", ("XidFatal", "Xid 79"), xids=(79,))
        await resp.write(json.dumps(state_msg({"gpu": 0, "uuid": "G0", **bad})).encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            while True:  # heartbeats until the client goes
                await asyncio.sleep(0.05)
                await resp.write(b'{"type":"heartbeat"}\n')
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/watch", watch)
    server = TestServer(app)
    await server.start_server()
    tasks: list[asyncio.Task[None]] = []

    def cancel_on_first_change(nodes: Any) -> None:
        if tasks and not tasks[0].cancelling():
            tasks[0].cancel()

    try:
        async with aiohttp.ClientSession() as session:
            src = DirectSource(
                DirectSettings(poll_interval_seconds=30.0),
                StaticEndpoints({"n1": str(server.make_url("")).rstrip("/")}),
                session,
            )
            task = asyncio.create_task(src.run(cancel_on_first_change))
            tasks.append(task)
            await assert_ends_cancelled(task, "the source lost its cancellation and kept polling")
    finally:
        await server.close()


def test_a_troubled_node_without_fresh_detail_says_placement_is_pending():
    view, _ = on_message(ExporterView("n1"), state_msg({"gpu": 0, "uuid": "G0", **verdict_doc()}), now=1.0)
    assert reading_of(view).pods_attributed is False  # healthy: nothing to place
    bad = {"type": "health", "gpu": 0, "uuid": "G0", **verdict_doc("unhealthy", ("XidFatal", "Xid 79"))}
    view, _ = on_message(view, bad, now=2.0)
    assert reading_of(view).pods_attributed is None
    view = on_snapshot(view, snapshot_doc(pods=[]), now=3.0)
    assert reading_of(view).pods_attributed is False  # the exporter attributes nothing here
