"""The controller's Prometheus signal source against a real Prometheus scraping real
``gpumon exporter --backend simulated`` processes, judged by the controller's own policy.

- GPUs broken through the exporters' fault endpoint come back through PromQL as readings of the
  right node and GPU, and policy turns them into the right verdicts (and nothing for an
  informational Xid or the healthy node);
- an exporter killed mid-fault: Prometheus marks its target down and its series stale, the node
  becomes unknown, and no verdict that acts comes out, however long past the rule's ``for``;
- Prometheus stopped: the source reports itself unavailable, its last readings age into stale
  (unknown), and it recovers by itself when Prometheus comes back.

The module runs its own Prometheus (it stops and restarts it) and three exporters; the tests
run in file order on that shared fleet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from conftest import SOURCE_JOB as JOB
from conftest import ExporterProcess, PrometheusProcess, http_get, scraping, simulated_exporters

from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core.policy import EMPTY_NODE_STATE, NodeRuleState, Policy, evaluate_node
from gpumon.controller.core.signals import FleetSignals
from gpumon.controller.core.verdicts import NodeVerdict, SignalStatus
from gpumon.controller.shell.signal_sources.prometheus import PrometheusSettings, PrometheusSource
from gpumon.gpu.health import Severity
from gpumon.gpu.model import RecoveryAction
from gpumon.wire import v1 as wire

BROKEN, HOT, KILLED = "prom-sig-broken", "prom-sig-hot", "prom-sig-killed"
NODES = (BROKEN, HOT, KILLED)
GPUS = 2
HOLD_SECONDS = 3.0  # the thermal rule's `for`
STALE_AFTER_SECONDS = 5.0
DEADLINE_SECONDS = 90.0  # Prometheus scrapes every second; other work shares the 2 cores
ROUND_PAUSE_SECONDS = 0.2  # between the source's rounds while waiting for a scrape


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ExporterProcess]]:
    with simulated_exporters(tmp_path_factory, NODES, GPUS) as out:
        yield out


@pytest.fixture(scope="module")
def prom(
    tmp_path_factory: pytest.TempPathFactory, fleet: dict[str, ExporterProcess]
) -> Iterator[PrometheusProcess]:
    """A Prometheus of this module's own: the last test stops and restarts it."""
    with scraping(
        tmp_path_factory, "prometheus-signals", fleet, "count(gpumon_gpu_info)", GPUS * len(NODES)
    ) as server:
        yield server


@pytest.fixture(scope="module")
def policy() -> Policy:
    """The built-in rules through the controller's own config path, the thermal one held for
    HOLD_SECONDS (instead of a minute) so the test can watch a `for` run."""
    config = ControllerConfig.model_validate(
        {
            "signals": {"stale_after_seconds": STALE_AFTER_SECONDS},
            "policy": {"rules": [{"name": "thermal-unhealthy", "for": HOLD_SECONDS}]},
        }
    )
    return build_policy(config)


def uuids(exporter: ExporterProcess) -> list[str]:
    status, body = http_get(exporter.url + "/api/v1/snapshot")
    assert status == 200, body
    return [g.identity.uuid for g in wire.parse_snapshot(body).gpus]


class Judge:
    """The source's latest fleet judged the way the reconciler judges it, state kept per node."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.states: dict[str, NodeRuleState] = {}

    def __call__(self, fleet: FleetSignals, node: str, now: float | None = None) -> NodeVerdict:
        ev = evaluate_node(
            node,
            {},
            fleet.nodes.get(node),
            self.states.get(node, EMPTY_NODE_STATE),
            time.time() if now is None else now,
            self.policy,
        )
        self.states[node] = ev.state
        return ev.verdict


@dataclass
class Reader:
    """The controller's Prometheus source, and the results of its rounds (what the app counts
    in ``gpumon_controller_signal_rounds_total``)."""

    src: PrometheusSource
    rounds: list[bool] = field(default_factory=list)

    async def poll_until(
        self, done: Callable[[FleetSignals], bool], what: str, seconds: float = DEADLINE_SECONDS
    ) -> FleetSignals:
        """Run rounds (what the source's ``run`` loop does, minus the interval) until ``done``."""
        deadline = time.monotonic() + seconds
        while True:
            await self.src.poll_once()
            fleet = self.src.current()
            if done(fleet):
                return fleet
            if time.monotonic() > deadline:
                raise AssertionError(f"not {what} after {seconds:.0f} s; last readings: {dict(fleet.nodes)}")
            await asyncio.sleep(ROUND_PAUSE_SECONDS)


@pytest.fixture
async def reader(prom: PrometheusProcess, policy: Policy) -> AsyncIterator[Reader]:
    rounds: list[bool] = []
    async with aiohttp.ClientSession() as session:
        settings = PrometheusSettings(prom.url, timeout_seconds=5, retries=1)
        on_round = lambda ok, seconds: rounds.append(ok)  # noqa: E731
        yield Reader(PrometheusSource(settings, policy.rules, session, on_round=on_round), rounds)


async def test_broken_gpus_get_the_right_verdicts_on_the_right_nodes(
    fleet: dict[str, ExporterProcess], reader: Reader, policy: Policy
) -> None:
    judge = Judge(policy)
    broken, hot = uuids(fleet[BROKEN]), uuids(fleet[HOT])
    fault_at = time.time()
    fleet[BROKEN].inject({"gpu": 1, "fault": "xid", "code": 79})
    fleet[HOT].inject({"gpu": 0, "fault": "overheat", "celsius": 97})
    fleet[HOT].inject({"gpu": 1, "fault": "xid", "code": 13})  # informational: no action

    def xid_seen(f: FleetSignals) -> bool:
        r = f.nodes.get(BROKEN)  # read as a whole (no GPUs listed) until the fault shows
        return r is not None and r.gpus_read and any(x.code == 79 for x in r.gpus[1].xids or ())

    fleet_now = await reader.poll_until(xid_seen, "Xid 79 read back")
    v = judge(fleet_now, BROKEN)
    fault_to_verdict = time.time() - fault_at
    assert v.signals is SignalStatus.FRESH and v.severity is Severity.UNHEALTHY
    (gpu,) = v.gpus
    assert (gpu.uuid, gpu.index) == (broken[1], 1)
    assert [(f.rule, f.reason, f.evidence) for f in gpu.findings] == [("xid-unhealthy", "XidFatal", "Xid 79")]
    print(f"\nfault -> verdict through Prometheus (1 s scrapes): {fault_to_verdict:.2f} s")

    def hot_seen(f: FleetSignals) -> bool:
        r = f.nodes.get(HOT)
        return (
            r is not None
            and r.gpus_read
            and (r.gpus[0].temperature_celsius or 0) >= 95
            and any(x.code == 13 for x in r.gpus[1].xids or ())
        )

    first_hot = await reader.poll_until(hot_seen, "97 C and Xid 13 read back")
    pending = judge(first_hot, HOT)
    assert pending.signals is SignalStatus.FRESH and pending.severity is None, "fired before its `for`"
    first_at = first_hot.nodes[HOT].observed_at

    def held(f: FleetSignals) -> bool:
        r = f.nodes.get(HOT)
        return r is not None and r.observed_at >= first_at + HOLD_SECONDS

    v = judge(await reader.poll_until(held, f"{HOLD_SECONDS} s of hot readings"), HOT)
    assert v.severity is Severity.UNHEALTHY
    (gpu,) = v.gpus  # GPU 1's Xid 13 is informational
    assert (gpu.uuid, gpu.index, gpu.findings[0].rule, gpu.findings[0].reason) == (
        hot[0],
        0,
        "thermal-unhealthy",
        "Thermal",
    )
    quiet = judge(reader.src.current(), KILLED)
    assert quiet.signals is SignalStatus.FRESH and quiet.severity is None and quiet.gpus == ()
    assert all(reader.rounds)


async def test_the_drivers_recovery_action_reaches_the_policy_through_prometheus(
    fleet: dict[str, ExporterProcess], reader: Reader, policy: Policy
) -> None:
    judge = Judge(policy)
    fleet[HOT].inject({"gpu": 1, "fault": "recovery_action", "action": "drain_and_reset"})
    uuid = uuids(fleet[HOT])[1]

    def action_seen(f: FleetSignals) -> bool:
        r = f.nodes.get(HOT)
        g = r.gpu(uuid) if r is not None else None
        return g is not None and g.recovery_action is RecoveryAction.DRAIN_AND_RESET

    fleet_now = await reader.poll_until(action_seen, "the recovery action read back")
    quiet = fleet_now.nodes[BROKEN].gpus[0]
    assert quiet.recovery_action is RecoveryAction.NONE, "the simulator's driver reports NONE"
    v = judge(fleet_now, HOT)
    found = {g.uuid: g.findings for g in v.gpus}
    assert [(f.rule, f.reason, f.evidence) for f in found[uuid]] == [
        ("recovery-action", "RecoveryDrainAndReset", "driver recovery action DRAIN_AND_RESET")
    ]


async def test_a_killed_exporter_is_unknown_and_never_acted_on(
    prom: PrometheusProcess, fleet: dict[str, ExporterProcess], reader: Reader, policy: Policy
) -> None:
    judge = Judge(policy)
    victim = fleet[KILLED]
    victim.inject({"gpu": 0, "fault": "overheat", "celsius": 99})

    def hot_seen(f: FleetSignals) -> bool:
        r = f.nodes.get(KILLED)
        return r is not None and r.gpus_read and (r.gpus[0].temperature_celsius or 0) >= 95

    v = judge(await reader.poll_until(hot_seen, "the fault read back"), KILLED)
    assert v.signals is SignalStatus.FRESH and v.severity is None  # pending: the `for` runs
    assert judge.states[KILLED].targets, "the rule is pending"
    assert victim.child is not None
    victim.child.process.kill()  # dies mid-fault, before the rule's `for` is over
    victim.child.process.wait(timeout=30)
    prom.wait_for(
        f'up{{instance="{victim.target}"}} == 0', timeout=DEADLINE_SECONDS
    )  # Prometheus marks the target down ...
    (target,) = [t for t in prom.api("targets")["activeTargets"] if t["labels"]["instance"] == victim.target]
    assert target["health"] == "down"
    # ... and its series stale: they drop out of instant queries, so the node has no reading.
    fleet_now = await reader.poll_until(lambda f: KILLED not in f.nodes, "the dead node's series gone")
    assert BROKEN in fleet_now.nodes and HOT in fleet_now.nodes
    now = time.time()
    for later in (0.0, HOLD_SECONDS, 10 * HOLD_SECONDS, 3600.0):  # time is a parameter
        v = judge(fleet_now, KILLED, now + later)
        assert v.signals is SignalStatus.MISSING and v.severity is None and v.findings == (), later


async def test_prometheus_down_means_unavailable_then_stale_and_it_recovers(
    prom: PrometheusProcess, fleet: dict[str, ExporterProcess], reader: Reader, policy: Policy
) -> None:
    judge = Judge(policy)
    before = await reader.poll_until(lambda f: f.source_up and BROKEN in f.nodes, "readings")
    assert judge(before, BROKEN).severity is Severity.UNHEALTHY
    prom.stop()
    assert list(await reader.src.poll_once()) == []
    down = reader.src.current()
    assert not down.source_up and reader.rounds[-1] is False
    assert down.nodes[BROKEN] == before.nodes[BROKEN], "the last readings are kept, to age"
    # The same reading once it is older than stale_after: unknown, and a firing rule is held,
    # not acted on and not recovered.
    later = max(r.observed_at for r in down.nodes.values()) + STALE_AFTER_SECONDS + 1
    v = judge(down, BROKEN, later)
    assert v.signals is SignalStatus.STALE and v.severity is Severity.UNHEALTHY
    assert judge(down, HOT, later).signals is SignalStatus.STALE

    restarted = time.time()
    prom.start(prom.config({JOB: [p.target for p in fleet.values()]}))  # same port, same data
    # Until its first scrape, the restarted Prometheus answers with the values from before the
    # stop: their timestamps say how old they are.
    back = await reader.poll_until(
        lambda f: f.source_up and BROKEN in f.nodes and f.nodes[BROKEN].observed_at > restarted,
        "readings scraped after the restart",
    )
    recovery = time.time() - restarted
    v = judge(back, BROKEN)
    assert v.signals is SignalStatus.FRESH and v.severity is Severity.UNHEALTHY
    assert reader.rounds[-1] is True
    print(f"\nPrometheus restart -> fresh readings again: {recovery:.2f} s")
