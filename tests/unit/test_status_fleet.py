"""The fleet view, from cluster objects as the API server and the controller write them."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from status_builders import NOW, RESOURCES, at, event, node, pod, record, state

from gpumon.config.pools import PoolConfig, TargetConfig, TemplateConfig
from gpumon.controller.configure import pool_from_config
from gpumon.controller.core.contract import RECORD_ANNOTATION
from gpumon.controller.core.contract.autoscaler import Record, record_to_annotation
from gpumon.controller.core.contract.breakers import BreakerTrip, breaker_to_annotation
from gpumon.controller.core.objects import pdb_from_json
from gpumon.controller.core.pools import ScaleState
from gpumon.controller.shell.metrics import ClusterGauges, ControllerMetrics
from gpumon.gpu.health import Severity
from gpumon.status.fleet import build_fleet, gpu_counts, problems_of
from gpumon.status.metrics import controller_status
from gpumon.status.model import GpuCounts
from gpumon.status.state import ClusterState, PoolTarget, node_info, pool_target, requested_gpus

BAD = "gpu-a-1"
PDB = pdb_from_json(
    {
        "metadata": {"namespace": "ml", "name": "keep-serve"},
        "spec": {"selector": {"matchLabels": {"app": "serve"}}},
        "status": {"disruptionsAllowed": 0},
    }
)


def scenario(**kw: Any) -> ClusterState:
    """Pool a100: one node quarantined for two GPUs and draining, one healthy, one whose
    quarantine the breaker refused. Pool h100: breaker open."""
    nodes = [
        node(
            BAD,
            records=(
                record(1),
                record(3, "Thermal", Severity.DEGRADED, rules=("thermal-degraded",), evidence="88 C"),
            ),
            quarantined_ago=600,
            state="draining",
            cordoned=True,
            cordon_preexisting=True,
            drain_started_ago=590,
        ),
        node("gpu-a-2"),
        node("gpu-a-3"),
        node("gpu-h-1", pool="h100", gpus=4),
        {"metadata": {"name": "cpu-1"}, "status": {"capacity": {"cpu": "8"}}},  # not a GPU node
    ]
    pods = [
        pod("ml", "serve-0", node_name=BAD, labels={"app": "serve"}),
        pod("ml", "notebook", node_name=BAD),
        pod("kube-system", "dcgm", node_name=BAD, owner="DaemonSet"),
        pod("ml", "wants-2", gpus=2, phase="Pending", created_ago=120),
        pod("ml", "wants-1", phase="Pending", created_ago=30),
    ]
    blocked = "eviction of ml/serve-0 refused (PDB ml/keep-serve)"
    events = (
        event("Node", BAD, "GpuQuarantined", "tainted ...: GPU 1 (GPU-1): XidFatal (Xid 79)", ago=600),
        event(
            "Pod", "train-0", "GpuPodEvicted", f"evicted from node {BAD}: uses GPU 1", namespace="ml", ago=595
        ),
        event("Node", BAD, "GpuPodEvicted", "evicted ml/train-0: uses GPU 1 (GPU-1)", ago=595),
        event("Node", BAD, "GpuEvictionBlocked", f"{blocked}: Cannot evict; retrying", ago=500, warning=True),
        event("Node", BAD, "GpuEvictionBlocked", f"{blocked}: again", ago=5),
        event("Node", "gpu-a-3", "GpuQuarantineRefused", "rate limit: at most 5 ...: GPU 0", ago=50),
        event("Node", "gpu-a-3", "GpuQuarantineRefused", "rate limit: later", ago=20),
        event("Node", "gpu-a-2", "GpuQuarantined", "[dry-run] tainted ...", ago=40),
    )
    key, value = breaker_to_annotation(BreakerTrip("h100", NOW - 3600, "3 of 4 nodes would be quarantined"))
    options: dict[str, Any] = {"pdbs": (PDB,), "events": events, "state_annotations": {key: value}}
    return state(nodes, pods, **(options | kw))


def test_pools_count_gpus_by_health_and_show_breakers() -> None:
    fleet = build_fleet(scenario(), pool_label="gpumon.io/pool")
    a100, h100 = fleet.pools
    assert (a100.name, a100.nodes, a100.quarantined, a100.breaker) == ("a100", 3, 1, None)
    assert a100.gpus == GpuCounts(healthy=22, degraded=1, unhealthy=1, lost=0)
    assert h100.breaker is not None and h100.breaker.opened_at == at(3600)
    assert h100.breaker.reason == "3 of 4 nodes would be quarantined"


def test_a_quarantined_node_names_rules_gpus_evictions_and_who_cordoned_it() -> None:
    (q,) = build_fleet(scenario(), pool_label="gpumon.io/pool").quarantined
    assert (q.name, q.pool, q.state, q.taint, q.severity, q.reason) == (
        BAD, "a100", "draining", "NoSchedule", "unhealthy", "XidFatal"
    )  # fmt: skip
    assert q.quarantined_at == at(600) and q.quarantined_for_seconds == 600
    assert [(p.index, p.uuid, p.reason, p.rules, p.evidence) for p in q.problems] == [
        (1, "GPU-1", "XidFatal", ("xid-unhealthy",), "Xid 79"),
        (3, "GPU-3", "Thermal", ("thermal-degraded",), "88 C"),
    ]
    assert q.evicted == ("ml/train-0",)
    assert q.cordoned and q.cordoned_by_person and not q.excluded


def test_a_drain_lists_what_is_left_and_the_pdb_that_blocks_it() -> None:
    (drain,) = build_fleet(scenario(), pool_label="gpumon.io/pool").drains
    assert drain.node == BAD and drain.running_for_seconds == 590
    assert drain.gpu_pods_left == 2  # the DaemonSet pod stays by design
    (blocker,) = drain.blockers
    assert (blocker.pod, blocker.pdbs) == ("ml/serve-0", ("ml/keep-serve",))
    assert blocker.message.endswith("again")  # the latest word


def test_refusals_and_dry_run_decisions_about_other_nodes_latest_first_per_reason() -> None:
    refusals = build_fleet(scenario(), pool_label="gpumon.io/pool").refusals
    assert [(r.about, r.reason, r.message) for r in refusals] == [
        ("Node/gpu-a-2", "GpuQuarantined", "[dry-run] tainted ..."),
        ("Node/gpu-a-3", "GpuQuarantineRefused", "rate limit: later"),
    ]


def test_pending_gpu_demand() -> None:
    fleet = build_fleet(scenario(), pool_label="gpumon.io/pool")
    assert [(p.pod, p.gpus, p.pending_for_seconds) for p in fleet.pending] == [
        ("ml/wants-2", 2, 120),
        ("ml/wants-1", 1, 30),
    ]


def test_a_configured_pool_shows_its_plan_and_a_discovered_target_its_replicas() -> None:
    pool = pool_from_config(
        PoolConfig(
            name="a100",
            target=TargetConfig(namespace="capi", name="md-a100"),
            node_selector="gpumon.io/pool=a100",
            template=TemplateConfig(resources={"nvidia.com/gpu": 8}),
            min_replicas=1,
            max_replicas=10,
        )
    )
    record = Record(
        provided={"uid-1": NOW - 60, "uid-2": NOW - 60}, replaced={BAD: NOW - 500}, scaled_up_at=NOW - 60
    )
    scale = ScaleState(4, 3, "", "7", "uid-md", {RECORD_ANNOTATION: record_to_annotation(record)})
    decided = event(
        "MachineDeployment", "md-a100", "GpuPoolScaleUp", "scaling 3 -> 4: 2 pending pod(s)", namespace="capi"
    )
    st = scenario(
        events=(decided,),
        pools=(pool_target(pool, scale), PoolTarget("MachineSet", "capi", "ms-x", current=2)),
    )
    configured, discovered = build_fleet(st, pool_label="gpumon.io/pool").scaling
    assert (configured.pool, configured.target, configured.desired, configured.current) == (
        "a100",
        "MachineDeployment capi/md-a100",
        4,
        3,
    )
    assert (configured.min_replicas, configured.max_replicas, configured.pods_provided_for) == (1, 10, 2)
    assert configured.replacing == (BAD,) and configured.scaled_up_at == at(60)
    assert configured.last_decision == "GpuPoolScaleUp: scaling 3 -> 4: 2 pending pod(s)"
    assert (discovered.pool, discovered.target, discovered.current, discovered.desired) == (
        "",
        "MachineSet capi/ms-x",
        2,
        None,
    )
    unreadable = pool_target(pool, None, "403 Forbidden")
    assert build_fleet(scenario(pools=(unreadable,)), pool_label="x").scaling[0].error == "403 Forbidden"


def test_node_scoped_findings_and_lost_gpus() -> None:
    whole = node_info(node("n", gpus=4, records=(record(None, "XidFatal"),), quarantined_ago=1), RESOURCES)
    assert gpu_counts(whole, problems_of(whole)) == GpuCounts(unhealthy=4)
    lost = node_info(node("n", gpus=4, records=(record(2, "GpuLost"),), quarantined_ago=1), RESOURCES)
    assert gpu_counts(lost, problems_of(lost)) == GpuCounts(healthy=3, lost=1)


def test_the_controllers_own_metrics() -> None:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    metrics.leader.set(1)
    metrics.dry_run.set(0)
    metrics.evictions.labels("blocked").inc(3)
    metrics.evictions.labels("evicted").inc()
    registry.register(
        ClusterGauges(
            quarantined=lambda: {("a100", "unhealthy"): 1},
            breakers=lambda: ["h100"],
            pools=lambda: ["a100", "h100"],
            signal_status=lambda: {"fresh": 3, "stale": 1, "missing": 0},
            synced=lambda: {"nodes": True},
            paused=lambda: False,
            overdue_drains=lambda: {"a100": 0, "h100": 0},
        )
    )
    ctl = controller_status(generate_latest(registry).decode(), "http://c/metrics", None, ())
    assert ctl.reachable and ctl.leader is True and ctl.dry_run is False and ctl.dry_run_from == "metrics"
    assert ctl.paused is False and ctl.breakers_open == ("h100",)
    assert ctl.signals == {"fresh": 3, "stale": 1, "missing": 0}
    assert ctl.evictions == {"blocked": 3, "evicted": 1}


def test_without_metrics_dry_run_comes_from_the_latest_action_event() -> None:
    fleet = build_fleet(
        scenario(metrics_error="connection refused", metrics_source="svc"), pool_label="gpumon.io/pool"
    )
    ctl = fleet.controller
    assert not ctl.reachable and ctl.error == "connection refused"
    assert ctl.dry_run is True and ctl.dry_run_from == "events"  # gpu-a-2's [dry-run] is the latest
    assert controller_status(None, "svc", "x", ()).dry_run is None
    garbled = controller_status("{not prometheus", "svc", None, ())
    assert not garbled.reachable and garbled.error is not None


def test_gpus_count_cards_not_shares_of_them() -> None:
    # A gpushare/cGPU node offers 2 cards as 32 GiB and 200 %: it has 2 GPUs, not 234.
    shared = node("s", gpus=0)
    shared["status"]["capacity"] = {
        "aliyun.com/gpu-mem": "32",
        "aliyun.com/gpu-count": "2",
        "aliyun.com/gpu-core.percentage": "200",
    }
    assert node_info(shared, RESOURCES).gpus == 2
    windows = node("w", gpus=0)
    windows["status"]["capacity"] = {"windows.alibabacloud.com/directx": "1"}
    assert node_info(windows, RESOURCES).gpus == 1
    # A pod asking 4 GiB of one card asks for no whole GPU.
    share = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]}}
    assert requested_gpus(share, RESOURCES) == 0
