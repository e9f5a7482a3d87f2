"""Both signal sources: their pure folding of answers, and the direct source against real
exporters (the exporter app on simulated GPUs, in-process)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import operator
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cancellation import assert_ends_cancelled
from controller_fakes import load_rules
from direct_harness import base_url, running_source, wait_for

from gpumon.config import ExporterConfig, SamplingConfig
from gpumon.controller.core.backoff import Backoff
from gpumon.controller.core.policy import EMPTY_NODE_STATE, Policy, Rule, evaluate_node
from gpumon.controller.core.promql import (
    BUSY,
    FLAG,
    FRESHNESS,
    MISSING,
    NODES,
    PODS,
    SERIES,
    bad_query,
    conditions,
    detail_queries,
    left_out,
    node_matcher,
    queries_for,
)
from gpumon.controller.core.signals import GpuReading, NodeReading, XidSeen, is_news, says_the_same
from gpumon.controller.shell.signal_sources import prometheus
from gpumon.controller.shell.signal_sources.direct import (
    DirectSettings,
    DirectSource,
    ExporterView,
    gpu_reading,
    on_line,
    on_snapshot,
    read_bounded,
    reading_of,
)
from gpumon.controller.shell.signal_sources.endpoints import StaticEndpoints
from gpumon.controller.shell.signal_sources.prometheus import (
    PrometheusSettings,
    PrometheusSource,
    Sample,
    named,
    parse_vector,
    readings_from_results,
)
from gpumon.devices.simulated import SimulatedBackend, parse_fault
from gpumon.exporter.server import make_app
from gpumon.gpu.health import Op, Scope, Severity, Signal
from gpumon.gpu.model import (
    FastFields,
    GpuIdentity,
    GpuSample,
    HealthReason,
    HealthState,
    HealthVerdict,
    PodGpuUsage,
    PodRef,
    RecoveryAction,
    SlowFields,
    Snapshot,
    XidEvent,
)
from gpumon.wire import v1 as wire

# --- direct: pure ------------------------------------------------------------------------------

UNHEALTHY_79 = wire.Verdict(
    state=HealthState.UNHEALTHY,
    reasons=(wire.Reason(code="XidFatal", detail="Xid 79", state=HealthState.UNHEALTHY),),
)


def status(gpu: int = 0, **kw: Any) -> wire.GpuStatus:
    fields: dict[str, Any] = {
        "uuid": f"G{gpu}",
        "health": wire.Verdict(state=HealthState.HEALTHY),
        "temperature_celsius": 50.0,
        "ecc_uncorrected": 0,
        "row_remap_failure": False,
    }
    fields.update(kw)
    return wire.GpuStatus(gpu=gpu, **fields)


def state_line(*gpus: wire.GpuStatus, up: bool = True) -> wire.StateLine:
    return wire.StateLine(schema_version=1, node="n1", time=1.0, backend_up=up, gpus=gpus)


def health_line(g: wire.GpuStatus) -> wire.HealthLine:
    return wire.HealthLine(schema_version=1, node="n1", time=1.0, previous=HealthState.HEALTHY, gpu=g)


def test_stream_readings_carry_the_numbers_as_sent():
    sent = status(
        1,
        health=UNHEALTHY_79,
        temperature_celsius=91.5,
        ecc_uncorrected=3,
        row_remap_failure=True,
        recovery_action=RecoveryAction.NODE_REBOOT,
        xids=(wire.Xid(code=13, at=100.25, count=2), wire.Xid(code=79, at=123.5)),
        pods=(wire.Pod(namespace="ml", pod="a", container="main"),),
    )
    view, _ = on_line(ExporterView("n1"), state_line(sent), now=200.0)
    r = reading_of(view)
    assert r is not None and r.pods_attributed
    (g,) = r.gpus
    assert (g.uuid, g.index, g.observed_at) == ("G1", 1, 200.0)
    assert (g.temperature_celsius, g.ecc_uncorrectable, g.row_remap_failure, g.lost) == (91.5, 3, True, False)
    assert g.xids == (XidSeen(13, 100.25), XidSeen(79, 123.5)), "codes with their own times"
    assert g.recovery_action is RecoveryAction.NODE_REBOOT
    assert gpu_reading(status(), 1.0).recovery_action is None, "not reported: unknown, not NONE"
    assert g.health == HealthVerdict(
        HealthState.UNHEALTHY, (HealthReason("XidFatal", "Xid 79", HealthState.UNHEALTHY),)
    )
    assert g.pods == (PodRef("ml", "a", "main"),)
    assert g.memory_utilization_ratio is None, "not on the stream: unknown, never a guess"


def test_watch_lines_fold_into_a_view():
    view = ExporterView("n1")
    assert reading_of(view) is None  # never heard from
    view, changed = on_line(view, state_line(status()), now=10.0)
    assert changed
    r = reading_of(view)
    assert r is not None and r.observed_at == 10.0 and not r.pods_attributed
    assert [(g.uuid, g.index, g.observed_at) for g in r.gpus] == [("G0", 0, 10.0)]
    view, changed = on_line(view, wire.heartbeat_line(node="n1", at=20.0), now=20.0)
    r = reading_of(view)
    assert not changed and r is not None and r.observed_at == 20.0 and r.gpus[0].observed_at == 20.0
    bad = status(health=UNHEALTHY_79, xids=(wire.Xid(code=79, at=20.5),))
    view, changed = on_line(view, health_line(bad), now=21.0)
    r = reading_of(view)
    assert changed and r is not None and r.gpus[0].xids == (XidSeen(79, 20.5),)
    assert not on_line(view, health_line(bad), now=21.5)[1], "the same line again is no change"
    view, changed = on_line(view, wire.backend_line(False, node="n1", at=22.0), now=22.0)
    assert changed and reading_of(view) is None  # a node whose NVML is down tells nothing
    view, _ = on_line(view, state_line(status()), now=23.0)
    assert reading_of(view) is not None
    assert not on_line(view, state_line(status()), now=24.0)[1], "the same state again is no change"


def test_snapshot_gives_raw_fields_pods_and_xids():
    """Exporters without a watch endpoint: the snapshot document, read with the same schema."""
    ident = GpuIdentity(0, "G0", "m", "b")
    sample = GpuSample(
        ident,
        FastFields(temperature_gpu_celsius=50.0, memory_utilization_ratio=0.5),
        SlowFields(ecc_uncorrected=0, row_remap_failure=False, recovery_action=RecoveryAction.GPU_RESET),
        HealthVerdict(HealthState.HEALTHY),
        30.0,
        xid_counts={13: 4},
        xids=(XidEvent("G0", 13, 12.5, 0),),
    )
    pods = (PodGpuUsage(PodRef("ml", "a", "c"), 0, "G0"),)
    doc = wire.parse_snapshot(
        wire.encode(wire.snapshot_document(Snapshot("n1", None, (sample,), pods, 30.0, True, True)))
    )
    view = on_snapshot(ExporterView("n1"), doc, now=31.0)
    r = reading_of(view)
    assert r is not None and r.pods_attributed
    (g,) = r.gpus
    assert (g.temperature_celsius, g.memory_utilization_ratio, g.ecc_uncorrectable, g.row_remap_failure) == (
        50.0,
        0.5,
        0,
        False,
    )
    assert g.observed_at == 30.0  # the exporter's sample time, not the fetch
    assert g.recovery_action is RecoveryAction.GPU_RESET
    assert g.xids == (XidSeen(13, 12.5),) and g.pods == (PodRef("ml", "a", "c"),)


# --- prometheus: pure --------------------------------------------------------------------------


def s(value: float, **labels: str) -> Sample:
    return Sample(labels, value)


TEMP = 'gpumon_gpu_temperature_celsius{sensor="gpu"}'


def test_the_fleet_is_asked_a_sample_a_node_and_the_gpus_some_rule_could_hold_for():
    q = queries_for(load_rules(), 600)
    signals = ("gpu_lost", "ecc_uncorrectable", "row_remap_failure", "temperature")
    assert set(q) == {NODES, "xid", FLAG + "recovery_action", *signals}
    assert q[NODES] == "max by (node) (timestamp(gpumon_gpu_info))"
    # Which nodes run pods on their GPUs: only the autoscaler reads it.
    busy = queries_for(load_rules(), 600, busy=True)[BUSY]
    assert busy.startswith('group by (node) ({__name__=~"gpumon_pod_gpu_(')
    # Only the GPUs some rule could hold for: the loosest of the two thermal rules (87 and 95),
    # any action but NONE (asked by NONE's series alone), a lost or failed-remap flag that is
    # set, any uncorrectable error.
    assert q["temperature"] == f"({TEMP} >= 87.0)"
    assert q[FLAG + "recovery_action"] == 'gpumon_gpu_recovery_action{action="none"} != 1'
    assert q["gpu_lost"] == 'gpumon_gpu_health{state="lost"} != 0.0'
    assert q["ecc_uncorrectable"] == '(gpumon_gpu_ecc_errors_total{type="uncorrected"} >= 1.0)'
    assert "offset 600s" in q["xid"] and "increase(gpumon_gpu_xid_errors_total[600s])" in q["xid"]
    custom = Rule("nv", Signal.PROMQL, Severity.UNHEALTHY, query="sum by (node) (x)", scope=Scope.NODE)
    health = Rule("h", Signal.EXPORTER_HEALTH, Severity.UNHEALTHY, threshold=1)
    q = queries_for((custom, health), 600, node_label="host")
    assert q["rule:nv"] == "sum by (node) (x)", "a PromQL rule's answer is what its author wrote"
    assert q[FLAG + "exporter_health"] == 'gpumon_gpu_health{state="healthy"} != 1' and "__health_info" in q
    assert q[NODES] == "max by (host) (timestamp(gpumon_gpu_info))"


def test_the_nodes_of_interest_are_read_gpu_by_gpu():
    m = 'node=~"gpu-1\\\\.zone-a|gpu-2"'
    assert node_matcher(["gpu-1.zone-a", "gpu-2"]) == m, "the dot escaped for the regex, then the string"
    q = detail_queries(load_rules(), ["gpu-1.zone-a", "gpu-2"])
    signals = ("gpu_lost", "ecc_uncorrectable", "row_remap_failure", "recovery_action", "temperature")
    assert set(q) == {FRESHNESS, PODS, "recovery_action", *(MISSING + name for name in signals)}
    assert q[FRESHNESS] == f"max by (node, gpu, uuid) (timestamp(gpumon_gpu_info{{{m}}}))"
    assert q[PODS].endswith(f'core_allocated_ratio)",{m}}})')
    assert q["recovery_action"] == f'gpumon_gpu_recovery_action{{{m},action!="none"}} == 1'
    assert q[MISSING + "temperature"] == (
        f"group by (node, uuid) (gpumon_gpu_info{{{m}}}) unless on (node, uuid) "
        f'gpumon_gpu_temperature_celsius{{sensor="gpu",{m}}}'
    )
    assert q[MISSING + "recovery_action"].endswith(
        f'unless on (node, uuid) gpumon_gpu_recovery_action{{{m},action="none"}}'
    )
    health = Rule("h", Signal.EXPORTER_HEALTH, Severity.UNHEALTHY, threshold=1)
    q = detail_queries((health,), ["a"], node_label="host")
    assert "on (host, uuid)" in q[MISSING + "exporter_health"] and "(host, gpu, uuid)" in q[FRESHNESS]


def test_the_exporters_verdicts_are_asked_for_the_repair_ladder_with_no_rule_on_them():
    """Repair confirms a repaired GPU by the exporter's verdict (core/repair.py); no built-in
    rule reads it, so without ``verdicts`` no GPU had one and no repair was ever confirmed."""
    rules = load_rules()
    assert FLAG + "exporter_health" not in queries_for(rules, 600)
    q = queries_for(rules, 600, verdicts=True)
    assert q[FLAG + "exporter_health"] == 'gpumon_gpu_health{state="healthy"} != 1', "the bad GPUs only"
    assert "__health_info" in q
    d = detail_queries(rules, ["a"], verdicts=True)
    assert d["exporter_health"] == 'gpumon_gpu_health{node=~"a",state!="healthy"} == 1'
    assert d[MISSING + "exporter_health"].endswith('gpumon_gpu_health{node=~"a",state="healthy"}')
    results = {
        FRESHNESS: [s(90.0, node="a", gpu="0", uuid="A0"), s(90.0, node="a", gpu="1", uuid="A1")],
        "exporter_health": [s(1, node="a", gpu="1", uuid="A1", state="unhealthy")],
        MISSING + "exporter_health": [s(1, node="a", uuid="A1")],
        "__health_info": [s(1, node="a", gpu="1", uuid="A1", reason="XidCritical", detail="79")],
    }
    g0, g1 = readings_from_results(results, rules, now=100.0)["a"].gpus
    assert g0.health == HealthVerdict(HealthState.HEALTHY, ()), "absent from the answer: healthy"
    assert g1.health is not None and g1.health.state is HealthState.UNHEALTHY
    assert g1.health.reasons[0].code == "XidCritical"


def r(signal: Signal, op: Op, threshold: float, name: str = "r") -> Rule:
    return Rule(name, signal, Severity.UNHEALTHY, op, threshold)


def test_each_signal_is_asked_for_the_values_some_rule_holds_for():
    t = Signal.TEMPERATURE
    above = (r(t, Op.GE, 95, "a"), r(t, Op.GT, 87, "b"), r(t, Op.GE, 87, "c"))
    assert conditions(above) == [">= 87.0"], "the loosest: >= 87 takes in > 87 and >= 95"
    below = (r(t, Op.LT, 20, "a"), r(t, Op.LE, 10, "b"), r(t, Op.LT, 10, "c"))
    assert conditions(below) == ["< 20.0"], "a rule that fires below its threshold filters the other way"
    assert conditions((r(t, Op.LE, 20, "a"), r(t, Op.LT, 20, "b"))) == ["<= 20.0"]
    both = (*above, *below, r(t, Op.EQ, 50, "e"), r(t, Op.NE, 60, "f"))
    assert (
        bad_query(t, both) == f"({TEMP} >= 87.0) or ({TEMP} < 20.0) or ({TEMP} == 50.0) or ({TEMP} != 60.0)"
    )
    # Booleans and one-hots leave out the first value no rule holds for, which a GPU absent from
    # the answer then reads exactly; where every value makes a rule hold, nothing is left out.
    lost = Signal.GPU_LOST
    assert bad_query(lost, (r(lost, Op.EQ, 0),)) == 'gpumon_gpu_health{state="lost"} != 1.0'
    assert left_out(lost, (r(lost, Op.GE, 0),)) is None
    assert bad_query(lost, (r(lost, Op.GE, 0),)) == 'gpumon_gpu_health{state="lost"}'
    ra = Signal.RECOVERY_ACTION
    assert bad_query(ra, (r(ra, Op.LE, 0),)) == 'gpumon_gpu_recovery_action{action!="gpu_reset"} == 1'
    assert bad_query(ra, (r(ra, Op.GE, 0),)) == "gpumon_gpu_recovery_action == 1"
    h = Signal.EXPORTER_HEALTH
    assert bad_query(h, (r(h, Op.GE, 2),)) == 'gpumon_gpu_health{state!="healthy"} == 1'


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
        "recovery_action": [
            s(1, node="a", gpu="0", uuid="A0", action="drain_and_reset"),
            s(1, node="b", gpu="0", uuid="B0", action="reboot_the_moon"),  # a newer exporter's: skipped
        ],
        "__health_info": [s(1, node="a", gpu="1", uuid="A1", reason="GpuLost", detail="gone")],
        # A1 is lost: the exporter drops its readings. b's driver reports no recovery action.
        MISSING + "temperature": [s(1, node="a", uuid="A1")],
        MISSING + "recovery_action": [s(1, node="a", uuid="A1"), s(1, node="b", uuid="B0")],
        PODS: [s(1, node="a", gpu="1", uuid="A1", namespace="ml", pod="p", container="c")],
        "rule:nv": [s(3, node="b")],
        "rule:g": [s(1, node="a", gpu="0")],  # no uuid label: matched by index
    }
    nodes = readings_from_results(results, rules, now=100.0)
    assert set(nodes) == {"a", "b"}
    a = nodes["a"]
    assert a.observed_at == 96.0 and a.pods_attributed
    g0, g1 = a.gpus
    assert (g0.temperature_celsius, g0.lost, g0.ecc_uncorrectable, g0.xids) == (70.0, False, None, ())
    # Absent from the ECC answer, which holds only errors some rule fires on: no rule holds.
    assert g0.quiet == {Signal.ECC_UNCORRECTABLE}
    assert g1.quiet == frozenset(), "A1 has an ECC value, and lacks a temperature series: unknown"
    assert g0.custom == {"g": 1.0}
    assert (g0.recovery_action, g1.recovery_action) == (RecoveryAction.DRAIN_AND_RESET, None)
    assert nodes["b"].gpus[0].recovery_action is None, "the driver's node reports none"
    assert nodes["b"].gpus[0].quiet == {Signal.TEMPERATURE, Signal.ECC_UNCORRECTABLE}
    assert (g1.lost, g1.ecc_uncorrectable, g1.temperature_celsius) == (True, 2, None)
    # The query counted the code within the controller's window: seen as of the GPU's scrape.
    assert g1.xids == (XidSeen(79, 96.0),)
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


def test_a_reading_that_differs_only_in_its_time_says_the_same() -> None:
    gpu = GpuReading("A0", 0, observed_at=10.0, lost=False, xids=(XidSeen(79, 10.0),))
    first = NodeReading("a", 10.0, (gpu, replace(gpu, uuid="A1", index=1)))

    def scraped(at: float, **changes: Any) -> NodeReading:
        gpus = tuple(replace(g, observed_at=at, xids=(XidSeen(79, at),)) for g in first.gpus)
        return replace(first, observed_at=at, gpus=(replace(gpus[0], **changes), gpus[1]))

    assert says_the_same(first, scraped(20.0))
    assert not says_the_same(first, scraped(20.0, lost=True))
    assert not says_the_same(first, scraped(20.0, xids=(XidSeen(48, 20.0),)))
    assert not says_the_same(first, scraped(20.0, xids=None))  # cannot tell is not "none"
    assert not says_the_same(first, scraped(20.0, observed_at=10.0))  # GPU 0 fell behind
    assert not says_the_same(first, replace(first, gpus=first.gpus[:1]))
    assert not says_the_same(first, replace(first, pods_attributed=True))
    # Until the first reading may have gone stale (stale_after 60: stale after 70).
    assert not is_news(first, scraped(20.0), at=69.9, stale_after_seconds=60)
    assert is_news(first, scraped(20.0), at=70.0, stale_after_seconds=60)
    assert is_news(first, scraped(20.0, lost=True), at=21.0, stale_after_seconds=60)


async def test_prometheus_source_rounds_retries_and_outages(monkeypatch: pytest.MonkeyPatch):
    """Against an HTTP server answering like Prometheus' query API (parsing is covered above;
    here: the two steps, retries, the all-or-nothing round, and readings kept through an
    outage)."""
    answers: dict[str, Any] = {}
    asked: list[str] = []
    failures = {"left": 0}

    async def query(request: web.Request) -> web.Response:
        if failures["left"]:
            failures["left"] -= 1
            return web.Response(status=503, text="overloaded")
        q = str((await request.post())["query"])
        asked.append(q)
        result = answers.get(q, [])
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    server = TestServer(app)
    await server.start_server()
    rules = load_rules(
        builtin=False, inline=[{"name": "lost", "signal": "gpu_lost", "severity": "unhealthy"}]
    )
    # A node a chunk: each node's second-step queries are its own, and their answers merge.
    monkeypatch.setattr(prometheus, "DETAIL_CHUNK", 1)
    q = queries_for(rules, 600, busy=True)
    detail = {n: detail_queries(rules, [n]) for n in ("a", "b")}
    scraped = {"at": 99.0}
    clock = {"now": 100.0}
    held: set[str] = set()

    def sample(node: str, value: float | str, gpu: str = "0") -> dict[str, Any]:
        return {"metric": {"node": node, "gpu": gpu, "uuid": node.upper() + gpu}, "value": [100, str(value)]}

    def scrape() -> None:
        answers[q[NODES]] = [{"metric": {"node": n}, "value": [100, str(scraped["at"])]} for n in "ab"]
        for n in "ab":
            answers[detail[n][FRESHNESS]] = [sample(n, scraped["at"])]

    answers[q["gpu_lost"]] = [sample("a", 1)]
    answers[q[BUSY]] = [{"metric": {"node": "b"}, "value": [100, "1"]}]
    async with aiohttp.ClientSession() as session:
        src = PrometheusSource(
            PrometheusSettings(
                str(server.make_url("/")), retries=2, timeout_seconds=5, stale_after_seconds=60, busy=True
            ),
            rules,
            session,
            wall_clock=lambda: clock["now"],
            held=lambda: held,
        )
        scrape()
        failures["left"] = 2  # two failed attempts, then the retry succeeds
        assert set(await src.poll_once()) == {"a", "b"}
        fleet = src.current()
        assert fleet.source_up and fleet.nodes["a"].gpus[0].lost
        # b: named by no answer, held by nobody: read as a whole, busy as the pods say.
        b = fleet.nodes["b"]
        assert (b.gpus, b.gpus_read, b.busy, b.observed_at) == ((), False, True, 99.0)
        assert detail["b"][FRESHNESS] not in asked and detail["a"][FRESHNESS] in asked
        scraped["at"], clock["now"] = 109.0, 110.0
        scrape()
        assert list(await src.poll_once()) == []  # scraped again, nothing changed
        assert src.current().nodes["a"].observed_at == 109.0  # fresher all the same
        answers[q["gpu_lost"]] = []
        assert set(await src.poll_once()) == {"a"}  # no longer lost, and read as a whole now
        assert not src.current().nodes["a"].gpus_read
        held.add("b")  # the reconciler holds state on b: read GPU by GPU, whatever the answers
        asked.clear()
        assert set(await src.poll_once()) == {"b"}
        assert src.current().nodes["b"].gpus_read and detail["b"][FRESHNESS] in asked
        failures["left"] = 100
        clock["now"] = 170.0
        assert list(await src.poll_once()) == []
        assert not src.current().source_up and "a" in src.current().nodes  # kept, will age
        # Back after the reading went stale, with the values it left with: the reconciler
        # judged the node stale meanwhile, and only news makes it fresh again.
        failures["left"], scraped["at"], clock["now"] = 0, 179.0, 180.0
        scrape()
        assert set(await src.poll_once()) == {"a", "b"}
        scraped["at"], clock["now"] = 189.0, 190.0
        scrape()
        assert list(await src.poll_once()) == []  # fresh again: scrapes are not news
    await server.close()


async def test_a_round_naming_most_of_the_fleet_keeps_a_bounded_number_of_queries_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rule holding on most nodes names most of the fleet: the second step's chunks are many,
    and the source sends a bounded number of them at once, not one connection each."""
    monkeypatch.setattr(prometheus, "DETAIL_CHUNK", 1)
    monkeypatch.setattr(prometheus, "QUERIES_AT_ONCE", 3)
    inflight, most, asked = [0], [0], [0]
    hot = [f"n{i}" for i in range(12)]
    inline = [{"name": "lost", "signal": "gpu_lost", "severity": "unhealthy"}]
    rules = load_rules(builtin=False, inline=inline)

    async def query(request: web.Request) -> web.Response:
        inflight[0] += 1
        asked[0] += 1
        most[0] = max(most[0], inflight[0])
        await asyncio.sleep(0.02)  # a query takes Prometheus a while
        inflight[0] -= 1
        # The lost GPUs, and each node's GPU for whatever else is asked (freshness included).
        await request.post()
        result = [{"metric": {"node": n, "gpu": "0", "uuid": n + "-0"}, "value": [100, "1"]} for n in hot]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    server = TestServer(app)
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        src = PrometheusSource(PrometheusSettings(str(server.make_url("/"))), rules, session)
        assert set(await src.poll_once()) == set(hot)
    await server.close()
    assert asked[0] == len(queries_for(rules, 600)) + len(hot) * len(detail_queries(rules, ["n0"]))
    assert most[0] <= 3, f"{most[0]} queries in flight at once"


def test_a_summary_is_a_node_no_answer_names_and_a_rule_answer_names_only_where_it_holds():
    rules = (
        *load_rules(),
        Rule("nv", Signal.PROMQL, Severity.UNHEALTHY, Op.GT, 5, query="x", scope=Scope.NODE),
    )
    results = {
        NODES: [s(90.0, node=n) for n in ("a", "b", "c", "d")],
        BUSY: [s(1, node="c")],
        "temperature": [s(99.0, node="a", gpu="0", uuid="A0")],
        FLAG + "recovery_action": [s(0, node="d", gpu="1", uuid="D1", action="none")],
        "rule:nv": [s(1, node="b"), s(9, node="c")],  # its author's query answers for every node
    }
    assert named(results, rules) == {"a", "c", "d"}, "b's value holds no rule"
    results[FRESHNESS] = [s(90.0, node="a", gpu="0", uuid="A0")]
    nodes = readings_from_results(results, rules, now=100.0)
    assert nodes["a"].gpus_read and nodes["a"].gpus[0].temperature_celsius == 99.0
    b, c = nodes["b"], nodes["c"]
    assert (b.gpus_read, b.gpus, b.busy, b.custom, b.observed_at) == (False, (), False, {"nv": 1.0}, 90.0)
    assert c.busy and not c.pods_attributed, "a summary places no pod: the drain must not trust it"


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


REQUESTS = web.AppKey("requests", collections.Counter[str])


@web.middleware
async def _count_requests(request: web.Request, handler: Any) -> web.StreamResponse:
    request.app[REQUESTS][request.path] += 1
    response: web.StreamResponse = await handler(request)
    return response


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
        app = make_app(cfg, backend, attributor=Pods(placement or {}))
        app[REQUESTS] = collections.Counter()
        app.middlewares.append(_count_requests)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        return base_url(server), backend, server

    yield start
    for server in servers:
        await server.close()


async def test_direct_source_streams_everything_and_never_fetches_a_watched_snapshot(exporters):
    url1, backend1, server1 = await exporters("n1", placement={0: "a", 1: "b", 2: "c"})
    url2, _, server2 = await exporters("n2")
    changes: list[str] = []
    settings = DirectSettings(heartbeat_seconds=0.2, poll_interval_seconds=0.2)
    async with running_source({"n1": url1, "n2": url2}, settings, on_change=changes.extend) as src:

        def heard(node: str) -> bool:
            r = src.current().nodes.get(node)
            return r is not None and len(r.gpus) == 4 and all(g.temperature_celsius for g in r.gpus)

        await wait_for(lambda: heard("n1") and heard("n2"), "both exporters heard, with numbers")
        assert src.connected == 2
        r = src.current().nodes["n2"]
        assert all(
            g.health.state is HealthState.HEALTHY and g.temperature_celsius is not None for g in r.gpus
        )
        backend1.inject(parse_fault({"gpu": 1, "fault": "xid", "code": 79}))

        def told() -> bool:
            r = src.current().nodes.get("n1")
            return r is not None and any(x.code == 79 for x in r.gpus[1].xids or ())

        await wait_for(told, "the Xid")
        r = src.current().nodes["n1"]
        assert r.pods_attributed and r.gpus[1].pods == (PodRef("ml", "b", "main"),)
        assert r.gpus[1].xids == (XidSeen(79, backend1.status().injected[-1].at),)
        assert "n1" in changes
        # Heartbeats keep a quiet node fresh.
        before = src.current().nodes["n2"].observed_at
        await wait_for(lambda: src.current().nodes["n2"].observed_at > before, "a heartbeat")
        assert server1.app[REQUESTS]["/api/v1/snapshot"] == server2.app[REQUESTS]["/api/v1/snapshot"] == 0
        assert not src.errors


async def test_direct_source_sees_an_exporter_go_dark_and_come_back(exporters):
    url, backend, _ = await exporters("n1")
    async with running_source({"n1": url}, DirectSettings(heartbeat_seconds=0.2)) as src:
        await wait_for(lambda: "n1" in src.current().nodes, "exporter heard")
        backend.inject(parse_fault({"fault": "unavailable"}))
        await wait_for(lambda: "n1" not in src.current().nodes, "backend down means no reading")
        backend.clear_all()
        await wait_for(lambda: "n1" in src.current().nodes, "back")


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
    try:
        async with running_source({"n1": base_url(old)}, DirectSettings(poll_interval_seconds=0.2)) as src:
            await wait_for(
                lambda: (
                    "n1" in src.current().nodes
                    and src.current().nodes["n1"].gpus[0].temperature_celsius is not None
                ),
                "polled",
            )
            assert src.connected == 0
    finally:
        await old.close()


def _snapshot_body() -> bytes:
    sample = GpuSample(GpuIdentity(0, "G0", "m", "b"), None, None, HealthVerdict(HealthState.HEALTHY), 1.0)
    return wire.encode(wire.snapshot_document(Snapshot("n1", None, (sample,), (), 1.0, True, True)))


async def test_direct_source_stops_when_cancelled_from_its_change_callback():
    """An exporter without a watch endpoint: its first snapshot's change callback cancels the
    source while the watch task is still in its fetch. Python 3.11's asyncio.wait_for lost such
    cancellations (CPython gh-86296); the source must end cancelled."""

    async def snapshot(request: web.Request) -> web.Response:
        return web.Response(body=_snapshot_body(), content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/snapshot", snapshot)
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
                StaticEndpoints({"n1": base_url(server)}),
                session,
            )
            task = asyncio.create_task(src.run(cancel_on_first_change))
            tasks.append(task)
            await assert_ends_cancelled(task, "the source lost its cancellation and kept running")
    finally:
        await server.close()


# --- direct: input refused at the edge ----------------------------------------------------------


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode() + b"\n"


GOOD_STATE = wire.encode(state_line(status()))


async def test_direct_source_refuses_and_counts_bad_lines_then_recovers():
    """Each connection gets one bad thing, the last a good state line: every bad one is refused,
    counted by kind and ends the connection (no reading from it, no crash); the reconnect's
    state line gives the reading."""
    good = json.loads(GOOD_STATE)
    too_many_gpus = {**good, "gpus": good["gpus"] * (wire.MAX_GPUS + 1)}
    script = [
        b"x" * (wire.MAX_LINE_BYTES + 1),  # no newline: the reader must not buffer it all
        b"not json\n",
        _line({**json.loads(GOOD_STATE), "schema": 2}),
        _line({k: v for k, v in json.loads(GOOD_STATE).items() if k != "schema"}),
        _line({**json.loads(GOOD_STATE), "time": "soon"}),
        _line(too_many_gpus),
        GOOD_STATE,
    ]
    served: list[int] = []

    async def watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        body = script[min(len(served), len(script) - 1)]
        served.append(len(body))
        await resp.write(body)
        with contextlib.suppress(ConnectionError):
            while True:  # heartbeats until the client goes
                await asyncio.sleep(0.05)
                await resp.write(wire.encode(wire.heartbeat_line(node="n1", at=1.0)))
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/watch", watch)
    server = TestServer(app)
    await server.start_server()
    try:
        quick = Backoff(initial_seconds=0.01, max_seconds=0.01)
        reported: list[str] = []  # what the controller's metric counts (app.py wires it)
        async with running_source(
            {"n1": base_url(server)},
            DirectSettings(heartbeat_seconds=0.2),
            backoff=quick,
            on_error=reported.append,
        ) as src:
            await wait_for(lambda: "n1" in src.current().nodes, "the good state line")
            assert src.errors == {"oversize": 1, "invalid": 3, "schema": 2}
            assert collections.Counter(reported) == src.errors
            assert len(served) == len(script)
    finally:
        await server.close()


async def test_a_snapshot_is_read_no_further_than_its_limit():
    async def chunks():
        for _ in range(10):
            yield b"x" * 1000

    assert len(await read_bounded(chunks(), 10_000)) == 10_000
    with pytest.raises(wire.WireError) as refused:
        await read_bounded(chunks(), 9_999)
    assert refused.value.kind == "oversize"


def test_a_gpu_or_xid_label_of_non_ascii_digits_is_not_an_index() -> None:
    # Found by the fuzz tier: "²".isdigit() is True and int("²") raises, which cost the round.
    rules = load_rules()
    results = {
        FRESHNESS: [
            Sample({"node": "a", "uuid": "A0", "gpu": "0"}, 1.0),
            Sample({"node": "a", "uuid": "A1", "gpu": "²"}, 1.0),
        ],
        "xid": [
            Sample({"node": "a", "uuid": "A0", "gpu": "0", "xid": "٣"}, 1.0),
            Sample({"node": "a", "gpu": "0", "xid": "other"}, 1.0),
        ],
    }
    nodes = readings_from_results(results, rules, now=5.0)
    assert [g.uuid for g in nodes["a"].gpus] == ["A0"]
    assert not nodes["a"].gpus[0].xids


@pytest.mark.parametrize(
    "doc",
    [
        {"status": "success", "data": {"resultType": "vector", "result": 7}},
        {"status": "success", "data": []},
        {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, 10**400]}]},
        },
        {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {"gpu": 1}, "value": [0, "1"]}]},
        },
    ],
    ids=["result-not-a-list", "data-not-an-object", "value-too-large", "label-not-text"],
)
def test_an_odd_query_answer_is_refused_or_skipped_not_a_crash(doc: dict[str, Any]) -> None:
    # Found by the fuzz tier: each of these escaped parse_vector as TypeError, AttributeError or
    # OverflowError, which the source's retry loop does not catch.
    with contextlib.suppress(ValueError):
        assert parse_vector(doc) == []


async def test_a_fleet_of_watches_is_set_up_a_bounded_number_at_a_time():
    # A restart subscribes to every exporter at once: unbounded, the event loop could not
    # finish thousands of connects within their timeout, and they failed and came back
    # together. A watch holds its place from the connect to its first line, then gives it up.
    setting_up = 0
    most = 0
    streaming = 0

    async def watch(request: web.Request) -> web.StreamResponse:
        nonlocal setting_up, most, streaming
        setting_up += 1
        most = max(most, setting_up)
        resp = web.StreamResponse()
        await resp.prepare(request)
        await asyncio.sleep(0.02)  # a busy exporter's first line
        setting_up -= 1
        await resp.write(GOOD_STATE)
        streaming += 1
        with contextlib.suppress(ConnectionError):
            while True:
                await asyncio.sleep(0.05)
                await resp.write(wire.encode(wire.heartbeat_line(node="n1", at=1.0)))
        return resp

    app = web.Application()
    app.router.add_get("/nodes/{node}/api/v1/watch", watch)
    server = TestServer(app)
    await server.start_server()
    urls = {f"n{i}": f"{base_url(server)}/nodes/n{i}" for i in range(40)}
    try:
        async with running_source(urls, DirectSettings(heartbeat_seconds=0.2, max_connecting=4)) as src:
            await wait_for(lambda: len(src.current().nodes) == 40, "every exporter heard")
            assert most <= 4
            assert streaming == 40, "the places are given up: all 40 stream at once"
            assert src.errors == {}
    finally:
        await server.close()


# The same fleet, answered the way the queries did before (every GPU's value) and the way they do
# now (only values some rule could hold for, read back through the query's own filter), judged
# step by step by the policy: the same verdicts, states and wake-ups, hysteresis and all.

_COMPARE_TEXT = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_COMPARE_TEXT |= {"==": operator.eq, "!=": operator.ne}


def _asked(sig: Signal, rules: tuple[Rule, ...], key: float | str, number: float) -> bool:
    """Whether the source's query for ``sig`` returns a GPU whose value is ``key`` (a one-hot's
    label) or ``number``: the filter bad_query writes, read back."""
    skip = left_out(sig, rules)
    if SERIES[sig].one_hot is not None or SERIES[sig].boolean:
        return skip is None or key != skip
    on = [r for r in rules if r.signal is sig]
    return any(_COMPARE_TEXT[op](number, float(t)) for op, t in (c.split() for c in conditions(on)))


# Per step: temperature, ECC count, recovery action per GPU; None: the series is missing.
_Step = tuple[tuple[float | None, int | None, RecoveryAction | None], ...]
_TIMELINE: list[_Step] = [
    ((60.0, 0, RecoveryAction.NONE), (60.0, 0, RecoveryAction.NONE)),
    ((96.0, 0, RecoveryAction.NONE), (88.0, 0, RecoveryAction.NONE)),  # unhealthy, degraded pending
    ((96.0, 2, RecoveryAction.GPU_RESET), (88.0, 0, RecoveryAction.NONE)),
    ((80.0, 0, RecoveryAction.NONE), (88.0, 0, RecoveryAction.NONE)),  # GPU 0 clears
    ((None, None, None), (88.0, 0, RecoveryAction.NONE)),  # lost: unknown holds, recovery restarts
    ((80.0, 0, RecoveryAction.NONE), (60.0, 0, None)),  # GPU 1's driver stops reporting
    *[((80.0, 0, RecoveryAction.NONE), (60.0, 0, RecoveryAction.NONE))] * 4,  # recovery runs out
    ((96.0, 0, RecoveryAction.NONE), (60.0, 0, RecoveryAction.NONE)),  # and fires again
]


def _answers(step: _Step, rules: tuple[Rule, ...], *, filtered: bool) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {FRESHNESS: []}
    for sig in (Signal.TEMPERATURE, Signal.ECC_UNCORRECTABLE, Signal.RECOVERY_ACTION):
        out[sig.value], out[MISSING + sig.value] = [], []
    for i, (temp, ecc, action) in enumerate(step):
        ids = {"node": "a", "gpu": str(i), "uuid": f"A{i}"}
        out[FRESHNESS].append(Sample(ids, 0.0))
        values: list[tuple[Signal, float | None, dict[str, str]]] = [
            (Signal.TEMPERATURE, temp, {}),
            (Signal.ECC_UNCORRECTABLE, None if ecc is None else float(ecc), {}),
            (
                Signal.RECOVERY_ACTION,
                None if action is None else 1.0,
                {} if action is None else {"action": action.label},
            ),
        ]
        for sig, number, labels in values:
            if number is None:
                out[MISSING + sig.value].append(Sample({"node": "a", "uuid": f"A{i}"}, 1.0))
                continue
            key = labels.get("action", number)
            value = float(action) if sig is Signal.RECOVERY_ACTION and action is not None else number
            if not filtered or _asked(sig, rules, key, value):
                out[sig.value].append(Sample({**ids, **labels}, number))
    return out


def test_the_filtered_answers_are_judged_exactly_as_every_gpus_values_were():
    rules = tuple(
        replace(
            rule, for_seconds=10.0 if rule.severity is Severity.DEGRADED else 0.0, recover_after_seconds=30.0
        )
        for rule in load_rules(builtin=True)
        if rule.signal in (Signal.TEMPERATURE, Signal.ECC_UNCORRECTABLE, Signal.RECOVERY_ACTION)
    )
    policy = Policy(rules=rules)
    states = {True: EMPTY_NODE_STATE, False: EMPTY_NODE_STATE}
    seen = []
    for n, step in enumerate(_TIMELINE):
        now = 10.0 * n
        evaluations = {}
        for filtered in (False, True):
            results = {
                k: [replace(x, value=now) if k == FRESHNESS else x for x in v]
                for k, v in _answers(step, rules, filtered=filtered).items()
            }
            reading = readings_from_results(results, rules, now=now)["a"]
            ev = evaluate_node("a", {}, reading, states[filtered], now, policy)
            states[filtered] = ev.state
            evaluations[filtered] = ev
        assert evaluations[True] == evaluations[False], f"step {n}"
        seen.append(
            (evaluations[True].verdict.severity, [g.recovering for g in evaluations[True].verdict.gpus])
        )
    # The timeline went through what it is there for: firing, recovering, held, recovered, again.
    assert seen[1][0] is Severity.UNHEALTHY and seen[3][1][0] is True
    assert seen[4][1][0] is False, "a lost GPU's missing temperature holds its rule, recovery restarts"
    assert seen[-2][0] is not Severity.UNHEALTHY and seen[-1][0] is Severity.UNHEALTHY
