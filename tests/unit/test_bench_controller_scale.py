"""The controller scale benchmark's parts: the signal farm speaks the exporter's API well enough
for the controller's real direct source, the fleet's names agree between farm and cluster, the
API server's counters are read per client, and sections of RESULTS.md survive each other."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench import controller_scale, scale_curve
from bench.cache_bytes import CacheSize
from bench.controller_scale import (
    CONTROL_PLANE_HEADER,
    CURVE_SECTION,
    FULL,
    CurveRecord,
    coverage_lags,
    curve,
    curve_section,
    dispatched_by_flow,
    has_taint,
    leaving,
    load_records,
    metric_sum,
    metrics_if_answering,
    save_records,
    unschedulable,
)
from bench.report import Row, Table, carry_sections, section_markdown, sections, splice
from bench.scale_fleet import GPUS_PER_NODE, NAMESPACE, bound_pods, gpu_pod_name, node_names, nodes_needed
from bench.signal_farm import Farm, make_app, node_snapshot, with_xid
from gpumon.controller.shell.signal_sources.direct import DirectSettings, DirectSource
from gpumon.controller.shell.signal_sources.endpoints import StaticEndpoints
from gpumon.gpu.model import HealthState, PodRef


async def wait_for(predicate: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():  # noqa: ASYNC110 - polling a real server with a deadline
            await asyncio.sleep(0.02)


def test_an_xid_makes_the_gpu_unhealthy_as_the_exporter_judges_it() -> None:
    now = time.time()
    before = node_snapshot("gpu-node-0000", 0, 8, now)
    assert all(g.health.state is HealthState.HEALTHY for g in before.gpus)
    after = with_xid(before, 2, 79, now + 1)
    bad = after.gpus[2]
    assert bad.health.state is HealthState.UNHEALTHY and bad.health.reason == "XidFatal"
    assert ([e.xid for e in bad.xids], bad.xid_counts[79], bad.last_xid) == ([79], 1, 79)
    assert bad.xids[0].timestamp == now + 1
    assert [g.health for i, g in enumerate(after.gpus) if i != 2] == [
        g.health for i, g in enumerate(before.gpus) if i != 2
    ]
    with pytest.raises(KeyError):
        with_xid(before, 8, 79, now)


def test_the_farm_names_each_gpus_pod_as_the_cluster_has_it() -> None:
    node = node_names(3)[2]
    snapshot = node_snapshot(node, 2, GPUS_PER_NODE, time.time())
    cluster = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in bound_pods(node)}
    farm = {(u.ref.namespace, u.ref.pod) for u in snapshot.pods}
    assert farm < cluster and len(farm) == GPUS_PER_NODE
    assert {u.gpu_index: u.ref.pod for u in snapshot.pods}[5] == gpu_pod_name(node, 5)
    assert all(p["spec"]["nodeName"] == node for p in bound_pods(node))
    # GPUs differ from node to node, as they would in a fleet.
    other = node_snapshot(node_names(1)[0], 0, GPUS_PER_NODE, time.time())
    assert {g.identity.uuid for g in snapshot.gpus}.isdisjoint(g.identity.uuid for g in other.gpus)


@pytest.mark.parametrize("pending, nodes", [(500, 63), (8, 1), (9, 2), (0, 0)])
def test_nodes_needed_for_single_gpu_pods(pending: int, nodes: int) -> None:
    assert nodes_needed(pending) == nodes


async def test_the_controllers_direct_source_reads_the_farm_and_sees_a_fault() -> None:
    farm = Farm.build(3, GPUS_PER_NODE)
    server = TestServer(make_app(farm), host="127.0.0.1")
    await server.start_server()
    names = node_names(3)
    urls = {n: str(server.make_url(f"/nodes/{n}")) for n in names}
    try:
        async with aiohttp.ClientSession() as session:
            src = DirectSource(
                DirectSettings(heartbeat_seconds=0.2, poll_interval_seconds=0.2),
                StaticEndpoints(urls),
                session,
            )
            task = asyncio.create_task(src.run(lambda nodes: None))
            try:
                await wait_for(lambda: len(src.current().nodes) == 3, "every node heard")
                assert all(
                    len(r.gpus) == GPUS_PER_NODE
                    and all(g.health.state is HealthState.HEALTHY for g in r.gpus)
                    for r in src.current().nodes.values()
                )
                assert farm.stats.snapshots == 0  # healthy nodes cost a watch stream, nothing more

                async with session.post(
                    server.make_url("/farm/faults"), json={"node": names[1], "gpu": 2, "xid": 79}
                ) as resp:
                    assert resp.status == 200 and (await resp.json())["watchers"] == 1

                def placed() -> bool:
                    r = src.current().nodes.get(names[1])
                    return r is not None and any(x.code == 79 for x in r.gpus[2].xids or ())

                await wait_for(placed, "the Xid with the pods on the GPU")
                r = src.current().nodes[names[1]]
                assert r.gpus[2].health is not None and r.gpus[2].health.state is HealthState.UNHEALTHY
                assert r.gpus[2].pods == (PodRef(NAMESPACE, gpu_pod_name(names[1], 2), "cuda"),)
                assert r.pods_attributed and r.gpus[2].temperature_celsius is not None  # on the stream
                assert farm.stats.snapshots == 0, "a watched node is never polled, even when troubled"
                assert src.current().nodes[names[0]].gpus[2].health.state is HealthState.HEALTHY
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        async with aiohttp.ClientSession() as session:
            async with session.get(server.make_url("/nodes/nope/api/v1/snapshot")) as resp:
                assert resp.status == 404
            async with session.post(server.make_url("/farm/faults"), json={"node": names[0]}) as resp:
                assert resp.status == 400
    finally:
        await server.close()


def test_snapshot_timestamps_are_brought_up_to_date_once_a_second() -> None:
    clock = [1_000.0]
    farm = Farm.build(1, 2, wall_clock=lambda: clock[0])
    node = farm.nodes[node_names(1)[0]]
    first = node.snapshot_body(1_000.0)
    assert node.snapshot_body(1_000.5) is first
    assert b'"sampled_at":1001.2' in node.snapshot_body(1_001.2)


APISERVER_METRICS = """\
# HELP apiserver_flowcontrol_dispatched_requests_total [BETA] Number of requests executed
# TYPE apiserver_flowcontrol_dispatched_requests_total counter
apiserver_flowcontrol_dispatched_requests_total{flow_schema="bench-gpumon-controller",priority_level="wl"} 42
apiserver_flowcontrol_dispatched_requests_total{flow_schema="exempt",priority_level="exempt"} 9000
apiserver_flowcontrol_dispatched_requests_total_other{flow_schema="bench-gpumon-controller"} 7
# HELP gpumon_controller_nodes_by_signal_status x
# TYPE gpumon_controller_nodes_by_signal_status gauge
gpumon_controller_nodes_by_signal_status{status="fresh"} 1999.0
gpumon_controller_nodes_by_signal_status{status="stale"} 1.0
"""


def test_api_requests_are_read_per_client_flow_schema() -> None:
    assert dispatched_by_flow(APISERVER_METRICS) == {"bench-gpumon-controller": 42.0, "exempt": 9000.0}
    assert metric_sum(APISERVER_METRICS, "gpumon_controller_nodes_by_signal_status", status="fresh") == 1999
    assert metric_sum(APISERVER_METRICS, "gpumon_controller_nodes_by_signal_status") == 2000


def test_what_the_watches_wait_for() -> None:
    assert has_taint({"spec": {"taints": [{"key": "gpumon.io/gpu-unhealthy", "effect": "NoSchedule"}]}})
    assert not has_taint({"spec": {"taints": [{"key": "nvidia.com/gpu"}]}}) and not has_taint({})
    assert leaving("DELETED", {}) and leaving(
        "MODIFIED", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}
    )
    assert not leaving("MODIFIED", {"metadata": {}})


def _section(name: str, value: str) -> str:
    table = Table("T", "how", (Row("figure", "≤ 1", value),))
    return section_markdown(
        name, title=name, intro="intro", machine=[("date", "today")], tables=[table], notes=["a note"]
    )


def test_sections_are_replaced_in_place_appended_when_new_and_carried_over() -> None:
    doc = "# results\n\nexporter tables\n"
    one = splice(doc, _section("controller-scale", "1 s"))
    assert one.startswith(doc) and "| figure | ≤ 1 | 1 s |" in one
    two = splice(one + "\ntail\n", _section("controller-scale", "2 s"))
    assert "| figure | ≤ 1 | 2 s |" in two and "1 s |" not in two and two.endswith("tail\n")
    assert list(sections(two)) == ["controller-scale"]
    # The exporter run rewrites the file: the controller's section is kept.
    rewritten = carry_sections(two, "# results\n\nnew exporter tables\n")
    assert "new exporter tables" in rewritten and sections(rewritten) == sections(two)
    assert carry_sections("no sections here", "fresh\n") == "fresh\n"


def test_a_pending_pods_lag_runs_to_the_first_request_with_room_for_it() -> None:
    # 10 single-GPU pods on 8-GPU nodes: pods 1-8 need one node, pods 9-10 two.
    marked = [float(t) for t in range(10)]  # pod k marked Unschedulable at k - 1 s
    requests = [(0.5, 1), (8.25, 2)]
    lags = coverage_lags(marked, requests, 8)
    assert lags[0] == 0.5 and lags[1:8] == [0.0] * 7  # the first request already had room for them
    assert lags[8:] == [0.25, 0.0]  # the 9th waited for the second request; the 10th came after it
    assert coverage_lags([1.0], [], 8) == [math.inf]  # never covered


def test_unschedulable_is_the_schedulers_verdict_only() -> None:
    def pod(**condition: str) -> dict[str, object]:
        return {"status": {"conditions": [{"type": "PodScheduled", **condition}]}}

    assert unschedulable(pod(status="False", reason="Unschedulable"))
    assert not unschedulable(pod(status="False", reason="SchedulingGated"))
    assert not unschedulable(pod(status="True")) and not unschedulable({})


def curve_record(nodes: int, date: str, restart: float = math.nan) -> CurveRecord:
    point = scale_curve.Point(
        nodes=nodes,
        cpu_cores=nodes * 4e-5,
        rss_bytes=1e8 + nodes * 5e4,
        requests_per_second=1.2,
        fault_to_taint=0.05,
        taint_to_eviction=0.1,
        pending_to_request=1.5,
        restart_synced=nodes / 200,
        restart_decision=restart,
        load=3.0,
    )
    row = (f"{nodes:,}", *(f"{date} {h}" for h in CONTROL_PLANE_HEADER[1:]))
    return CurveRecord(point, row, (CacheSize("nodes", 500, 500, 1128 * 500, 16388 * 500),), 284.0, date)


def test_curve_records_survive_the_file_nan_included(tmp_path: Path) -> None:
    file = tmp_path / "curve.json"
    records = {1000: curve_record(1000, "d1"), 10000: curve_record(10000, "d2", restart=12.5)}
    save_records(file, records)
    back = load_records(file)
    assert repr(back) == repr(records)  # repr: NaN is not equal to itself
    assert math.isnan(back[1000].point.restart_decision) and back[10000].point.restart_decision == 12.5
    assert load_records(tmp_path / "absent.json") == {}


async def test_a_curve_run_replaces_the_sizes_it_ran_keeps_the_others_and_stops_at_a_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[int] = []

    async def measure(plan: controller_scale.Plan, workdir: Path) -> controller_scale.Outcome:
        ran.append(plan.nodes)
        raise RuntimeError(f"{plan.nodes} nodes: the controller never led\nlog tail")

    monkeypatch.setattr(controller_scale, "measure", measure)
    records = {1000: curve_record(1000, "earlier"), 5000: curve_record(5000, "earlier")}
    written: list[tuple[list[int], str | None]] = []
    ok = await curve(
        [10000, 20000], FULL, tmp_path, records, lambda r, stopped: written.append((sorted(r), stopped))
    )
    assert not ok and ran == [10000]
    assert written == [
        ([1000, 5000], "10,000 nodes did not run: RuntimeError: 10000 nodes: the controller never led")
    ]
    section = curve_section(records, written[0][1])
    assert section.startswith(f"<!-- begin {CURVE_SECTION} -->")
    assert "| sizes | 1,000 nodes, 5,000 nodes; 10,000 nodes did not run" in section
    assert "| date | earlier (1,000, 5,000 nodes) |" in section
    # the control-plane rows are the records' own text, in size order
    assert section.index("| 1,000 | earlier lease") < section.index("| 5,000 | earlier lease")


async def test_a_controller_not_answering_yet_is_none_whether_refused_or_late() -> None:
    async def late(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def prompt(request: web.Request) -> web.Response:
        return web.Response(text="gpumon_controller_leader 1.0\n")

    app = web.Application()
    app.router.add_get("/late/metrics", late)
    app.router.add_get("/metrics", prompt)
    async with (
        TestServer(app) as server,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2)) as s,
    ):
        base = str(server.make_url("")).rstrip("/")
        answered = await metrics_if_answering(s, SimpleNamespace(url=base))
        assert answered is not None and metric_sum(answered, "gpumon_controller_leader") == 1
        assert await metrics_if_answering(s, SimpleNamespace(url=base + "/late")) is None
        closed = f"http://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession() as s:
        assert await metrics_if_answering(s, SimpleNamespace(url=closed)) is None
