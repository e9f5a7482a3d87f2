"""The scale curve's churn phase, its pure parts: which pods and nodes churn when (every pod it
deletes exists, every node that leaves is there and every node that joins is not, the fleet's
proportions, the spared nodes), lease losses counted from gauge polls and log lines, the
lease holder found among replicas, and the cells of the curve's tables."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import math
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench import controller_scale, fleet_churn, scale_curve
from bench.cache_bytes import CacheSize
from bench.controller_scale import (
    CurveRecord,
    LeaderPolls,
    lease_holder,
    load_records,
    pod_lists,
    poll_leader,
)
from bench.fleet_churn import Churn, Rates, churn_grid, churn_row, leader_drops, lease_log, schedule, spread
from bench.report import table_markdown
from bench.scale_fleet import GPUS_PER_NODE, bound_pods, node_names

pytestmark = pytest.mark.unit

SPARED = ("gpu-node-0003", "gpu-node-0050", "gpu-node-0100")


@pytest.mark.parametrize("count", [1, 2, 10, 197, 200, 10_000])
def test_spread_takes_every_index_once(count: int) -> None:
    order = spread(count)
    assert sorted(order) == list(range(count))
    if count >= 10:  # consecutive picks land far apart
        assert min(abs(a - b) for a, b in itertools.pairwise(order)) > count // 10


def test_the_schedule_keeps_its_rates_and_spares_the_faulted_nodes() -> None:
    steps = schedule(node_names(200), SPARED, 120, Rates(pods_per_second=2.0, node_seconds=10.0))
    assert len(steps.pods) == 240 and [p.at for p in steps.pods[:3]] == [0.0, 0.5, 1.0]
    assert len(steps.nodes) == 12 and [n.at for n in steps.nodes[:3]] == [0.0, 10.0, 20.0]
    touched = {p.node for p in steps.pods} | {n.leaves for n in steps.nodes}
    assert not touched & set(SPARED)
    # the nodes that leave are not those whose pods are replaced
    assert not {p.node for p in steps.pods} & {n.leaves for n in steps.nodes}
    # a node joins again three steps after it left
    assert [n.joins for n in steps.nodes[:3]] == [None, None, None]
    assert [n.joins for n in steps.nodes[3:]] == [n.leaves for n in steps.nodes[:-3]]


def test_pods_replaced_keep_the_fleets_proportion_of_gpu_to_cpu_pods() -> None:
    steps = schedule(node_names(200), SPARED, 60, Rates(pods_per_second=3.0, node_seconds=0))
    for start in range(len(steps.pods) - 10):
        window = steps.pods[start : start + 10]
        assert sum(p.slot < GPUS_PER_NODE for p in window) == GPUS_PER_NODE
        assert len({p.node for p in window}) == 10  # each on another node


def test_every_pod_deleted_exists_and_is_replaced_on_its_node_even_past_one_round() -> None:
    names = node_names(12)
    # 6 nodes leave, 6 keep 60 pods, replaced 4 times over (240 steps)
    steps = schedule(names, (), 120, Rates(pods_per_second=2.0, node_seconds=10.0))
    leavers = {n.leaves for n in steps.nodes}
    pods = {str(p["metadata"]["name"]): n for n in names if n not in leavers for p in bound_pods(n)}
    assert len(pods) == 60
    for step in steps.pods:
        assert pods.pop(step.delete) == step.node
        body = fleet_churn.replacement(step)
        assert body["metadata"]["name"] == step.create and body["spec"]["nodeName"] == step.node
        assert body["spec"]["containers"] == bound_pods(step.node)[step.slot]["spec"]["containers"]
        assert step.create not in pods
        pods[step.create] = step.node
    assert len(pods) == 60
    assert collections.Counter(p.create.rsplit("-r", 1)[1] for p in steps.pods) == {
        "1": 60,
        "2": 60,
        "3": 60,
        "4": 60,
    }


def test_a_node_leaves_only_when_there_and_joins_only_when_gone() -> None:
    names = node_names(20)
    steps = schedule(names, ("gpu-node-0000",), 600, Rates(node_seconds=10.0, away_steps=3))
    assert len(steps.nodes) == 60  # more steps than the 9 nodes that may leave: they come round again
    present = set(names)
    for step in steps.nodes:
        assert step.leaves in present
        present.remove(step.leaves)
        if step.joins is not None:
            assert step.joins not in present
            present.add(step.joins)
        assert len(present) >= len(names) - 3
    assert "gpu-node-0000" in present


def test_too_few_nodes_to_churn_is_said() -> None:
    with pytest.raises(ValueError, match="too few"):
        schedule(node_names(6), (), 600, Rates(node_seconds=10.0, away_steps=3))


def test_leader_drops_are_one_to_zero_transitions_across_unanswered_polls() -> None:
    assert leader_drops([1, 1, 1]) == 0
    assert leader_drops([1, 0, 0, 1, 0]) == 2
    assert leader_drops([1, None, None, 0, None, 1]) == 1  # lost while not answering: once
    assert leader_drops([0, 0, 1]) == 0  # not leading yet is no loss
    assert leader_drops([None, None]) == 0


def test_lease_log_lines_in_either_format() -> None:
    text = "07:00:01 INFO    gpumon.controller.shell.leader: leadership lost identity=bench-controller"
    doc = {"ts": 1.0, "level": "info", "logger": "gpumon.controller.shell.leader", "msg": "leadership lost"}
    slow = {"level": "warning", "msg": "lease round slower than the renew deadline: holding the lease"}
    lines = [
        text,
        json.dumps(doc),
        "07:00:03 INFO    gpumon.controller.shell.leader: leadership acquired identity=bench-controller",
        json.dumps(slow),
        "07:00:05 WARNING gpumon.controller.shell.leader: lease round failed error=timeout",
        "07:00:06 INFO    gpumon.controller.remediation: node gpu-node-0001 tainted",
    ]
    assert lease_log(lines) == fleet_churn.LeaseLog(lost=2, acquired=1, slow_rounds=1, failed_rounds=1)


def test_pod_lists_are_the_counters_increase_by_reader_and_result() -> None:
    def text(**values: float) -> str:
        lines = ["# TYPE gpumon_controller_pod_lists_total counter"]
        for key, v in values.items():
            reader, result = key.split("__")
            lines.append(f'gpumon_controller_pod_lists_total{{reader="{reader}",result="{result}"}} {v}')
        return "\n".join(lines) + "\n"

    before = text(drain__ok=3)
    after = text(drain__ok=5, scale_down__ok=7, repair__Unreachable=1)
    assert pod_lists(before, after) == {"drain/ok": 2, "scale_down/ok": 7, "repair/Unreachable": 1}
    assert pod_lists("", "") == {}


async def test_the_lease_holder_is_the_replica_whose_gauge_says_so() -> None:
    async def gauge(value: float) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(text=f"gpumon_controller_leader {value}\n")

        return handler

    app = web.Application()
    app.router.add_get("/old/metrics", await gauge(0.0))
    app.router.add_get("/new/metrics", await gauge(1.0))
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        base = str(server.make_url("")).rstrip("/")
        dead = SimpleNamespace(url=base + "/new", running=False)
        old = SimpleNamespace(url=base + "/old", running=True)
        new = SimpleNamespace(url=base + "/new", running=True)
        assert await lease_holder(session, [dead, old, new]) is new  # type: ignore[list-item]


async def test_a_poll_not_answered_in_time_is_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_scale, "LEADER_POLL_TIMEOUT", 0.2)

    async def late(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="gpumon_controller_leader 1.0\n")

    app = web.Application()
    app.router.add_get("/metrics", late)
    async with TestServer(app) as server:
        ctl = SimpleNamespace(url=str(server.make_url("")).rstrip("/"), running=True)
        polls = LeaderPolls()
        await poll_leader(ctl, os.getpid(), time.monotonic() + 1.5, polls)  # type: ignore[arg-type]
    assert polls.samples == [None, None] and polls.rss > 0


def churn(**figures: Any) -> Churn:
    base: dict[str, Any] = dict(
        seconds=1800.0,
        pods_per_second=2.0,
        node_seconds=10.0,
        away_steps=3,
        replica="bench-controller",
        lease_lost=0,
        leader_drops=0,
        polls=1790,
        unanswered=2,
        slowest_poll=2.4,
        slow_rounds=0,
        failed_rounds=1,
        cpu_cores=0.041,
        rss_bytes=300 * 2**20,
        requests_per_second=1.3,
        apiserver_cores=0.9,
        load=9.5,
        pod_lists={"scale_down/ok": 0.0},
        pods_deleted=3600,
        pods_created=3599,
        node_pods_deleted=1800,
        node_pods_created=1770,
        nodes_left=180,
        nodes_joined=177,
        behind=0.8,
    )
    return Churn(**{**base, **figures})


def test_losses_are_the_larger_count_and_the_goal_wants_none_over_30_minutes() -> None:
    assert churn().lease_losses == 0
    assert churn(lease_lost=2, leader_drops=1).lease_losses == 2
    assert churn(lease_lost=0, leader_drops=1).lease_losses == 1  # a log line lost: the gauge still says
    assert fleet_churn.losses_met(churn()) == "yes"
    assert fleet_churn.losses_met(churn(leader_drops=1)) == "**no**"
    assert fleet_churn.losses_met(churn(seconds=120.0)) == "none in 2.0 min, short of 30"
    assert fleet_churn.losses_met(None) == "not measured"
    assert fleet_churn.losses_cell(None) == "—" and fleet_churn.losses_cell(churn(lease_lost=3)) == "3"


def test_the_churn_row_and_a_size_without_churn() -> None:
    row = churn_row(10_000, churn(pod_lists={"scale_down/ok": 90.0, "drain/ok": 0.0}))
    assert row[:6] == (
        "10,000",
        "30 min",
        "3,600, 3,599",
        "180, 177 (1,800, 1,770)",
        "0, 0",
        "2 of 1790 (2.40 s)",
    )
    assert (
        row[8] == "300 MiB" and row[10] == "90 (0.05/s): scale_down/ok 90" and row[-1] == "bench-controller"
    )
    assert churn_row(10_000, churn())[10] == "none"
    assert churn_row(1000, None) == ("1,000", *("—",) * (len(fleet_churn.CHURN_HEADER) - 1))
    grid = churn_grid([(10_000, churn()), (1000, None)], 2.0)
    assert [r[0] for r in grid.rows] == ["1,000", "10,000"]
    assert (
        "2 pods replaced a second, a node leaving and one joining every 10 s (each away 30 s)" in grid.method
    )
    assert "within 2 s" in grid.method


def point(nodes: int) -> scale_curve.Point:
    return scale_curve.Point(
        nodes=nodes,
        cpu_cores=0.05,
        rss_bytes=2e8,
        requests_per_second=1.2,
        fault_to_taint=0.05,
        taint_to_eviction=0.1,
        pending_to_request=1.5,
        restart_synced=5.0,
        restart_decision=12.0,
        load=3.0,
    )


def test_the_curve_table_has_a_lease_losses_column_blank_for_sizes_without_churn() -> None:
    text = table_markdown(scale_curve.curve_grid([point(1000), point(10_000)], {10_000: churn(lease_lost=1)}))
    rows = {x.split(" | ")[0]: x.split(" | ") for x in text.splitlines() if x.startswith("| ")}
    column = rows["| nodes"].index("lease losses (churn, 30 min)")
    assert rows["| 1,000"][column] == "—" and rows["| 10,000"][column] == "1"
    assert rows["| goal at 10,000"][column] == "0 in 30 min"
    assert rows["| met at 10,000"][column] == "**no**"
    none = table_markdown(scale_curve.curve_grid([point(1000)], {}))
    assert "| lease losses (churn) |" in none


def test_curve_records_keep_their_churn_and_earlier_records_load_without_one(tmp_path: Path) -> None:
    cache = (CacheSize("nodes", 500, 500, 1128 * 500, 16388 * 500),)
    with_churn = CurveRecord(point(10_000), ("10,000",), cache, 2715.0, "d2", churn())
    earlier = CurveRecord(point(1000), ("1,000",), cache, 451.0, "d1")
    file = tmp_path / "curve.json"
    controller_scale.save_records(file, {1000: earlier, 10_000: with_churn})
    docs = json.loads(file.read_text())
    del docs[0]["churn"]  # as the records written before the churn phase are
    file.write_text(json.dumps(docs))
    back = load_records(file)
    assert back[10_000].churn == with_churn.churn and back[1000].churn is None
    section = controller_scale.curve_section(back, None)
    assert "lease held while the fleet churns" in section and "| lease losses (churn, 30 min) |" in section


def test_the_checked_in_curve_records_still_load() -> None:
    records = load_records(Path(controller_scale.__file__).parent / "controller-scale-curve.json")
    assert records and all(math.isfinite(r.point.cpu_cores) for r in records.values())
