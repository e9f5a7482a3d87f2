"""The exporter's HTTP app on real simulated GPUs: negotiation, gzip, auth, probes, watch, and
the simulator's fault routes wired in as ``gpumon exporter --backend simulated`` wires them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientPayloadError, ClientResponse
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from gpumon.config import AuthConfig, ConfigError, ExporterConfig, SamplingConfig
from gpumon.devices.nvml import NvmlBackend
from gpumon.devices.simulated import SimulatedBackend, parse_fault
from gpumon.devices.simulated_http import fault_routes
from gpumon.exporter.command import build_backend
from gpumon.exporter.self_metrics import SelfMetrics
from gpumon.exporter.server import STATE, accepts_gzip, choose_format, make_app
from gpumon.gpu.model import HealthState, XidEvent
from gpumon.wire import v1 as wire

Client = TestClient[Any, Any]
MakeClient = Callable[..., Awaitable[Client]]

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


def config(*, call_timeout: float = 5.0, **kw: Any) -> ExporterConfig:
    return ExporterConfig(
        node_name="node-1",
        backend="simulated",
        sampling=SamplingConfig(
            fast_interval_seconds=0.1, slow_interval_seconds=0.5, call_timeout_seconds=call_timeout
        ),
        **kw,
    )


@pytest.fixture
def backend() -> SimulatedBackend:
    return SimulatedBackend(4, seed=5)


async def until(condition: Callable[[], Awaitable[bool]]) -> None:
    """Wait for the app's background sampler, polling with a generous deadline."""
    async with asyncio.timeout(30):
        while not await condition():  # noqa: ASYNC110 - the sampler runs on its own cadence
            await asyncio.sleep(0.02)


async def ready(client: Client) -> None:
    async def check() -> bool:
        return (await client.get("/readyz")).status == 200

    await until(check)


async def started(aiohttp_client: MakeClient, backend: SimulatedBackend, **kw: Any) -> Client:
    app = make_app(config(**kw), backend, routes=fault_routes(backend))
    client = await aiohttp_client(app, auto_decompress=False)
    await ready(client)
    return client


# -- negotiation (pure) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("", "text"),
        ("*/*", "text"),
        ("text/plain", "text"),
        ("application/openmetrics-text", "openmetrics"),
        ("application/openmetrics-text; version=1.0.0; charset=utf-8", "openmetrics"),
        (PROMETHEUS_ACCEPT, "openmetrics"),
        ("text/plain;q=0.9, application/openmetrics-text;q=0.5", "text"),
        ("application/openmetrics-text;q=0, text/plain", "text"),
        ("application/json", "text"),
    ],
)
def test_choose_format(accept: str, expected: str) -> None:
    assert choose_format(accept) == expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("", False),
        ("gzip", True),
        ("deflate, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("br", False),
        ("*", True),
    ],
)
def test_accepts_gzip(header: str, expected: bool) -> None:
    assert accepts_gzip(header) is expected


# -- /metrics -----------------------------------------------------------------------------------


async def test_metrics_text_by_default(aiohttp_client: MakeClient, backend: SimulatedBackend) -> None:
    client = await started(aiohttp_client, backend)
    resp = await client.get("/metrics", headers={"Accept": "*/*", "Accept-Encoding": "identity"})
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in resp.headers
    assert "Accept" in resp.headers["Vary"] and "Accept-Encoding" in resp.headers["Vary"]
    names = {f.name for f in text_string_to_metric_families(await resp.text())}
    assert {"gpumon_gpu_utilization_ratio", "gpumon_gpu_health", "gpumon_exporter_nvml_up"} <= names


async def test_metrics_openmetrics_when_asked(aiohttp_client: MakeClient, backend: SimulatedBackend) -> None:
    client = await started(aiohttp_client, backend)
    resp = await client.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "identity"})
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    body = await resp.text()
    assert body.endswith("# EOF\n")
    assert "gpumon_gpu_health" in {f.name for f in parse_openmetrics(body)}


@pytest.mark.parametrize("accept", ["text/plain", "application/openmetrics-text"])
async def test_metrics_gzip_is_the_same_payload(
    aiohttp_client: MakeClient, backend: SimulatedBackend, accept: str
) -> None:
    client = await started(aiohttp_client, backend)
    resp = await client.get("/metrics", headers={"Accept": accept, "Accept-Encoding": "gzip, deflate"})
    assert resp.headers["Content-Encoding"] == "gzip"
    plain = gzip.decompress(await resp.read()).decode()
    parse = text_string_to_metric_families if accept == "text/plain" else parse_openmetrics
    assert "gpumon_gpu_health" in {f.name for f in parse(plain)}
    assert plain.endswith("# EOF\n") == (accept != "text/plain")


async def test_503_and_not_ready_before_the_first_render(
    aiohttp_client: MakeClient, backend: SimulatedBackend
) -> None:
    backend.inject(parse_fault({"gpu": 0, "fault": "slow", "seconds": 120}))  # holds the first tick
    client = await aiohttp_client(make_app(config(call_timeout=60), backend))
    resp = await client.get("/metrics")
    assert resp.status == 503 and resp.headers["Retry-After"] == "1"
    resp = await client.get("/readyz")
    assert resp.status == 503 and "no complete sample yet" in await resp.text()
    assert (await client.get("/api/v1/snapshot")).status == 503
    assert (await client.get("/healthz")).status == 200
    backend.inject(parse_fault({"gpu": 0, "fault": "clear"}))
    await ready(client)
    assert (await client.get("/metrics")).status == 200


async def test_not_ready_while_the_backend_is_down_then_recovers(
    aiohttp_client: MakeClient, backend: SimulatedBackend
) -> None:
    client = await started(aiohttp_client, backend)
    backend.inject(parse_fault({"fault": "unavailable"}))

    async def down() -> bool:
        resp = await client.get("/readyz")
        return resp.status == 503 and "device backend down" in await resp.text()

    await until(down)

    async def last_data_served_marked_down() -> bool:
        # The payload is rendered off the loop: it says so a render after /readyz does.
        resp = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert resp.status == 200, "last data still served"
        return "gpumon_exporter_nvml_up 0.0" in await resp.text()

    await until(last_data_served_marked_down)
    backend.clear_all()
    await ready(client)


async def test_nvml_unavailable_still_serves_and_has_no_fault_endpoint(aiohttp_client: MakeClient) -> None:
    missing = Path("/nonexistent/libnvidia-ml.so.1")
    cfg = config().model_copy(update={"backend": "nvml", "nvml_library": missing})
    metrics = SelfMetrics(CollectorRegistry(auto_describe=True), backend=cfg.backend)
    backend, routes = build_backend(cfg, metrics)  # the command's wiring
    assert isinstance(backend, NvmlBackend) and routes == []
    client = await aiohttp_client(make_app(cfg, backend, metrics=metrics, routes=routes))

    async def rendered() -> bool:
        return (await client.get("/metrics")).status == 200

    await until(rendered)
    text = await (await client.get("/metrics", headers={"Accept-Encoding": "identity"})).text()
    assert "gpumon_exporter_nvml_up 0.0" in text
    assert (await client.get("/readyz")).status == 503
    assert (await client.get("/api/v1/faults")).status == 404


# -- auth ---------------------------------------------------------------------------------------


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def test_basic_auth_guards_all_but_the_probes(
    aiohttp_client: MakeClient, backend: SimulatedBackend
) -> None:
    auth = AuthConfig(basic_username="prom", basic_password="s3cret")  # type: ignore[arg-type]
    client = await started(aiohttp_client, backend, auth=auth)
    for path in ("/metrics", "/api/v1/snapshot", "/api/v1/faults"):
        resp = await client.get(path)
        assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Basic")
    assert (await client.get("/metrics", headers=_basic("prom", "wrong"))).status == 401
    assert (await client.get("/metrics", headers=_basic("other", "s3cret"))).status == 401
    assert (await client.get("/metrics", headers={"Authorization": "Basic !!!"})).status == 401
    assert (await client.get("/metrics", headers={"Authorization": "Bearer s3cret"})).status == 401
    assert (await client.get("/metrics", headers=_basic("prom", "s3cret"))).status == 200
    assert (await client.get("/healthz")).status == 200


async def test_bearer_token_from_a_file_and_its_rotation(
    aiohttp_client: MakeClient, backend: SimulatedBackend, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    client = await started(aiohttp_client, backend, auth=AuthConfig(bearer_token_file=token))
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/metrics", headers={"Authorization": "Bearer tok-1"})).status == 200
    assert (await client.get("/metrics", headers={"Authorization": "bearer tok-1"})).status == 200
    token.write_text("tok-2")
    client.app[STATE].auth.static.reload_token()  # what the app's reload task does every 30 s
    assert (await client.get("/metrics", headers={"Authorization": "Bearer tok-1"})).status == 401
    assert (await client.get("/metrics", headers={"Authorization": "Bearer tok-2"})).status == 200


def test_unreadable_token_file_is_a_config_error(backend: SimulatedBackend, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"auth\.bearer_token_file: cannot read"):
        make_app(config(auth=AuthConfig(bearer_token_file=tmp_path / "missing")), backend)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        make_app(config(auth=AuthConfig(bearer_token_file=tmp_path / "empty")), backend)


# -- JSON API -----------------------------------------------------------------------------------


async def test_snapshot_json(aiohttp_client: MakeClient, backend: SimulatedBackend) -> None:
    client = await started(aiohttp_client, backend)
    body = await (await client.get("/api/v1/snapshot")).read()
    raw = json.loads(body)
    assert raw["schema"] == 1 and isinstance(raw["gpus"][0]["fast"]["throttle_reasons"], list)
    doc = wire.parse_snapshot(body)
    assert doc.node == "node-1" and doc.backend_up and doc.complete
    assert [g.identity.index for g in doc.gpus] == [0, 1, 2, 3]
    g = doc.gpus[0]
    assert g.identity.uuid == backend.devices()[0].uuid
    assert g.health == wire.Verdict(state=HealthState.HEALTHY)
    assert g.fast is not None and g.fast.memory is not None and g.fast.memory.total_bytes == 81920 << 20
    assert doc.driver is not None and doc.driver.driver_version


async def _next(resp: ClientResponse, predicate: Callable[[wire.WatchLine], bool]) -> wire.WatchLine:
    async with asyncio.timeout(30):
        while True:
            line = await resp.content.readline()
            assert line, "stream ended"
            doc = wire.parse_watch_line(line)
            if predicate(doc):
                return doc


def _health(line: wire.WatchLine) -> bool:
    return isinstance(line, wire.HealthLine)


async def test_watch_streams_state_then_transitions(
    aiohttp_client: MakeClient, backend: SimulatedBackend
) -> None:
    client = await started(aiohttp_client, backend)
    resp = await client.get("/api/v1/watch")
    assert resp.status == 200 and resp.headers["Content-Type"] == "application/x-ndjson"
    first = wire.parse_watch_line(await resp.content.readline())
    assert isinstance(first, wire.StateLine) and first.node == "node-1" and first.backend_up
    assert [(g.gpu, g.health.state, g.xids) for g in first.gpus] == [
        (i, HealthState.HEALTHY, ()) for i in range(4)
    ]
    assert all(g.temperature_celsius is not None and g.ecc_uncorrected == 0 for g in first.gpus), "numbers"

    assert (await client.post("/api/v1/faults", json={"gpu": 1, "fault": "xid", "code": 79})).status == 200
    change = await _next(resp, _health)
    assert isinstance(change, wire.HealthLine) and change.gpu.gpu == 1
    assert change.gpu.uuid == backend.devices()[1].uuid
    assert change.previous is HealthState.HEALTHY and change.gpu.health.state is HealthState.UNHEALTHY
    assert change.gpu.health.reasons == (
        wire.Reason(code="XidFatal", detail="Xid 79", state=HealthState.UNHEALTHY),
    )
    (xid,) = change.gpu.xids
    injected = backend.status().injected[-1].at
    assert (xid.code, xid.at, xid.count) == (79, injected, 1), "the backend's own time"
    # An informational Xid changes no verdict, but the stream tells it (the controller may act).
    assert (await client.post("/api/v1/faults", json={"gpu": 2, "fault": "xid", "code": 13})).status == 200
    info = await _next(resp, _health)
    assert isinstance(info, wire.HealthLine)
    assert (info.gpu.gpu, info.previous, info.gpu.health.state) == (
        2,
        HealthState.HEALTHY,
        HealthState.HEALTHY,
    )
    assert [x.code for x in info.gpu.xids] == [13]
    snapshot = wire.parse_snapshot(await (await client.get("/api/v1/snapshot")).read())
    assert [[x.code for x in g.xids] for g in snapshot.gpus] == [[], [79], [13], []]

    backend.inject(parse_fault({"fault": "unavailable"}))
    down = await _next(resp, lambda d: isinstance(d, wire.BackendLine))
    assert isinstance(down, wire.BackendLine) and not down.up
    backend.clear_all()
    up = await _next(resp, lambda d: isinstance(d, wire.BackendLine))
    assert isinstance(up, wire.BackendLine) and up.up
    resp.close()


async def test_watch_heartbeat(aiohttp_client: MakeClient, backend: SimulatedBackend) -> None:
    client = await started(aiohttp_client, backend)
    resp = await client.get("/api/v1/watch", params={"heartbeat": "0.1"})
    beat = await _next(resp, lambda d: isinstance(d, wire.HeartbeatLine))
    assert beat.node == "node-1" and beat.time > 0
    resp.close()
    for bad in ("0", "abc", "1000"):
        assert (await client.get("/api/v1/watch", params={"heartbeat": bad})).status == 400


async def test_watch_streams_end_when_the_app_stops(
    aiohttp_client: MakeClient, backend: SimulatedBackend
) -> None:
    client = await started(aiohttp_client, backend)
    resp = await client.get("/api/v1/watch")
    await resp.content.readline()
    await client.app.shutdown()  # what a graceful stop runs before waiting for open requests
    async with asyncio.timeout(30):
        with contextlib.suppress(ClientPayloadError):  # the stream is cut, not finished
            assert await resp.content.read() == b""
    assert not client.app[STATE].watch_tasks


async def test_a_watch_cancelled_as_an_event_arrives_still_ends(
    aiohttp_client: MakeClient, backend: SimulatedBackend
) -> None:
    # Python 3.11's asyncio.wait_for handed the stream the event and dropped the cancellation:
    # the stream went on, and a graceful stop waited for it.
    client = await started(aiohttp_client, backend)
    resp = await client.get("/api/v1/watch")
    await resp.content.readline()
    state = client.app[STATE]
    streams = set(state.watch_tasks)
    assert len(streams) == 1
    state.sampler.ingest_xids([XidEvent(backend.devices()[1].uuid, 79, 0.0, 1)])  # queued for the stream
    await client.app.shutdown()
    done, _ = await asyncio.wait(streams, timeout=10)
    assert done, "the watch stream lost its cancellation"
    resp.close()


# -- faults -------------------------------------------------------------------------------------


async def test_fault_endpoint_injects_lists_and_clears(
    aiohttp_client: MakeClient, backend: SimulatedBackend
) -> None:
    client = await started(aiohttp_client, backend)
    status = await (await client.get("/api/v1/faults")).json()
    assert status["gpus"] == 4 and status["model"] == "A100-SXM4-80GB" and status["active"] == {}
    assert "xid" in status["kinds"] and "lost" in status["kinds"]

    resp = await client.post("/api/v1/faults", json={"gpu": 2, "fault": "lost"})
    assert resp.status == 200 and (await resp.json())["injected"] == {"gpu": 2, "fault": "lost"}
    resp = await client.post("/api/v1/faults", json={"gpu": 0, "fault": "overheat", "celsius": 99})
    assert resp.status == 200
    status = await (await client.get("/api/v1/faults")).json()
    assert status["active"] == {"0": ["overheat 99 C"], "2": ["lost"]}
    assert [f["fault"] for f in status["injected"]] == ["lost", "overheat"]

    async def gpu2_lost() -> bool:
        doc = await (await client.get("/api/v1/snapshot")).json()
        return doc["gpus"][2]["health"]["state"] == "lost"

    await until(gpu2_lost)
    status = await (await client.delete("/api/v1/faults")).json()
    assert status["active"] == {} and status["unavailable"] is False


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"gpu": 1, "fault": "xid"}, "xid.code: Field required"),
        ({"gpu": 9, "fault": "lost"}, "gpu 9 does not exist"),
        ({"gpu": 1, "fault": "melt"}, "does not match any of the expected tags"),
        ([1, 2], "invalid fault"),
    ],
)
async def test_bad_fault_requests_get_400_with_the_reason(
    aiohttp_client: MakeClient, backend: SimulatedBackend, body: Any, message: str
) -> None:
    client = await started(aiohttp_client, backend)
    resp = await client.post("/api/v1/faults", json=body)
    assert resp.status == 400 and message in (await resp.json())["error"]
    resp = await client.post("/api/v1/faults", data=b"{not json")
    assert resp.status == 400


async def test_a_sampler_that_dies_is_restarted_counted_and_shown_in_readyz(
    aiohttp_client: MakeClient, backend: SimulatedBackend
) -> None:
    metrics = SelfMetrics(CollectorRegistry(auto_describe=True), backend=backend.name)
    app = make_app(config(), backend, metrics=metrics)
    sampler = app[STATE].sampler
    real_run = sampler.run
    runs: list[None] = []

    async def dies_once() -> None:
        runs.append(None)
        if len(runs) == 1:
            raise RuntimeError("a bug in the sampler")
        await real_run()

    sampler.run = dies_once  # type: ignore[method-assign]
    client = await aiohttp_client(app)

    async def sampling_again() -> bool:
        return len(runs) == 2 and (await client.get("/metrics")).status == 200

    await until(sampling_again)
    assert metrics.task_restarts.labels("gpumon-sampler")._value.get() == 1
    resp = await client.get("/readyz")
    assert (
        resp.status == 503
        and "gpumon-sampler restarted: RuntimeError: a bug in the sampler" in await resp.text()
    )
    assert (await client.get("/healthz")).status == 200  # one restart heals in place


async def test_the_renders_after_a_scrape_write_only_what_it_asked_for(
    aiohttp_client: MakeClient, backend: SimulatedBackend
) -> None:
    client = await started(aiohttp_client, backend)
    sampler = client.app[STATE].sampler
    assert sampler.rendered is not None and sampler.rendered.written() == frozenset()
    resp = await client.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
    assert resp.headers["Content-Encoding"] == "gzip"
    served = sampler.rendered
    assert served.written() == {("openmetrics", False), ("openmetrics", True)}

    async def next_render() -> bool:
        return sampler.rendered is not served

    await until(next_render)
    # Written off the loop before it was published; the text was not written, nor compressed.
    assert sampler.rendered.written() == {("openmetrics", False), ("openmetrics", True)}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc names are Linux's")
async def test_the_exporters_threads_carry_their_names_at_the_os_level(
    aiohttp_client: MakeClient, backend: SimulatedBackend
) -> None:
    """Per-thread CPU (/proc/PID/task/*/stat) is read by name: the sampler's device threads, the
    render thread and the Xid thread each show theirs, not the interpreter's."""
    await started(aiohttp_client, backend)
    names = {p.read_text().rstrip("\n") for p in Path("/proc/self/task").glob("*/comm")}  # noqa: ASYNC240
    assert {"gpumon-xid", "gpumon-render_0", "gpumon-device_0"} <= names
