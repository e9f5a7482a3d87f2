"""The controller scale curve's pure parts: the least-squares fit and where a line meets a goal,
the tables one row per size, the cache's bytes per object, and the test setup's tuning per size."""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import pytest

from bench.cache_bytes import cache_size, deep_size, stream_size
from bench.controller_scale import FULL, control_plane_options, leader_change_fits, lease_seconds
from bench.report import table_markdown
from bench.scale_curve import (
    MIB,
    Point,
    cache_grid,
    curve_grid,
    first_to_run_out,
    fit_grid,
    fits,
    least_squares,
)
from bench.scale_fleet import node_manifest
from bench.signal_farm import node_snapshot
from gpumon.controller.core.objects import node_from_json
from gpumon.wire import v1 as wire

pytestmark = pytest.mark.unit


def point(nodes: int, **figures: float) -> Point:
    base = dict(
        cpu_cores=0.01 + nodes * 2e-5,
        rss_bytes=100e6 + nodes * 50e3,
        requests_per_second=1.2,
        fault_to_taint=0.05,
        taint_to_eviction=0.08,
        pending_to_request=2.0,
        restart_synced=1.0 + nodes * 1e-3,
        restart_decision=2.0 + nodes * 2e-3,
        load=3.0,
    )
    return Point(nodes=nodes, **{**base, **figures})


def test_least_squares_line_and_residuals() -> None:
    fit = least_squares([1, 2, 3], [1, 3, 2])
    assert fit is not None
    assert fit.slope == pytest.approx(0.5) and fit.intercept == pytest.approx(1.0)
    assert fit.residuals == pytest.approx((-0.5, 1.0, -0.5))
    assert fit.sizes == (1, 2, 3)
    assert fit.at(5) == pytest.approx(3.5)


def test_least_squares_recovers_an_exact_line() -> None:
    fit = least_squares([1000, 2000, 5000, 10_000], [0.01 + n * 2e-5 for n in (1000, 2000, 5000, 10_000)])
    assert fit is not None
    assert fit.slope == pytest.approx(2e-5) and fit.intercept == pytest.approx(0.01)
    assert max(map(abs, fit.residuals)) < 1e-12


def test_sizes_not_measured_are_left_out_and_one_size_is_no_fit() -> None:
    fit = least_squares([1, 2, 3], [1, math.nan, 3])
    assert fit is not None and fit.sizes == (1, 3) and fit.slope == pytest.approx(1.0)
    assert least_squares([1, 2], [1, math.nan]) is None
    assert least_squares([5, 5], [1, 2]) is None


def test_where_a_line_reaches_a_goal() -> None:
    fit = least_squares([0, 10_000], [0.05, 0.15])
    assert fit is not None
    assert fit.crossing(0.25) == pytest.approx(20_000)
    assert fit.crossing(0.01) == 0.0  # already there with no nodes
    flat = least_squares([0, 10_000], [0.05, 0.05])
    assert flat is not None and math.isinf(flat.crossing(0.25))


def test_the_first_resource_to_run_out() -> None:
    # CPU reaches 0.1 core at 4,500 nodes; RSS 400 MiB at ~6,400; restart 15 s at 6,500.
    points = [point(n, rss_bytes=100e6 + n * 50e3) for n in (1000, 2000, 5000)]
    points = [replace(p, restart_decision=2.0 + p.nodes * 2e-3) for p in points]
    assert fits(points)["RSS"].crossing(400 * MIB) == pytest.approx((400 * MIB - 100e6) / 50e3)  # type: ignore[union-attr]
    label, nodes = first_to_run_out(points) or ("", 0.0)
    assert label == "steady CPU (cores)" and nodes == pytest.approx(4_500)
    assert first_to_run_out([point(1000)]) is None


def test_curve_table_one_row_per_size_with_the_goals_at_10000() -> None:
    points = [point(10_000, cpu_cores=0.3), point(1000), point(2000)]
    text = table_markdown(curve_grid(points, {}))
    lines = [x for x in text.splitlines() if x.startswith("| ")]
    assert lines[0].startswith("| nodes | GPUs | pods | steady CPU (cores) | RSS |")
    assert [x.split(" | ")[0] for x in lines[2:5]] == ["| 1,000", "| 2,000", "| 10,000"]
    assert lines[4].startswith("| 10,000 | 80,000 | 100,000 | 0.300 | 572 MiB |")
    assert "≤ 0.1 core | ≤ 400 MiB" in lines[5] and "≤ 2 s" in lines[5] and "≤ 15 s" in lines[5]
    met = lines[6].split(" | ")
    assert met[0] == "| met at 10,000" and met[3:5] == ["**no**", "**no**"]
    # Without a 10,000-node row nothing is claimed met.
    assert "met at" not in table_markdown(curve_grid([point(1000), point(2000)], {}))


def test_fit_table_says_the_form_the_residuals_and_65000() -> None:
    text = table_markdown(fit_grid([point(1000), point(2000), point(5000, cpu_cores=0.2)]))
    cpu = next(x for x in text.splitlines() if x.startswith("| steady CPU"))
    assert "y = a + b × nodes" in text and "per pod (b / 10)" in text
    cells = cpu.split(" | ")
    assert "1,000: " in cells[4] and "5,000: " in cells[4]
    assert cells[7].endswith("nodes |") or cells[7].endswith("nodes")
    falling = table_markdown(fit_grid([point(1000, fault_to_taint=0.09), point(2000, fault_to_taint=0.03)]))
    taint = next(x for x in falling.splitlines() if x.startswith("| fault → taint")).split(" | ")
    assert taint[5] == "below 0: the line falls" and taint[7].startswith("never")
    one = table_markdown(fit_grid([point(1000)]))
    assert "fewer than 2 sizes" in one


def kwok_node(name: str) -> dict[str, object]:
    """A node as the API server returns it after kwok took it: managed fields and status."""
    node = node_manifest(name)
    node["metadata"] = {
        **node["metadata"],
        "uid": "0f0e7a9c-4a1b-4c3d-9e8f-0123456789ab",
        "resourceVersion": "123456",
        "creationTimestamp": "2026-11-24T08:00:00Z",
        "managedFields": [
            {"manager": "kwok", "operation": "Update", "fieldsV1": {"f:status": {"f:conditions": {}}}},
        ],
    }
    node["status"] = {
        **node.get("status", {}),
        "conditions": [
            {"type": t, "status": "False", "reason": "KubeletHasNoPressure", "message": "fine"}
            for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
        ],
        "nodeInfo": {"kubeletVersion": "fake", "architecture": "amd64", "operatingSystem": "linux"},
    }
    return node


def test_deep_size_counts_a_shared_object_once() -> None:
    shared = "x" * 1000
    one, two = {"a": shared}, {"b": shared}
    assert deep_size([one, two]) == deep_size([one]) + deep_size([two]) - sys.getsizeof(shared)
    assert deep_size([one, one]) == deep_size([one])
    assert deep_size([]) == 0


def test_cache_bytes_of_views_beside_whole_objects() -> None:
    nodes = [kwok_node(f"gpu-node-{i:04d}") for i in range(20)]
    node_size = cache_size("nodes", nodes, node_from_json)
    assert (node_size.listed, node_size.kept) == (20, 20)
    assert 0 < node_size.view_per_object < node_size.full_per_object
    assert node_size.ratio == pytest.approx(node_size.full_bytes / node_size.view_bytes)
    text = table_markdown(cache_grid([node_size], 20))
    assert "| nodes | 20 | 20 |" in text


def test_stream_bytes_of_kept_readings_beside_the_wire_models() -> None:
    now = 1_700_000_000.0
    names = [f"gpu-node-{i:04d}" for i in range(5)]
    lines = [
        wire.encode(wire.state_line(node_snapshot(n, i, 8, now), node=n, now=now))
        for i, n in enumerate(names)
    ]
    beat = wire.encode(wire.heartbeat_line(node=names[0], at=now))
    size = stream_size([*lines, beat], now)
    assert (size.listed, size.kept) == (40, 40), "a GPU each; the heartbeat holds none"
    # Keeping the parsed models would hold several times more: the regression this row shows.
    assert size.ratio > 3


def test_the_curve_holds_lease_renewals_to_100_a_second() -> None:
    assert lease_seconds(1000) == 40  # the kubelet's
    assert lease_seconds(10_000) == 400
    assert all(4 * n / lease_seconds(n) <= 100 for n in (200, 1000, 2000, 5000, 10_000, 65_000))
    curve = control_plane_options(replace(FULL, nodes=10_000, restart=True))
    assert curve.node_lease_duration_seconds == 400
    assert curve.node_monitor_grace_period_seconds == 800
    assert curve.etcd_flags == ("--quota-backend-bytes=8589934592",)
    single = control_plane_options(FULL)  # the single point keeps its measured setup
    assert (single.node_lease_duration_seconds, single.node_monitor_grace_period_seconds) == (40, 300)
    assert single.etcd_flags == ()


def test_a_leader_change_runs_only_where_two_replicas_streams_fit() -> None:
    assert leader_change_fits(5000, 20_000)  # 10,000 streams and head-room
    assert not leader_change_fits(10_000, 20_000)  # 20,000 streams: the farm would run out
    assert leader_change_fits(9_500, 20_000) and not leader_change_fits(9_501, 20_000)


def test_the_leader_change_column_is_blank_where_it_did_not_run() -> None:
    text = table_markdown(curve_grid([point(1000, leader_change_decision=17.5), point(10_000)], {}))
    rows = {x.split(" | ")[0]: x.split(" | ") for x in text.splitlines() if x.startswith("| ")}
    header = rows["| nodes"]
    column = header.index("leader change → first correct decision")
    assert rows["| 1,000"][column] == "17.5 s" and rows["| 10,000"][column] == "—"
