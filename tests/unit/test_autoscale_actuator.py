"""The autoscaler's shell and actuator (gpumon.controller.shell.autoscaler_loop) against a recording fake API:
caches seeded by hand, every write checked."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from cancellation import assert_ends_cancelled
from controller_fakes import FakeKube, StaticSource
from prometheus_client import CollectorRegistry
from test_autoscale_demand import containers, unschedulable

from gpumon.config.pools import PoolConfig
from gpumon.controller.act.events import EventRecorder
from gpumon.controller.act.evict import Evictor
from gpumon.controller.act.retry import RetryPolicy
from gpumon.controller.configure import pool_from_config
from gpumon.controller.core.backoff import Backoff
from gpumon.controller.core.contract import (
    CA_MAX_ANNOTATION,
    DELETE_MACHINE_ANNOTATION,
    RECORD_ANNOTATION,
    REMOVING_ANNOTATION,
)
from gpumon.controller.core.contract.autoscaler import (
    Record,
    Removal,
    record_from_annotation,
    record_to_annotation,
)
from gpumon.controller.core.demand import PodDemand
from gpumon.controller.core.objects import GpuResources, PdbView, from_rfc3339
from gpumon.controller.core.pools import Pool, PoolNode
from gpumon.controller.core.signals import GpuReading, NodeReading
from gpumon.controller.shell.autoscaler_loop import (
    AutoscaleMetrics,
    Autoscaler,
    LoopSettings,
    gpu_resources,
    set_replicas,
)
from gpumon.controller.shell.node_pods import NodePods
from gpumon.gpu.model import PodRef
from gpumon.kube.client import Conflict, KubeError, TooManyRequests
from gpumon.kube.informer import Selection, View
from gpumon.kube.registry import Informers

GPU = "nvidia.com/gpu"
NOW = 1_800_000_000.0


def make_pool(**over: Any) -> Pool:
    cfg = {
        "name": "a",
        "target": {"namespace": "capi", "name": "md"},
        "node_selector": "pool=a",
        "template": {"resources": {GPU: 8}},
        "max_replicas": 10,
        **over,
    }
    return pool_from_config(PoolConfig.model_validate(cfg))


class ScaleKube(FakeKube):
    """FakeKube whose ``/scale`` is a view of the target object, as on a real API server (one
    resourceVersion for both)."""

    def __init__(self, pool: Pool, replicas: int = 0, annotations: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.target = pool.target
        self.add(
            self.target.path,
            {
                "metadata": {
                    "name": "md",
                    "namespace": "capi",
                    "uid": "uid-md",
                    "annotations": dict(annotations or {}),
                },
                "spec": {"replicas": replicas},
            },
        )

    @property
    def md(self) -> dict[str, Any]:
        return self.objects[self.target.path]

    def _scale(self) -> dict[str, Any]:
        obj = self.md
        spec = {"replicas": obj["spec"]["replicas"]} if obj["spec"]["replicas"] else {}  # omitempty
        return {
            "kind": "Scale",
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "spec": spec,
        }

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        if path == self.target.scale_path:
            self.calls.append(("GET", path, params))
            return self._scale()
        return await super().get(path, params)

    async def patch(self, path: str, body: Mapping[str, Any], *, strategic: bool = False) -> dict[str, Any]:
        if path != self.target.scale_path:
            return await super().patch(path, body, strategic=strategic)
        self.calls.append(("PATCH", path, copy.deepcopy(dict(body))))
        answer = self._hook("PATCH", path, body)
        if answer is not None:
            return answer
        if body["metadata"]["resourceVersion"] != self.md["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", path)
        self.md["spec"]["replicas"] = body["spec"]["replicas"]
        self.touch(self.target.path)
        return self._scale()

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return [
            b
            for m, p, b in self.calls
            if m == "POST" and p.endswith("/events") and reason in (None, b["reason"])
        ]

    def scale_patches(self) -> list[int]:
        return [
            b["spec"]["replicas"] for m, p, b in self.calls if m == "PATCH" and p == self.target.scale_path
        ]


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def autoscaler(
    kube: ScaleKube,
    pool: Pool,
    *,
    dry_run: bool = False,
    clock: Clock | None = None,
    source: StaticSource | None = None,
) -> Autoscaler:
    resources = gpu_resources(GpuResources(), [pool])
    clock = clock or Clock()
    informers = Informers()
    pdbs: View[PdbView] = informers.informer(Selection("/apis/policy/v1/poddisruptionbudgets")).view(
        lambda o: None, name="pdbs"
    )
    evictor = Evictor(kube, RetryPolicy(Backoff(0.5, 2)))
    return Autoscaler(
        kube,
        [pool],
        informers=informers,
        node_pods=NodePods(kube, resources, evictor),
        source=source or StaticSource(),
        pdbs=pdbs,
        recorder=EventRecorder(kube, instance="t", wall_clock=clock),
        evictor=evictor,
        metrics=AutoscaleMetrics(CollectorRegistry()),
        is_leader=lambda: True,
        dry_run=dry_run,
        resources=resources,
        settings=LoopSettings(),
        wall_clock=clock,
    )


def pending(a: Autoscaler, count: int, gpus: int = 2) -> None:
    for i in range(count):
        pod = PodDemand(
            "ml",
            f"p{i}",
            f"uid-p{i}",
            MappingProxyType({GPU: gpus * 1000, "pods": 1000}),
            pending_since=NOW - 3,
        )
        a.pending.update_local(f"ml/p{i}", pod, "1")


def node(a: Autoscaler, name: str, **kw: Any) -> None:
    a.nodes["a"].update_local(
        name, PoolNode(name, kw.pop("created_at", 0.0), kw.pop("allocatable", True), **kw), "1"
    )


def gpu_pod_on(kube: ScaleKube, node_name: str) -> str:
    """A GPU pod bound to the node, as its list shows it."""
    name = f"{node_name}-job"
    path = f"/api/v1/namespaces/ml/pods/{name}"
    kube.add(
        path,
        {
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {
                "nodeName": node_name,
                "containers": [{"name": "c", "resources": {"limits": {GPU: "1"}}}],
            },
            "status": {"phase": "Running"},
        },
    )
    return path


def metric(a: Autoscaler, action: str, result: str) -> float:
    return a.metrics.plans.labels("a", action, result)._value.get()


# -- the pieces ----------------------------------------------------------------------------------


async def test_replicas_are_patched_with_an_explicit_integer_and_the_version_read() -> None:
    pool = make_pool()
    kube = ScaleKube(pool, replicas=3)
    rv = kube.md["metadata"]["resourceVersion"]
    await set_replicas(kube, pool.target, 0, rv)
    assert kube.calls[-1] == (
        "PATCH",
        pool.target.scale_path,
        {"metadata": {"resourceVersion": rv}, "spec": {"replicas": 0}},
    )
    assert kube.md["spec"]["replicas"] == 0
    with pytest.raises(Conflict):
        await set_replicas(kube, pool.target, 2, rv)  # stale now


def test_pods_on_shared_gpus_count_as_gpu_pods() -> None:
    shared = make_pool(template={"shared_gpus": {"cards": 2, "memory_per_card": 16}})
    r = gpu_resources(GpuResources(), [shared])
    assert (
        r.matches("aliyun.com/gpu-mem") and r.matches("nvidia.com/gpu") and r.matches("nvidia.com/mig-1g.5gb")
    )
    assert not r.matches("cpu") and GpuResources().matches("aliyun.com/gpu-core.percentage")


# -- rounds -------------------------------------------------------------------------------------


async def test_a_round_scales_up_records_and_reports() -> None:
    pool = make_pool()
    kube = ScaleKube(pool)
    a = autoscaler(kube, pool)
    pending(a, 5)
    (plan,) = await a.round()
    assert plan.desired == 2 and kube.scale_patches() == [2] and kube.md["spec"]["replicas"] == 2
    record = record_from_annotation(kube.md["metadata"]["annotations"][RECORD_ANNOTATION])
    assert set(record.provided) == {f"uid-p{i}" for i in range(5)} and record.scaled_up_at == NOW
    (event,) = kube.events("GpuPoolScaleUp")
    assert event["involvedObject"] == {
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineDeployment",
        "name": "md",
        "namespace": "capi",
        "uid": "uid-md",
    }
    assert event["metadata"]["namespace"] == "capi" and "0 -> 2" in event["message"]
    assert metric(a, "scale_up", "applied") == 1
    assert a.metrics.pending_to_request._sum.get() == pytest.approx(3.0)
    assert a.metrics.replicas.labels("a", "desired")._value.get() == 2
    assert a.metrics.pending_pods.labels("a")._value.get() == 5
    # The next round sees the capacity on its way: nothing more.
    kube.calls.clear()
    (again,) = await a.round()
    assert (
        again.desired == 2
        and kube.scale_patches() == []
        and a.metrics.arriving_nodes.labels("a")._value.get() == 2
    )


async def test_a_cgpu_core_share_off_the_5_percent_steps_is_reported_and_never_demand() -> None:
    shared = make_pool(template={"shared_gpus": {"cards": 2, "memory_per_card": 16}})
    kube = ScaleKube(shared)
    a = autoscaler(kube, shared)
    for name, core in (("odd", 33), ("even", 30)):
        requests = {"aliyun.com/gpu-mem": 2000, "aliyun.com/gpu-core.percentage": core * 1000, "pods": 1000}
        a.pending.update_local(
            f"ml/{name}", PodDemand("ml", name, f"uid-{name}", MappingProxyType(requests)), "1"
        )
    (plan,) = await a.round()
    assert plan.pods == ("ml/even",) and plan.desired == 1
    (event,) = kube.events("GpuRequestRefused")
    assert event["involvedObject"]["name"] == "odd" and event["type"] == "Warning"
    assert "33 %" in event["message"] and "multiples of 5" in event["message"]
    assert a.metrics.refused_pods.labels("cgpu_core_step")._value.get() == 1


async def test_dry_run_writes_nothing_and_says_so() -> None:
    pool = make_pool()
    kube = ScaleKube(pool)
    a = autoscaler(kube, pool, dry_run=True)
    pending(a, 5)
    await a.round()
    assert kube.writes("PATCH") == []
    (event,) = kube.events("GpuPoolScaleUp")
    assert event["message"].startswith("[dry-run] scaling MachineDeployment capi/md 0 -> 2")
    assert metric(a, "scale_up", "dry_run") == 1


async def test_a_concurrent_change_makes_the_round_plan_again() -> None:
    pool = make_pool()
    kube = ScaleKube(pool)
    a = autoscaler(kube, pool)
    pending(a, 1)

    def someone_else(body: Any) -> None:
        raise Conflict(409, "Conflict", "changed")

    kube.hooks[("PATCH", pool.target.scale_path)] = someone_else
    await a.round()
    assert metric(a, "scale_up", "conflict") == 1 and a._wake.is_set()
    assert RECORD_ANNOTATION not in kube.md["metadata"]["annotations"]  # nothing recorded for it


async def test_a_replica_that_lost_its_lease_mid_round_writes_nothing() -> None:
    pool = make_pool()
    kube = ScaleKube(pool)
    a = autoscaler(kube, pool)
    pending(a, 1)
    a._is_leader = lambda: False
    await a.round()
    assert kube.writes("PATCH") == [] and metric(a, "scale_up", "not_leader") == 1


async def test_a_cluster_autoscaler_target_is_refused_with_an_event() -> None:
    pool = make_pool()
    kube = ScaleKube(pool, annotations={CA_MAX_ANNOTATION: "5"})
    a = autoscaler(kube, pool)
    pending(a, 5)
    await a.round()
    assert kube.writes("PATCH") == [] and metric(a, "refused", "refused") == 1
    (event,) = kube.events("GpuPoolRefused")
    assert event["type"] == "Warning" and "cluster-autoscaler" in event["message"]
    assert a.metrics.refused.labels("a")._value.get() == 1


async def test_an_unreadable_target_is_reported() -> None:
    pool = make_pool()
    kube = ScaleKube(pool)
    del kube.objects[pool.target.path]
    a = autoscaler(kube, pool)
    await a.round()
    (event,) = kube.events("GpuPoolUnreadable")
    assert "404" in event["message"]


# -- scale-down ---------------------------------------------------------------------------------


def down_pool() -> Pool:
    return make_pool(min_replicas=1, scale_down_unneeded_seconds=0, scale_down_cooldown_seconds=0)


def cpu_pod(kube: ScaleKube, node_name: str, name: str = "web", **meta: Any) -> str:
    path = f"/api/v1/namespaces/ml/pods/{name}"
    kube.add(
        path,
        {
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", **meta},
            "spec": {"nodeName": node_name, "containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        },
    )
    return path


async def test_scale_down_cordons_drains_then_marks_records_and_lowers_replicas() -> None:
    pool = down_pool()
    kube = ScaleKube(pool, replicas=2)
    clock = Clock()
    a = autoscaler(kube, pool, clock=clock)
    node(a, "n0", machine="m0", machine_namespace="capi")
    node(a, "n1")
    gpu_pod_on(kube, "n1")
    for path in ("/api/v1/nodes/n0", "/api/v1/nodes/n1"):
        kube.add(path, {"metadata": {"name": path.rsplit("/", 1)[1]}, "spec": {}})
    web = cpu_pod(kube, "n0")
    cpu_pod(kube, "n0", "agent", ownerReferences=[{"kind": "DaemonSet", "controller": True, "name": "ds"}])

    def pdb_says_no(body: Any) -> None:
        raise TooManyRequests(
            429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
        )

    kube.hooks[("POST", web + "/eviction")] = pdb_says_no
    (plan,) = await a.round()
    assert plan.drain == ("n0",)
    n0 = kube.objects["/api/v1/nodes/n0"]
    assert n0["spec"]["unschedulable"] is True and REMOVING_ANNOTATION in n0["metadata"]["annotations"]
    assert kube.scale_patches() == [] and kube.events("GpuPoolEvictionBlocked")
    evictions = [p for m, p, _ in kube.calls if p.endswith("/eviction")]
    assert evictions == [web + "/eviction"]  # never the DaemonSet pod

    # The PDB allows it now; the pod goes.
    del kube.hooks[("POST", web + "/eviction")]
    kube.hooks[("POST", web + "/eviction")] = lambda body: kube.objects.pop(web) and None
    clock.now += 5
    node(a, "n0", unschedulable=True, removing_since=NOW, machine="m0", machine_namespace="capi")
    await a.round()
    assert web not in kube.objects and kube.scale_patches() == []
    clock.now += 5
    kube.calls.clear()
    await a.round()
    order = [(m, p) for m, p, _ in kube.writes("PATCH")]
    assert order == [
        ("PATCH", "/apis/cluster.x-k8s.io/v1beta2/namespaces/capi/machines/m0"),  # 404 here: no Machines
        ("PATCH", "/api/v1/nodes/n0"),
        ("PATCH", pool.target.path),  # the record first...
        ("PATCH", pool.target.scale_path),  # ...then the replicas
    ]
    assert DELETE_MACHINE_ANNOTATION in kube.objects["/api/v1/nodes/n0"]["metadata"]["annotations"]
    assert kube.md["spec"]["replicas"] == 1
    record = record_from_annotation(kube.md["metadata"]["annotations"][RECORD_ANNOTATION])
    assert record.removal == Removal(("n0",), 2, 1, NOW + 10)
    (event,) = kube.events("GpuPoolScaledDown")
    assert "2 -> 1" in event["message"] and "n0" in event["message"]


async def test_a_gpu_pod_found_on_the_node_calls_the_removal_off() -> None:
    pool = down_pool()
    kube = ScaleKube(pool, replicas=2)
    a = autoscaler(kube, pool)
    node(a, "n0", unschedulable=True, removing_since=NOW - 1)
    node(a, "n1")
    gpu_pod_on(kube, "n1")
    kube.add(
        "/api/v1/nodes/n0",
        {
            "metadata": {"name": "n0", "annotations": {REMOVING_ANNOTATION: "x"}},
            "spec": {"unschedulable": True},
        },
    )
    path = cpu_pod(kube, "n0", "late")
    kube.objects[path]["spec"]["containers"] = [{"name": "c", "resources": {"limits": {GPU: "1"}}}]
    await a.round()
    n0 = kube.objects["/api/v1/nodes/n0"]
    assert "unschedulable" not in n0["spec"] and REMOVING_ANNOTATION not in n0["metadata"]["annotations"]
    assert not [p for m, p, _ in kube.calls if p.endswith("/eviction")] and kube.scale_patches() == []


def attributed(node_name: str, *pods: str) -> NodeReading:
    """The exporter's reading of a node: one GPU, the ``pods`` placed on it."""
    gpu = GpuReading("GPU-0", 0, NOW, pods=tuple(PodRef("ml", p, "c") for p in pods))
    return NodeReading(node_name, NOW, (gpu,), pods_attributed=bool(pods), busy=bool(pods))


async def test_nodes_the_exporters_show_busy_are_not_listed_and_the_others_are() -> None:
    # No cache of the fleet's pods: the exporters' per-pod signals say which nodes are busy; a
    # node they do not show busy (idle, or no reading) costs one list of its pods.
    pool = down_pool()
    kube = ScaleKube(pool, replicas=3)
    source = StaticSource()
    a = autoscaler(kube, pool, source=source)
    for name in ("n0", "n1", "n2", "n3", "n4"):
        node(a, name)
    source.nodes["n0"] = attributed("n0", "train")
    source.nodes["n1"] = attributed("n1")  # idle, as far as its exporter knows
    gpu_pod_on(kube, "n2")  # no reading: the list finds its GPU pod
    # Read as a whole (the Prometheus source's summary of a node nothing is wrong with): busy
    # or not, with no GPU listed.
    source.nodes["n3"] = NodeReading("n3", NOW, (), busy=True, gpus_read=False)
    source.nodes["n4"] = NodeReading("n4", NOW, (), gpus_read=False)
    assert await a.busy_nodes() == {"n0", "n2", "n3"}
    assert sorted(kube.pod_lists()) == ["n1", "n2", "n4"]


def idle_n0_busy_n1() -> tuple[ScaleKube, Autoscaler]:
    """A pool of two nodes that may shrink to one: n0 idle, n1 running a GPU pod."""
    pool = down_pool()
    kube = ScaleKube(pool, replicas=2)
    a = autoscaler(kube, pool)
    node(a, "n0")
    node(a, "n1")
    gpu_pod_on(kube, "n1")
    return kube, a


async def test_scale_down_confirms_a_candidates_pods_before_cordoning() -> None:
    # The candidate looked idle when the round began; a GPU pod got there before the cordon.
    kube, a = idle_n0_busy_n1()
    kube.add("/api/v1/nodes/n0", {"metadata": {"name": "n0"}, "spec": {}})
    lists = 0

    def late_pod(params: Any) -> None:
        nonlocal lists
        if params["fieldSelector"] == "spec.nodeName=n0":
            lists += 1
            if lists == 2:
                gpu_pod_on(kube, "n0")

    kube.hooks[("GET", "/api/v1/pods")] = late_pod
    (plan,) = await a.round()
    assert plan.drain == ("n0",) and lists == 2
    assert kube.writes("PATCH") == [] and kube.scale_patches() == []  # never cordoned, replicas kept


async def test_a_node_whose_pods_cannot_be_listed_counts_busy() -> None:
    kube, a = idle_n0_busy_n1()

    def refuse(params: Any) -> None:
        if params["fieldSelector"] == "spec.nodeName=n0":
            raise KubeError(503, "ServiceUnavailable", "etcd leader changed")

    kube.hooks[("GET", "/api/v1/pods")] = refuse
    (plan,) = await a.round()
    assert plan.drain == () and kube.writes() == []


async def test_a_removal_recorded_before_a_restart_is_finished() -> None:
    pool = down_pool()
    record = Record(removal=Removal(("n0",), 2, 1, NOW - 10), scaled_down_at=NOW - 10)
    kube = ScaleKube(pool, replicas=2, annotations={RECORD_ANNOTATION: record_to_annotation(record)})
    a = autoscaler(kube, pool)
    node(a, "n0", marked=True, unschedulable=True, removing_since=NOW - 20)
    node(a, "n1")
    gpu_pod_on(kube, "n1")
    (plan,) = await a.round()
    assert plan.action.value == "finish_removal" and kube.scale_patches() == [1]


async def test_observations_follow_the_nodes() -> None:
    pool = make_pool()
    kube = ScaleKube(pool, replicas=3)
    clock = Clock()
    a = autoscaler(kube, pool, clock=clock)
    node(a, "n0")
    node(a, "n1", allocatable=False)
    gpu_pod_on(kube, "n1")
    await a.round()
    assert a._idle_since == {"n0": NOW} and a._ready_since == {"n0": NOW}
    assert a._unregistered_since == {"a": NOW}
    clock.now += 7
    gpu_pod_on(kube, "n0")
    a.nodes["a"]._put("n1", None)
    await a.round()
    assert a._idle_since == {} and a._ready_since == {"n0": NOW}


def test_pending_pods_informer_keeps_only_unschedulable_gpu_pods() -> None:
    pool = make_pool()
    a = autoscaler(ScaleKube(pool), pool)
    obj = unschedulable(containers({GPU: "1"}))
    view = a.pending._convert(obj)
    assert view is not None and view.pending_since == from_rfc3339("2026-01-01T00:00:10Z")
    assert a.pending.informer.selection.params() == {"fieldSelector": "spec.nodeName=,status.phase=Pending"}
    assert a.nodes["a"].informer.selection.params() == {"labelSelector": "pool=a"}
    assert a.pending._convert({**obj, "status": {"phase": "Pending"}}) is None


async def test_the_loop_stops_when_cancelled_as_a_change_wakes_it() -> None:
    # Python 3.11's asyncio.wait_for handed the loop its wake-up and dropped the cancellation:
    # a controller stopping at that moment never did.
    pool = make_pool()
    a = autoscaler(ScaleKube(pool), pool)
    for view in (*a.views, a._pdbs):
        view.synced.set()
    task = asyncio.create_task(a.run())
    for _ in range(5):  # into its wait for a change
        await asyncio.sleep(0)
    assert not task.done()
    node(a, "n0")  # an informer change wakes the loop
    task.cancel()
    await assert_ends_cancelled(task, "the autoscaler lost its cancellation")


class ControlledKube(ScaleKube):
    """A target whose own controller writes it as soon as its replicas change, before the
    autoscaler's record write (Cluster API's MachineDeployment controller); ``moves_to``: it
    also sets other replicas (someone else scaled it meanwhile)."""

    def __init__(self, pool: Pool, moves_to: int | None = None) -> None:
        super().__init__(pool)
        self.moves_to = moves_to

    async def patch(self, path: str, body: Mapping[str, Any], *, strategic: bool = False) -> dict[str, Any]:
        answer = await super().patch(path, body, strategic=strategic)
        if path == self.target.scale_path:
            if self.moves_to is not None:
                self.md["spec"]["replicas"] = self.moves_to
            self.touch(self.target.path)
        return answer


async def test_a_record_that_loses_to_the_targets_controller_is_written_over_its_new_version() -> None:
    pool = make_pool()
    kube = ControlledKube(pool)
    a = autoscaler(kube, pool)
    pending(a, 5)
    (plan,) = await a.round()
    assert plan.desired == 2 and kube.scale_patches() == [2]
    record = record_from_annotation(kube.md["metadata"]["annotations"][RECORD_ANNOTATION])
    assert set(record.provided) == {f"uid-p{i}" for i in range(5)} and record.scaled_up_at == NOW
    assert metric(a, "scale_up", "applied") == 1


async def test_no_record_is_written_over_replicas_someone_else_moved() -> None:
    pool = make_pool()
    kube = ControlledKube(pool, moves_to=7)
    a = autoscaler(kube, pool)
    pending(a, 5)
    await a.round()
    assert kube.scale_patches() == [2] and kube.md["spec"]["replicas"] == 7
    assert RECORD_ANNOTATION not in kube.md["metadata"]["annotations"]
