"""The stream-costs bench's pure parts: the medians per period, the table, the window's check."""

from __future__ import annotations

import pytest

from bench.report import table_markdown
from bench.stream_costs import BEFORE_SECONDS, Turn, grid, medians, whole_periods

pytestmark = pytest.mark.unit


def turn(heartbeat: float, steady_cpu: float, setup_cpu: float = 7.0) -> Turn:
    return Turn(
        heartbeat=heartbeat,
        nodes=1_000,
        setup_wall=2.0,
        setup_cpu=setup_cpu,
        farm_setup_cpu=5.0,
        held_bytes=25 * 1024 * 1_000,
        window=60.0,
        steady_cpu=steady_cpu,
    )


def test_medians_are_per_stream_per_node_and_per_heartbeat():
    m = medians(
        [turn(10.0, 6.0, setup_cpu=0.7), turn(10.0, 3.0, setup_cpu=0.9), turn(10.0, 4.5, setup_cpu=0.8)]
    )
    assert m.setup_cpu_per_stream == pytest.approx(0.8e-3)
    assert m.farm_cpu_per_stream == pytest.approx(5e-3)
    assert m.held_per_node == pytest.approx(25 * 1024)
    assert m.steady_cores == pytest.approx(4.5 / 60)
    # 1,000 streams, a heartbeat each every 10 s, over 60 s: 6,000 heartbeats.
    assert m.per_line == pytest.approx(4.5 / 6_000)


def test_the_grid_sets_the_old_period_beside_the_default_with_their_ratio():
    turns = [turn(BEFORE_SECONDS, 6.0), turn(20.0, 3.0), turn(BEFORE_SECONDS, 6.0), turn(20.0, 3.0)]
    g = grid(turns, 1_000, 20.0)
    rows = {r[0]: r[1:] for r in g.rows}
    assert rows["steady: controller CPU, heartbeats only (cores)"] == ("0.100", "0.050", "2.0×")
    # Half the CPU for half the heartbeats: the same cost a heartbeat.
    assert rows["steady: controller CPU a heartbeat"] == ("1000 µs", "1000 µs", "1.0×")
    assert rows["held: RSS a node (the stream and its readings)"][:2] == ("25.0 KiB", "25.0 KiB")
    assert "heartbeat 20 s (default)" in table_markdown(g)


def test_a_window_must_hold_whole_periods():
    whole_periods(60.0, (10.0, 20.0))
    with pytest.raises(ValueError, match="not a whole number of 20 s heartbeats"):
        whole_periods(50.0, (10.0, 20.0))
