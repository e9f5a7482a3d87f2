"""The repair loop's shell (gpumon/controller/shell/repair_loop.py) on a recording fake API:
what dry-run, a standby and the leader write. The real control plane runs the whole ladder in
tests/cluster/test_repair_ladder.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import aiohttp
from controller_fakes import FakeKube, StaticSource, load_rules
from prometheus_client import CollectorRegistry

from gpumon.config.controller import ControllerConfig
from gpumon.config.pools import PoolConfig
from gpumon.controller.act.events import EventRecorder
from gpumon.controller.act.evict import Evictor
from gpumon.controller.act.retry import DEFAULT_RETRY
from gpumon.controller.app import _build_source
from gpumon.controller.configure import build_policy, pool_from_config
from gpumon.controller.core import contract as c
from gpumon.controller.core.breaker import SafetyPolicy
from gpumon.controller.core.contract.breakers import BreakerTrip
from gpumon.controller.core.contract.node import GpuRecord, records_to_json
from gpumon.controller.core.contract.repair import (
    Attempt,
    AttemptOutcome,
    LadderStep,
    RepairRecord,
    record_from_json,
    record_to_json,
)
from gpumon.controller.core.objects import GpuResources, node_from_json, to_rfc3339
from gpumon.controller.core.policy import Policy
from gpumon.controller.core.signals import GpuReading, NodeReading
from gpumon.controller.shell.metrics import ControllerMetrics
from gpumon.controller.shell.node_pods import NodePods
from gpumon.controller.shell.repair_loop import RepairLoop, RepairSettings
from gpumon.controller.shell.repair_metrics import RepairMetrics
from gpumon.controller.shell.signal_sources.prometheus import PrometheusSource
from gpumon.gpu.health import Severity
from gpumon.gpu.model import HealthReason, HealthState, HealthVerdict, RecoveryAction
from gpumon.kube.client import KubeError
from gpumon.kube.informer import Selection, View
from gpumon.kube.registry import Informers

T = 1_800_000_000.0
NS = "gpumon-system"
POLICY = Policy(rules=load_rules(), stale_after_seconds=30)
JOB = {"template": {"spec": {"containers": [{"name": "step", "image": "cuda:12"}]}}}
POOL_CONFIG = {
    "name": "h100",
    "target": {"namespace": "capi", "name": "h100"},
    "node_selector": "pool=h100",
    "template": {"resources": {"nvidia.com/gpu": 8}},
    "max_replicas": 2,
    "repair": {"reset_job": JOB, "reboot_job": JOB},
}
POOL = pool_from_config(PoolConfig.model_validate(POOL_CONFIG))


def world(
    *,
    dry_run: bool,
    leader: bool = True,
    annotations: dict[str, str] | None = None,
    action: RecoveryAction = RecoveryAction.GPU_RESET,
    listed: Sequence[dict[str, Any]] | None = (),
    safety: SafetyPolicy | None = None,
    breakers: dict[str, BreakerTrip] | None = None,
) -> tuple[FakeKube, RepairLoop]:
    api = FakeKube()
    api.creatable.add(f"/apis/batch/v1/namespaces/{NS}/jobs")
    informers = Informers()
    nodes: View[Any] = informers.informer(Selection("/api/v1/nodes")).view(node_from_json, name="nodes")
    record = GpuRecord("GPU-1", 1, "RecoveryGpuReset", Severity.UNHEALTHY, ("recovery-action",), T - 60, "")
    obj = api.add(
        "/api/v1/nodes/n1",
        {
            "metadata": {
                "name": "n1",
                "labels": {"pool": "h100"},
                "annotations": {
                    c.ANNOTATION_QUARANTINED_AT: to_rfc3339(T - 60),
                    c.ANNOTATION_UNHEALTHY_GPUS: records_to_json((record,)),
                    **(annotations or {}),
                },
            },
            "spec": {},
            "status": {},
        },
    )
    nodes.update_local("n1", node_from_json(obj), obj["metadata"]["resourceVersion"])
    source = StaticSource()
    bad = HealthVerdict(HealthState.UNHEALTHY, (HealthReason("RecoveryGpuReset", "", HealthState.UNHEALTHY),))
    gpu = GpuReading("GPU-1", 1, T, recovery_action=action, health=bad)
    # Every pod of the node, as the API lists it (None: the list fails).
    for pod in listed or ():
        api.add(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}", pod)
    if listed is None:
        api.hooks[("GET", "/api/v1/pods")] = lambda params: _refuse()
    source.nodes["n1"] = NodeReading("n1", T, (gpu,))
    evictor = Evictor(api, DEFAULT_RETRY)
    loop = RepairLoop(
        api=api,
        pools=[POOL],
        nodes=nodes,
        node_pods=NodePods(api, GpuResources(), evictor),
        source=source,
        recorder=EventRecorder(api, instance="t", wall_clock=lambda: T),
        evictor=evictor,
        is_leader=lambda: leader,
        safety=lambda: safety or SafetyPolicy(),
        open_breakers=lambda: breakers or {},
        metrics=RepairMetrics(CollectorRegistry()),
        settings=RepairSettings(
            policy=Policy(rules=load_rules(), stale_after_seconds=30), namespace=NS, dry_run=dry_run
        ),
        wall_clock=lambda: T,
    )
    return api, loop


def _refuse() -> None:
    raise KubeError(403, "Forbidden", 'pods is forbidden: cannot list resource "pods"')


def events(api: FakeKube) -> list[dict[str, Any]]:
    return [body for method, path, body in api.calls if method == "POST" and path.endswith("/events")]


async def test_dry_run_tells_the_step_and_writes_nothing() -> None:
    api, loop = world(dry_run=True)
    await loop.round()
    (told,) = events(api)
    assert told["reason"] == "GpuRepairStarted" and told["message"].startswith("[dry-run] reset started")
    assert [c for c in api.writes() if not c[1].endswith("/events")] == [], "no record, no Job"


async def test_the_leader_writes_the_record_then_the_job_and_a_standby_nothing() -> None:
    api, loop = world(dry_run=False)
    await loop.round()
    writes = [(m, p) for m, p, _ in api.writes() if not p.endswith("/events")]
    assert writes == [("PATCH", "/api/v1/nodes/n1"), ("POST", f"/apis/batch/v1/namespaces/{NS}/jobs")]
    record = record_from_json(api.objects["/api/v1/nodes/n1"]["metadata"]["annotations"][c.ANNOTATION_REPAIR])
    assert record.running is not None and record.running.number == 1
    # The next round finds its Job: no second one, no second record.
    await loop.round()
    assert len([w for w in api.writes() if not w[1].endswith("/events")]) == 2
    standby_api, standby = world(dry_run=False, leader=False)
    await standby.round()
    assert [w for w in standby_api.writes() if not w[1].endswith("/events")] == []


def _failed_reset() -> dict[str, str]:
    attempt = Attempt(
        LadderStep.RESET,
        1,
        ("GPU-1",),
        T - 50,
        AttemptOutcome.FAILED,
        ended_at=T - 10,
        detail="its Job failed",
    )
    return {c.ANNOTATION_REPAIR: record_to_json(RepairRecord((attempt,)))}


async def test_the_next_step_of_a_ladder_is_not_counted_again_but_an_open_breaker_holds_it() -> None:
    # One node in the pool and a breaker limit of one: the ladder's first step was its one
    # disruption; its escalation to a reboot must not count as a second and trip the breaker.
    api, loop = world(dry_run=False, annotations=_failed_reset(), safety=SafetyPolicy(breaker_min_nodes=1))
    await loop.round()
    posted = [b for m, p, b in api.calls if m == "POST" and p.endswith("/jobs")]
    assert [j["metadata"]["labels"][c.LABEL_REPAIR_STEP] for j in posted] == ["reboot"]
    trip = {"h100": BreakerTrip("h100", T - 600, "a person said so")}
    api, loop = world(dry_run=False, annotations=_failed_reset(), breakers=trip)
    await loop.round()
    assert [(m, p) for m, p, _ in api.writes() if not p.endswith("/events")] == []
    (held,) = events(api)
    assert held["reason"] == "GpuRepairRefused" and "a person said so" in held["message"]


async def test_a_wave_of_ladders_trips_the_pools_breaker_and_records_it() -> None:
    # A limit of zero ladders (min_nodes 0, fraction 0): the first ladder of the pool trips it.
    api, loop = world(dry_run=False, safety=SafetyPolicy(breaker_min_nodes=0, breaker_max_fraction=0.0))
    api.add(
        f"/api/v1/namespaces/{NS}/configmaps/gpumon-controller", {"metadata": {"name": "gpumon-controller"}}
    )
    await loop.round()
    cm = api.objects[f"/api/v1/namespaces/{NS}/configmaps/gpumon-controller"]
    assert "breaker.gpumon.io/h100" in cm["metadata"]["annotations"]
    assert [p for m, p, _ in api.writes() if p.endswith("/jobs")] == [], "no step started"
    reasons = [e["reason"] for e in events(api)]
    assert "GpuBreakerOpen" in reasons and "GpuRepairRefused" in reasons


def pod_json(namespace: str, name: str, *, gpu: bool = False, owner: str | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": 1} if gpu else {}
    meta: dict[str, Any] = {"namespace": namespace, "name": name, "uid": f"uid-{name}"}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner, "name": "x", "controller": True}]
    container = {"name": "c", "image": "x", "resources": {"limits": limits}}
    return {
        "metadata": meta,
        "spec": {"nodeName": "n1", "containers": [container]},
        "status": {"phase": "Running"},
    }


ON_THE_NODE = [
    pod_json("ml", "train-0", gpu=True),
    pod_json("web", "cache"),  # no GPU: holds no GPU, taken down by the reboot all the same
    pod_json("kube-system", "plugin", gpu=True, owner="DaemonSet"),
]


def evictions(api: FakeKube) -> list[str]:
    return [p for m, p, _ in api.calls if m == "POST" and p.endswith("/eviction")]


def jobs_posted(api: FakeKube) -> list[str]:
    return [p for m, p, _ in api.writes() if p.endswith("/jobs")]


async def test_before_a_reboot_every_pod_of_the_node_is_evicted_unless_paused() -> None:
    api, loop = world(dry_run=False, action=RecoveryAction.NODE_REBOOT, listed=ON_THE_NODE)
    await loop.round()
    assert api.pod_lists() == ["n1"]
    assert evictions(api) == [
        "/api/v1/namespaces/ml/pods/train-0/eviction",
        "/api/v1/namespaces/web/pods/cache/eviction",
    ], "the DaemonSet's pod stays"
    assert jobs_posted(api) == [], "no reboot while a pod is there"
    assert "GpuRepairDraining" in [e["reason"] for e in events(api)]
    api, loop = world(
        dry_run=False,
        action=RecoveryAction.NODE_REBOOT,
        listed=ON_THE_NODE,
        safety=SafetyPolicy(paused=True),
    )
    await loop.round()
    assert evictions(api) == [], "paused: nothing evicted"


async def test_the_reboot_starts_once_the_listing_shows_the_node_free() -> None:
    # Only the DaemonSet's pod is left: the node is free, whatever the rest of the fleet holds.
    api, loop = world(dry_run=False, action=RecoveryAction.NODE_REBOOT, listed=[ON_THE_NODE[2]])
    await loop.round()
    assert evictions(api) == []
    assert jobs_posted(api) == [f"/apis/batch/v1/namespaces/{NS}/jobs"]


async def test_a_reset_waits_for_the_gpu_pods_only() -> None:
    # The GPU pod holds the GPUs; the CPU pod and the DaemonSet's do not, and nothing is evicted.
    api, loop = world(dry_run=False, action=RecoveryAction.GPU_RESET, listed=ON_THE_NODE)
    await loop.round()
    assert api.pod_lists() == ["n1"] and jobs_posted(api) == [] and evictions(api) == []
    api, loop = world(dry_run=False, action=RecoveryAction.GPU_RESET, listed=ON_THE_NODE[1:])
    await loop.round()
    assert jobs_posted(api) == [f"/apis/batch/v1/namespaces/{NS}/jobs"] and evictions(api) == []


async def test_a_failed_listing_keeps_the_step_waiting_and_evicts_nothing() -> None:
    for action in (RecoveryAction.NODE_REBOOT, RecoveryAction.GPU_RESET):
        api, loop = world(dry_run=False, action=action, listed=None)
        await loop.round()
        assert jobs_posted(api) == [], "not known to be free: no step"
        assert evictions(api) == []
        assert loop._metrics.errors.labels("list_pods", "KubeError")._value.get() == 1


async def test_a_pool_that_repairs_has_the_prometheus_source_read_the_exporters_verdicts() -> None:
    """The ladder confirms a repair by the exporter's verdict, which no built-in rule reads: the
    Prometheus source asks for it (the GPUs judged worse than healthy) only where a pool repairs."""
    async with aiohttp.ClientSession() as session:
        for pools, asked in (([], False), ([POOL_CONFIG], True)):
            config = ControllerConfig.model_validate(
                {"signals": {"prometheus": {"url": "http://prometheus:9090"}}, "pools": pools}
            )
            metrics = ControllerMetrics(CollectorRegistry())
            src = _build_source(config, build_policy(config), None, session, metrics, time.time, None)
            assert isinstance(src, PrometheusSource)
            assert ("flag:exporter_health" in src.queries()) is asked
            assert ("__busy" in src.queries()) is bool(pools), "only an autoscaler reads it"
