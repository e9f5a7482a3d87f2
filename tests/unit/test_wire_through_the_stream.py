"""A value the exporter sends reaches the controller's policy unchanged, through the real HTTP
stream: the exporter app (simulated GPUs, faults injected through the simulated backend's API)
on a real port, the controller's real DirectSource reading its /api/v1/watch, and
policy.evaluate_node judging the reading it produces."""

from __future__ import annotations

import time
from dataclasses import replace

from aiohttp.test_utils import TestServer
from controller_fakes import load_rules
from direct_harness import base_url, running_source, wait_for

from gpumon.config import ExporterConfig, HealthConfig, SamplingConfig
from gpumon.controller.core.policy import EMPTY_NODE_STATE, Policy, evaluate_node
from gpumon.controller.core.signals import NodeReading, XidSeen
from gpumon.controller.shell.signal_sources.direct import DirectSettings, DirectSource
from gpumon.devices.simulated import SimulatedBackend, parse_fault
from gpumon.exporter.server import make_app
from gpumon.gpu.health import HealthPolicy, Severity
from gpumon.gpu.model import HealthState

# The backend's clock runs two minutes behind the exporter's: an Xid keeps the backend's time,
# and the exporter's 60 s window (its own verdict) no longer decides what the controller does.
BACKEND_LAG_SECONDS = 120.0

RULES = [
    {
        "name": "ecc-exactly-3",
        "signal": "ecc_uncorrectable",
        "op": "==",
        "threshold": 3,
        "severity": "unhealthy",
    },
    {"name": "at-98", "signal": "temperature", "op": "==", "threshold": 98, "severity": "degraded"},
    {"name": "xid-unhealthy", "signal": "xid", "severity": "unhealthy"},
]


async def test_ecc_count_temperature_and_a_timed_xid_reach_the_policy_unchanged() -> None:
    backend = SimulatedBackend(4, seed=7, clock=lambda: time.time() - BACKEND_LAG_SECONDS)
    config = ExporterConfig(
        node_name="n1",
        backend="simulated",
        sampling=SamplingConfig(fast_interval_seconds=0.1, slow_interval_seconds=0.1, call_timeout_seconds=5),
        health=HealthConfig(xid_window_seconds=60),
    )
    server = TestServer(make_app(config, backend), port=0)
    await server.start_server()
    try:
        async with running_source({"n1": base_url(server)}, DirectSettings(heartbeat_seconds=0.2)) as source:
            await wait_for(lambda: _reading(source) is not None, "the exporter heard")
            backend.inject(parse_fault({"gpu": 0, "fault": "ecc", "count": 3}))
            backend.inject(parse_fault({"gpu": 1, "fault": "overheat", "celsius": 98}))
            backend.inject(parse_fault({"gpu": 2, "fault": "xid", "code": 79}))
            xid_at = backend.status().injected[-1].at  # the backend's own time for the event

            def arrived() -> bool:
                r = _reading(source)
                return (
                    r is not None
                    and r.gpus[0].ecc_uncorrectable == 3
                    and r.gpus[1].temperature_celsius == 98
                    and any(x.code == 79 for x in r.gpus[2].xids or ())
                )

            await wait_for(arrived, "the three values, pushed")
            reading = _reading(source)
            assert reading is not None
            ecc, hot, xid = reading.gpus[0], reading.gpus[1], reading.gpus[2]
            assert ecc.ecc_uncorrectable == 3 and hot.temperature_celsius == 98.0
            assert xid.xids == (XidSeen(79, xid_at),), "the backend's timestamp, exactly"
            assert xid_at < time.time() - BACKEND_LAG_SECONDS + 1
            assert xid.health is not None and xid.health.state is HealthState.HEALTHY, (
                "outside the exporter's own 60 s window: its verdict says healthy"
            )
            assert not source.errors

            policy = Policy(
                rules=load_rules(builtin=False, inline=RULES), health=HealthPolicy(xid_window_seconds=600)
            )
            ev = evaluate_node("n1", {}, reading, EMPTY_NODE_STATE, reading.observed_at, policy)
            fired = {g.index: [(f.rule, f.reason, f.evidence) for f in g.findings] for g in ev.verdict.gpus}
            assert fired == {
                0: [
                    ("ecc-exactly-3", "EccUncorrectable", "uncorrectable ECC errors 3 == 3"),
                    ("xid-unhealthy", "EccUncorrectable", "Xid 48"),  # the ECC fault's own Xid
                ],
                1: [("at-98", "Thermal", "temperature 98 C == 98 C")],
                2: [("xid-unhealthy", "XidFatal", "Xid 79")],
            }
            assert ev.verdict.severity is Severity.UNHEALTHY
            # The controller's window, not the exporter's: 601 s after the event it is over.
            late = policy.health.xid_window_seconds + 1
            later = evaluate_node(
                "n1", {}, _aged(reading, xid_at + late), EMPTY_NODE_STATE, xid_at + late, policy
            )
            assert 2 not in {g.index for g in later.verdict.gpus}
    finally:
        await server.close()


def _reading(source: DirectSource) -> NodeReading | None:
    r = source.current().nodes.get("n1")
    return r if isinstance(r, NodeReading) and len(r.gpus) == 4 else None


def _aged(reading: NodeReading, at: float) -> NodeReading:
    """The same values, confirmed (by heartbeats) up to ``at``."""
    return replace(reading, observed_at=at, gpus=tuple(replace(g, observed_at=at) for g in reading.gpus))
