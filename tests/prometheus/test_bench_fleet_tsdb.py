"""``python -m bench fleet-65k``'s TSDB on a tiny fleet: promtool takes the OpenMetrics text, and
the controller's own Prometheus source reads from it the verdicts the model's readings give."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
from bench_fleet import TINY, verdicts
from conftest import PrometheusProcess

from bench.fleet_model import SCRAPES, marks, readings
from bench.fleet_prometheus import build_tsdb
from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.shell.signal_sources.prometheus import PrometheusSettings, PrometheusSource


async def test_the_controllers_source_reads_back_the_models_verdicts(tmp_path: Path) -> None:
    at = float(int(time.time()))
    cost = build_tsdb(TINY, marks(TINY), at, tmp_path / "data", part_nodes=TINY.nodes)
    assert cost.series > 0 and cost.parts == 1
    server = PrometheusProcess(tmp_path)
    try:
        server.start()
        policy = build_policy(ControllerConfig())
        async with aiohttp.ClientSession() as session:
            source = PrometheusSource(
                PrometheusSettings(server.url), policy.rules, session, wall_clock=lambda: at
            )
            await source.poll_once()
        got = dict(source.current().nodes)
    finally:
        server.stop()
    want = {r.node: r for r in readings(TINY, marks(TINY), at + SCRAPES[-1])}
    assert verdicts(got, at) == verdicts(want, at)
