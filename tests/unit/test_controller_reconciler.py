"""The reconciler's rounds with seeded caches, a static signal source and a recording API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from cancellation import assert_ends_cancelled
from controller_fakes import LEASES, FakeKube, StaticSource, lease_thread, load_rules
from direct_harness import wait_for
from prometheus_client import CollectorRegistry

from gpumon.controller.act.events import EventRecorder
from gpumon.controller.act.evict import Evictor
from gpumon.controller.core import contract as c
from gpumon.controller.core.backoff import Backoff
from gpumon.controller.core.breaker import SafetyPolicy
from gpumon.controller.core.claims import ClaimView, PlacedDevice, SliceView
from gpumon.controller.core.device_taints import RULES_PATH, RuleView, rule_from_json
from gpumon.controller.core.drain_plan import DrainPolicy
from gpumon.controller.core.node_plan import QuarantinePolicy
from gpumon.controller.core.objects import GpuResources, node_from_json, to_rfc3339
from gpumon.controller.core.policy import Policy
from gpumon.controller.core.signals import GpuReading, NodeReading, XidSeen
from gpumon.controller.shell.metrics import ClusterGauges, ControllerMetrics
from gpumon.controller.shell.node_pods import NodePods
from gpumon.controller.shell.remediation_loop import Reconciler, ReconcilerSettings
from gpumon.gpu.model import HealthState, HealthVerdict, PodRef
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER, ClaimRef, DeviceRef
from gpumon.kube.client import TooManyRequests, Unreachable
from gpumon.kube.informer import Selection, View
from gpumon.kube.registry import Informers

NS = "gpumon"
CM = f"/api/v1/namespaces/{NS}/configmaps/gpumon-controller"


def dev(index: int) -> DeviceRef:
    return DeviceRef(NVIDIA_GPU_DRIVER, "n0", f"gpu-{index}")


class World:
    def __init__(
        self,
        *,
        dry_run: bool = False,
        leader: bool = True,
        is_leader: Callable[[], bool] | None = None,
        rules: bool = False,
        drain_caches_listed: bool = True,
        **safety: Any,
    ) -> None:
        self.t = 1_000_000.0
        self.api = FakeKube()
        self.api.add(CM, {"metadata": {"name": "gpumon-controller", "namespace": NS, "annotations": {}}})
        self.source = StaticSource()
        self.leader = leader
        informers = Informers()
        self.nodes: View[Any] = informers.informer(Selection("/api/v1/nodes")).view(
            node_from_json, name="nodes"
        )
        self.pdbs: View[Any] = informers.informer(Selection("/b")).view(lambda o: None, name="pdbs")
        self.state: View[Any] = informers.informer(Selection("/s")).view(lambda o: None, name="state")
        self.state.update_local(f"{NS}/gpumon-controller", {}, "")
        self.claims: View[Any] = informers.informer(Selection("/c")).view(
            lambda o: None, name="resourceclaims"
        )
        self.slices: View[Any] = informers.informer(Selection("/r")).view(
            lambda o: None, name="resourceslices", index=lambda s: s.node
        )
        self.metrics = ControllerMetrics(CollectorRegistry())
        self.rules: View[RuleView] | None = None
        if rules:
            self.api.creatable.add(RULES_PATH)
            self.rules = informers.informer(Selection(RULES_PATH)).view(
                rule_from_json, name="devicetaintrules"
            )
        evictor = Evictor(self.api, Backoff(jitter=0))
        self.reconciler = Reconciler(
            api=self.api,
            nodes=self.nodes,
            node_pods=NodePods(self.api, GpuResources(), evictor),
            pdbs=self.pdbs,
            state=self.state,
            claims=self.claims,
            slices=self.slices,
            source=self.source,
            is_leader=is_leader or (lambda: self.leader),
            recorder=EventRecorder(self.api, instance="t", wall_clock=self.clock),
            evictor=evictor,
            metrics=self.metrics,
            settings=ReconcilerSettings(
                policy=Policy(rules=load_rules(), stale_after_seconds=30),
                quarantine=QuarantinePolicy(),
                drain=DrainPolicy(),
                safety=SafetyPolicy(**safety),
                dry_run=dry_run,
                namespace=NS,
            ),
            wall_clock=self.clock,
            rules=self.rules,
        )
        # Seeded through update_local below, as filled as a listed cache;
        # ``drain_caches_listed=False`` leaves what a drain reads besides the node's pods
        # unlisted, as in the first seconds after a restart.
        for informer in (self.nodes, self.state, self.pdbs, self.claims, self.slices):
            if drain_caches_listed or informer in (self.nodes, self.state):
                informer.synced.set()

    def clock(self) -> float:
        return self.t

    def node(
        self, name: str, pool: str = "a", annotations: dict[str, str] | None = None, **labels: str
    ) -> None:
        obj = {
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "labels": {"gpumon.io/pool": pool, **labels},
                "annotations": annotations or {},
            },
            "spec": {},
            "status": {"conditions": []},
        }
        written = self.api.add(f"/api/v1/nodes/{name}", obj)
        self.nodes.update_local(name, node_from_json(written), "")

    def signals(
        self,
        name: str,
        *,
        xid: int | None = None,
        pods: dict[int, str] | None = None,
        at: float | None = None,
    ):
        """A node's reading; with ``xid``, GPU 1 saw it, and the exporter judged it unhealthy."""
        at = self.t if at is None else at
        gpus = tuple(
            GpuReading(
                f"{name}-GPU-{i}",
                i,
                at,
                temperature_celsius=40.0,
                ecc_uncorrectable=0,
                row_remap_failure=False,
                lost=False,
                xids=(XidSeen(xid, at),) if xid is not None and i == 1 else (),
                health=HealthVerdict(HealthState.UNHEALTHY) if xid is not None and i == 1 else None,
                pods=(PodRef("ml", pods[i], "c"),) if pods and i in pods else (),
            )
            for i in range(2)
        )
        self.source.nodes[name] = NodeReading(name, at, gpus, pods_attributed=pods is not None)

    def pod(self, name: str, node: str, *, claim: str = "") -> None:
        """A pod bound to ``node``, in the API: a GPU pod, or one holding the ResourceClaim
        ``claim``."""
        container: dict[str, Any] = {"name": "c"}
        spec: dict[str, Any] = {"nodeName": node, "containers": [container]}
        if claim:
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        else:
            container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}"}
        self.api.add(f"/api/v1/namespaces/ml/pods/{name}", {"metadata": meta, "spec": spec})

    def pod_gone(self, name: str) -> None:
        del self.api.objects[f"/api/v1/namespaces/ml/pods/{name}"]

    def node_obj(self, name: str) -> dict[str, Any]:
        return self.api.objects[f"/api/v1/nodes/{name}"]

    def tainted(self) -> list[str]:
        return sorted(
            n["metadata"]["name"]
            for p, n in self.api.objects.items()
            if p.startswith("/api/v1/nodes/")
            and any(t["key"] == c.TAINT_KEY for t in n["spec"].get("taints", []))
        )

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return [
            b
            for m, p, b in self.api.calls
            if m == "POST" and p.endswith("/events") and reason in (None, b["reason"])
        ]


async def test_three_of_five_in_one_round_quarantines_the_two_oldest_and_opens_the_breaker():
    w = World()
    for i in range(5):
        w.node(f"n{i}")
    for i, age in zip(range(3), (3.0, 1.0, 2.0), strict=True):
        w.signals(f"n{i}", xid=79, at=w.t - age)
    await w.reconciler.round(w.nodes.items())
    assert w.tainted() == ["n0", "n2"]  # oldest faults first
    refused = w.events("GpuQuarantineRefused")
    assert [e["involvedObject"]["name"] for e in refused] == ["n1"]
    assert "circuit breaker tripped: 3 of 5 nodes in pool 'a'" in refused[0]["message"]
    assert "breaker.gpumon.io/a" in w.api.objects[CM]["metadata"]["annotations"]
    assert w.reconciler.open_breakers().keys() == {"a"}  # seen at once, ahead of the watch
    assert [e["involvedObject"]["kind"] for e in w.events("GpuBreakerOpen")] == ["ConfigMap"]
    # Recorded quarantines drive the breaker's arithmetic after a restart as well.
    assert {p: v.quarantined_at for p, v in w.reconciler.pools().items()}["a"] == (w.t, w.t)


async def test_dry_run_writes_nothing_but_events():
    w = World(dry_run=True)
    w.node("n0")
    w.signals("n0", xid=79, pods={1: "victim"})
    w.pod("victim", "n0")
    await w.reconciler.round(["n0"])
    assert w.tainted() == []
    assert not [call for call in w.api.calls if call[0] == "PATCH" or call[1].endswith("/eviction")]
    messages = [e["message"] for e in w.events()]
    assert messages and all(m.startswith("[dry-run] ") for m in messages)
    assert {e["reason"] for e in w.events()} == {"GpuQuarantined", "GpuPodEvicted"}
    assert w.metrics.evictions.labels("dry_run")._value.get() == 1


async def test_a_standby_evaluates_but_never_writes():
    w = World(leader=False)
    w.node("n0")
    w.signals("n0", xid=79)
    await w.reconciler.round(["n0"])
    assert w.api.writes() == []
    assert w.reconciler._states["n0"].targets  # warm state for a takeover


async def test_a_leader_whose_renewals_fail_writes_nothing_once_its_renew_deadline_passed():
    lease_api = FakeKube()  # the lease's API server, apart from the one the nodes are written to
    lease = lease_thread(lease_api)
    task = asyncio.create_task(lease.run())
    try:
        await wait_for(lease.is_leader, "leadership")
        w = World(is_leader=lease.is_leader)
        w.node("n0")
        w.signals("n0", xid=79)
        await w.reconciler.round(["n0"])
        assert w.tainted() == ["n0"]  # a leader writes
        lease.leader_changed.clear()

        def refuse(body: Any) -> Any:
            raise Unreachable("connection refused")

        lease_api.hooks[("PUT", f"{LEASES}/gpumon-controller")] = refuse
        async with asyncio.timeout(10):
            await lease.leader_changed.wait()  # told on the main loop, from the lease's thread
        assert not lease.is_leader()
        w.node("n1")
        w.signals("n1", xid=79)
        writes = len(w.api.writes())
        await w.reconciler.round(["n0", "n1"])
        assert w.api.writes()[writes:] == [] and w.tainted() == ["n0"]
        assert w.reconciler._states["n1"].targets  # judged, as a standby judges, not written
    finally:
        await lease.release()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_pause_switch_on_the_configmap_refuses_and_holds_everything():
    w = World()
    w.state.update_local(f"{NS}/gpumon-controller", {c.ANNOTATION_PAUSED: "true"}, "")
    w.node("n0")
    w.signals("n0", xid=79)
    await w.reconciler.round(["n0"])
    assert w.tainted() == []
    (ev,) = w.events("GpuQuarantineRefused")
    assert ev["message"].startswith("paused: ")


async def test_partial_drain_evicts_only_the_pod_on_the_bad_gpu_and_labels_progress():
    w = World()
    w.node("n0")
    w.pod("victim", "n0")
    w.pod("bystander", "n0")
    w.signals("n0", xid=79, pods={0: "bystander", 1: "victim"})
    await w.reconciler.round(["n0"])
    evictions = [p for m, p, _ in w.api.calls if p.endswith("/eviction")]
    assert evictions == ["/api/v1/namespaces/ml/pods/victim/eviction"]
    assert w.node_obj("n0")["metadata"]["labels"][c.LABEL_STATE] == "draining"
    pod_events = [e for e in w.events("GpuPodEvicted") if e["involvedObject"]["kind"] == "Pod"]
    assert pod_events[0]["metadata"]["namespace"] == "ml" and "GPU 1" in pod_events[0]["message"]
    # The victim leaves: the node is drained.
    w.pod_gone("victim")
    w.t += 1
    w.signals("n0", xid=79, pods={0: "bystander"})
    await w.reconciler.round(["n0"])
    assert w.node_obj("n0")["metadata"]["labels"][c.LABEL_STATE] == "drained"


async def test_only_the_bad_nodes_pods_are_listed_and_a_failed_list_waits_for_the_retry():
    # No cache of the fleet's pods: a drain lists its node's pods when it looks at the node.
    w = World()
    for name in ("n0", "n1"):
        w.node(name)
        w.pod(f"{name}-job", name)
    w.signals("n1", pods={1: "n1-job"})
    w.signals("n0", xid=79, pods={1: "n0-job"})

    def refuse(params: Any) -> None:
        raise Unreachable("connection refused")

    w.api.hooks[("GET", "/api/v1/pods")] = refuse
    await w.reconciler.round(["n0", "n1"])
    assert w.api.pod_lists() == ["n0"], "the healthy node's pods are never asked for"
    assert w.tainted() == ["n0"] and evictions(w) == []
    assert w.metrics.api_errors.labels("drain", "Unreachable")._value.get() == 1
    assert w.reconciler.take_due(w.t + 2) == {"n0"}, "looked at again after the round retry"
    del w.api.hooks[("GET", "/api/v1/pods")]
    w.t += 5
    await w.reconciler.round(["n0"])
    assert w.api.pod_lists() == ["n0", "n0"]
    assert evictions(w) == ["/api/v1/namespaces/ml/pods/n0-job/eviction"]


async def test_dra_pods_are_drained_by_the_gpu_their_claims_hold():
    # The exporter names no pods; the claims' cache and the node's slice place the DRA pods.
    w = World()
    w.node("n0")
    w.slices.update_local(
        "n0-slice",
        SliceView("n0", 1, tuple(PlacedDevice(dev(i), f"n0-GPU-{i}", f"n0-GPU-{i}") for i in range(2))),
        "",
    )
    for i, name in enumerate(("bystander", "victim")):
        w.claims.update_local(
            f"ml/{name}-gpu", ClaimView(ClaimRef("ml", f"{name}-gpu"), (dev(i),), (name,)), ""
        )
        w.pod(name, "n0", claim=f"{name}-gpu")
    w.signals("n0", xid=79)
    await w.reconciler.round(["n0"])
    evictions = [p for m, p, _ in w.api.calls if p.endswith("/eviction")]
    assert evictions == ["/api/v1/namespaces/ml/pods/victim/eviction"]
    # A claim's change looks at the quarantined nodes whose slices publish its devices.
    w.claims.on_change = w.reconciler.on_claim
    w.reconciler._dirty.clear()
    w.claims._put("ml/victim-gpu", None)
    assert w.reconciler._dirty == {"n0"}


async def test_bad_gpus_dra_devices_are_tainted_before_the_eviction_and_untainted_on_recovery():
    w = World(rules=True)
    w.node("n0")
    devices = (*(PlacedDevice(dev(i), f"n0-GPU-{i}", f"n0-GPU-{i}") for i in range(2)),)
    mig = PlacedDevice(DeviceRef(NVIDIA_GPU_DRIVER, "n0", "gpu-1-mig-9-0-4"), "n0-GPU-1", "MIG-1")
    w.slices.update_local("n0-slice", SliceView("n0", 1, (*devices, mig)), "")
    w.claims.update_local("ml/v-gpu", ClaimView(ClaimRef("ml", "v-gpu"), (dev(1),), ("victim",)), "")
    w.pod("victim", "n0", claim="v-gpu")
    w.reconciler.rules_served()
    w.signals("n0", xid=79)
    await w.reconciler.round(["n0"])
    posts = [(p, b) for m, p, b in w.api.calls if m == "POST" and not p.endswith("/events")]
    assert [p for p, _ in posts] == [RULES_PATH, RULES_PATH, "/api/v1/namespaces/ml/pods/victim/eviction"]
    selected = [b["spec"]["deviceSelector"]["device"] for _, b in posts[:2]]
    assert selected == ["gpu-1", "gpu-1-mig-9-0-4"], "the whole GPU and its MIG device, not GPU 0"
    assert {b["spec"]["taint"]["effect"] for _, b in posts[:2]} == {"NoSchedule"}
    assert w.events("GpuDevicesTainted")
    # Another round changes nothing: the rules are in the cache.
    w.t += 1
    w.signals("n0", xid=79)
    await w.reconciler.round(["n0"])
    assert [p for m, p, _ in w.api.calls if m == "POST" and p == RULES_PATH] == [RULES_PATH] * 2
    # Recovered after the hysteresis: the node's record goes, and its rules with it.
    w.signals("n0")
    await w.reconciler.round(["n0"])
    w.t += 900
    w.signals("n0")
    await w.reconciler.round(["n0"])
    assert w.events("GpuRecovered")
    deleted = sorted(p.rsplit("/", 1)[1] for m, p, _ in w.api.calls if m == "DELETE")
    assert deleted == sorted(b["metadata"]["name"] for _, b in posts[:2])
    # Rules of a node gone from the cluster go; those of a node outside this controller's
    # selector (in the API, not in its cache) stay.
    w.api.add("/api/v1/nodes/elsewhere", {"metadata": {"name": "elsewhere"}})
    for node in ("gone", "elsewhere"):
        w.rules._put(f"r-{node}", RuleView(f"r-{node}", node))
    await w.reconciler.round(["gone", "elsewhere"])
    assert [p for m, p, _ in w.api.calls if m == "DELETE"][-1] == f"{RULES_PATH}/r-gone"
    assert f"{RULES_PATH}/r-elsewhere" not in [p for m, p, _ in w.api.calls if m == "DELETE"]


async def test_after_a_restart_recorded_quarantine_waits_out_the_hysteresis():
    w = World()
    records = (
        '[{"uuid":"n0-GPU-1","index":1,"reason":"XidFatal","severity":"unhealthy","rules":["xid-unhealthy"],'
        f'"firstSeen":"{to_rfc3339(w.t - 5000)}","evidence":"Xid 79"}}]'
    )
    w.node(
        "n0",
        annotations={
            c.ANNOTATION_UNHEALTHY_GPUS: records,
            c.ANNOTATION_QUARANTINED_AT: to_rfc3339(w.t - 5000),
            c.ANNOTATION_CORDON_PREEXISTING: "false",
        },
    )
    w.signals("n0")  # healthy now
    await w.reconciler.round(["n0"])
    assert w.node_obj("n0")["metadata"]["labels"][c.LABEL_STATE] == "recovering"
    assert not w.events("GpuRecovered")
    w.t += 900
    w.signals("n0")
    await w.reconciler.round(["n0"])
    assert w.events("GpuRecovered")
    assert c.ANNOTATION_UNHEALTHY_GPUS not in w.node_obj("n0")["metadata"]["annotations"]


async def test_a_node_going_dark_is_reported_once_and_left_alone():
    w = World()
    w.node("n0")
    w.signals("n0")
    await w.reconciler.round(["n0"])
    w.t += 31  # no news for longer than stale_after
    await w.reconciler.round(["n0"])
    await w.reconciler.round(["n0"])
    (ev,) = w.events("GpuSignalsLost")
    assert "31s old" in ev["message"] and ev["type"] == "Warning"
    assert w.reconciler.signal_counts() == {"fresh": 0, "stale": 1, "missing": 0}
    assert w.tainted() == []


async def test_a_drain_past_its_deadline_is_counted_overdue_by_pool():
    w = World()
    w.node("n0")
    w.node("n1", pool="b")
    w.pod("victim", "n0")

    def refuse(body: Any) -> Any:
        raise TooManyRequests(429, "TooManyRequests", "Cannot evict pod: disruption budget")

    w.api.hooks[("POST", "/api/v1/namespaces/ml/pods/victim/eviction")] = refuse
    w.signals("n0", xid=79, pods={1: "victim"})
    w.signals("n1")
    await w.reconciler.round(["n0", "n1"])
    assert w.node_obj("n0")["metadata"]["labels"][c.LABEL_STATE] == "draining"
    registry = CollectorRegistry()
    registry.register(
        ClusterGauges(
            quarantined=w.reconciler.quarantined_counts,
            breakers=w.reconciler.open_breakers,
            pools=w.reconciler.pools,
            signal_status=w.reconciler.signal_counts,
            synced=lambda: {},
            paused=w.reconciler.paused,
            overdue_drains=w.reconciler.overdue_drains,
        )
    )

    def overdue(pool: str) -> float | None:
        return registry.get_sample_value("gpumon_controller_drain_overdue_nodes", {"pool": pool})

    assert (overdue("a"), overdue("b")) == (0, 0)
    w.t += DrainPolicy().deadline_seconds - 1
    assert overdue("a") == 0
    w.t += 1
    assert (overdue("a"), overdue("b")) == (1, 0)
    # Drained at last: no longer overdue.
    w.api.hooks.clear()
    w.pod_gone("victim")
    w.signals("n0", xid=79, pods={})
    await w.reconciler.round(["n0"])
    assert w.node_obj("n0")["metadata"]["labels"][c.LABEL_STATE] == "drained" and overdue("a") == 0


async def test_the_loop_stops_when_cancelled_as_a_change_wakes_it():
    # Python 3.11's asyncio.wait_for handed the loop its wake-up and dropped the cancellation:
    # a controller stopping at that moment never did.
    w = World()
    task = asyncio.create_task(w.reconciler.run())
    for _ in range(5):  # into its wait for a change
        await asyncio.sleep(0)
    assert not task.done()
    w.reconciler.mark(["n0"])
    task.cancel()
    await assert_ends_cancelled(task, "the reconciler lost its cancellation")


def evictions(w: World) -> list[str]:
    return [p for m, p, _ in w.api.calls if m == "POST" and p.endswith("/eviction")]


async def test_a_fault_is_tainted_before_the_pods_are_listed_and_drained_once_they_are():
    # After a restart the Pods are most of what is listed (100,000 at 10,000 nodes): the taint
    # needs only the Node, its signals and the lease; the drain waits for the pods.
    w = World(drain_caches_listed=False)
    w.node("n0")
    w.pod("victim", "n0")  # in the cache, which is not listed yet: not to be trusted
    w.signals("n0", xid=79, pods={1: "victim"})
    await w.reconciler.round(["n0"])
    assert w.tainted() == ["n0"]
    assert w.node_obj("n0")["metadata"]["labels"][c.LABEL_STATE] == "quarantined"
    assert evictions(w) == []
    # Still unlisted: the quarantined node is left as it is (no label going back and forth).
    written = len(w.api.writes())
    w.t += 1
    w.signals("n0", xid=79, pods={1: "victim"})
    await w.reconciler.round(["n0"])
    assert len(w.api.writes()) == written
    # Listed: the held node is looked at again and drained.
    for informer in (w.pdbs, w.claims, w.slices):
        informer.synced.set()
    await w.reconciler._release_held()
    assert w.reconciler._dirty == {"n0"}
    await w.reconciler.round(["n0"])
    assert evictions(w) == ["/api/v1/namespaces/ml/pods/victim/eviction"]
    assert w.node_obj("n0")["metadata"]["labels"][c.LABEL_STATE] == "draining"


async def test_a_draining_node_keeps_its_drain_while_the_pods_are_listed_again():
    w = World()
    w.node("n0")
    w.pod("victim", "n0")

    def refuse(body: Any) -> Any:
        raise TooManyRequests(429, "TooManyRequests", "Cannot evict pod: disruption budget")

    w.api.hooks[("POST", "/api/v1/namespaces/ml/pods/victim/eviction")] = refuse
    w.signals("n0", xid=79, pods={1: "victim"})
    await w.reconciler.round(["n0"])
    before = w.node_obj("n0")["metadata"]
    assert before["labels"][c.LABEL_STATE] == "draining"
    # A restarted controller: the same node, the pods not listed yet.
    again = World(drain_caches_listed=False)
    again.api.objects["/api/v1/nodes/n0"] = w.node_obj("n0")
    again.nodes.update_local("n0", node_from_json(w.node_obj("n0")), "")
    again.t = w.t + 60
    again.signals("n0", xid=79, pods={1: "victim"})
    await again.reconciler.round(["n0"])
    assert again.api.writes() == [] and evictions(again) == []
    assert again.reconciler._held == {"n0"}


async def test_rounds_start_once_nodes_and_state_are_listed_not_the_pods():
    w = World(drain_caches_listed=False)
    w.state.synced.clear()
    w.node("n0")
    w.signals("n0", xid=79, pods={1: "victim"})
    task = asyncio.create_task(w.reconciler.run())
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        assert w.reconciler.rounds == 0, "the pause switch and breakers are in the state ConfigMap"
        w.state.synced.set()
        await wait_for(lambda: w.tainted() == ["n0"], "the taint before the pods are listed")
        w.pod("victim", "n0")
        for informer in (w.pdbs, w.claims, w.slices):
            informer.synced.set()
        await wait_for(lambda: evictions(w), "the drain once they are")
    finally:
        task.cancel()
        await assert_ends_cancelled(task, "the reconciler lost its cancellation")


async def test_device_taint_rules_wait_for_the_slices():
    w = World(rules=True, drain_caches_listed=False)
    w.node("n0")
    devices = tuple(PlacedDevice(dev(i), f"n0-GPU-{i}", f"n0-GPU-{i}") for i in range(2))
    w.slices.update_local("n0-slice", SliceView("n0", 1, devices), "")
    w.reconciler.rules_served()
    w.signals("n0", xid=79)
    await w.reconciler.round(["n0"])
    assert w.tainted() == ["n0"]
    assert [p for m, p, _ in w.api.calls if p == RULES_PATH] == []
    for informer in (w.pdbs, w.claims, w.slices):
        informer.synced.set()
    await w.reconciler._release_held()
    await w.reconciler.round(w.reconciler._dirty)
    assert [p for m, p, _ in w.api.calls if m == "POST" and p == RULES_PATH] == [RULES_PATH]


async def test_a_look_makes_the_wake_ups_asked_for_before_it_obsolete():
    # Every look derives all the wake-ups a node needs again: the ones asked for before must
    # not each start a chain of looks of their own (with a full pass every 5 minutes, a
    # controller up for an hour looked at every node a dozen times as often as needed).
    w = World()
    w.node("n0")
    w.signals("n0")
    w.reconciler._schedule(w.t + 10, "n0")  # as a drain check or a retry asks
    w.reconciler._schedule(w.t + 5, "n0")
    w.reconciler._schedule(w.t + 20, "n0")
    assert w.reconciler.take_due(w.t + 5) == {"n0"}
    assert w.reconciler.take_due(w.t + 20) == set(), "one pending look a node, the earliest"
    w.reconciler._schedule(w.t + 10, "n0")
    await w.reconciler.round(["n0"])  # looked at, healthy: nothing to look at again for
    assert w.reconciler.take_due(w.t + 10) == set()


async def test_a_heartbeat_keeps_a_healthy_node_from_being_evaluated_again():
    w = World()  # stale after 30 s
    w.node("n0")
    w.signals("n0")
    await w.reconciler.round(["n0"])
    assert w.reconciler.take_due(w.t + 30) == set()  # 30 s old is not stale yet
    w.signals("n0", at=w.t + 25)  # heard from again
    assert w.reconciler.take_due(w.t + 31) == set(), "fresh: no evaluation"
    assert w.reconciler.take_due(w.t + 55) == set()
    # Silent since: stale, and evaluated to say so.
    assert w.reconciler.take_due(w.t + 56) == {"n0"}
    w.t += 56
    await w.reconciler.round(["n0"])
    assert [e["reason"] for e in w.events("GpuSignalsLost")] == ["GpuSignalsLost"]
    assert w.reconciler.take_due(w.t + 1000) == set(), "a dark node waits for its exporter"


async def test_a_round_over_a_fleet_lets_the_lease_and_the_streams_run_meanwhile() -> None:
    w = World()
    for i in range(300):
        w.node(f"n{i:03d}")
        w.signals(f"n{i:03d}", xid=79 if i == 299 else None)
    turns = 0

    async def other_task() -> None:  # the lease renewal, an exporter's stream
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    before = turns
    await w.reconciler.round(w.nodes.items())
    during = turns - before
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert during >= 300 // 64  # a turn every 64 nodes at least, not one after the round
    assert w.tainted() == ["n299"]  # and the round still decided over all of them


async def test_a_round_takes_its_share_of_a_fleet_the_nodes_with_something_wrong_first() -> None:
    """A restart marks every node: the node that broke meanwhile is tainted in the first round,
    not after the whole fleet's; one that breaks while the rest wait moves ahead of them."""
    w = World()
    names = [f"n{i:04d}" for i in range(1200)]
    for name in names:
        w.node(name)
        w.signals(name, xid=79 if name == "n1199" else None)
    w.reconciler.mark(names)
    first = await w.reconciler.next_round(w.t)
    assert len(first) == 512 and first[0] == "n1199"
    await w.reconciler.round(first)
    assert w.tainted() == ["n1199"]
    w.signals("n1100", xid=79)
    w.reconciler.mark(["n1100"])
    second = await w.reconciler.next_round(w.t)
    assert second[0] == "n1100"
    third = await w.reconciler.next_round(w.t)
    assert sorted([*first, *second, *third]) == names  # each once, n1100 not again in its place
    assert await w.reconciler.next_round(w.t) == []


async def test_a_new_leader_looks_again_at_the_nodes_it_may_have_to_act_on_not_the_fleet() -> None:
    w = World(leader=False)
    recorded = json.dumps([{"gpu": "n1-GPU-1", "index": 1, "severity": "critical", "reason": "XidFatal"}])
    for i in range(4):
        quarantine = {
            c.ANNOTATION_QUARANTINED_AT: to_rfc3339(w.t - 60),
            c.ANNOTATION_UNHEALTHY_GPUS: recorded,
        }
        w.node(f"n{i}", annotations=quarantine if i == 1 else None)
        w.signals(f"n{i}", xid=79 if i == 0 else None)
    await w.reconciler.round(w.nodes.items())  # the standby's warm state; nothing written
    assert w.api.writes() == [] and w.reconciler.take_due(w.t) == set()
    w.leader = True
    w.reconciler.leadership_gained()
    # n0 has a finding to act on, n1 a quarantine to keep or lift; n2 and n3 are healthy
    assert w.reconciler.take_due(w.t) == {"n0", "n1"}
    await w.reconciler.round({"n0", "n1"})
    assert w.tainted() == ["n0"]


async def test_a_held_node_read_as_a_whole_waits_for_its_gpus_before_its_drain_goes_on() -> None:
    """After a restart, the Prometheus source's first round may read a quarantined node as a
    whole (it did not know yet that the reconciler holds it): its GPUs unlisted, its pods
    unplaced. Drained on that, a partial drain would evict every GPU pod of the node."""
    before = World()
    before.node("n0")
    before.signals("n0", xid=79, pods={0: "bystander", 1: "victim"})
    await before.reconciler.round(["n0"])
    quarantined = before.node_obj("n0")
    assert quarantined["metadata"]["labels"][c.LABEL_STATE] == "drained", "no pods yet"

    w = World()
    written = w.api.add("/api/v1/nodes/n0", quarantined)
    w.nodes.update_local("n0", node_from_json(written), "")
    w.pod("victim", "n0")
    w.pod("bystander", "n0")
    w.source.nodes["n0"] = NodeReading("n0", w.t, (), busy=True, gpus_read=False)
    await w.reconciler.round(["n0"])
    assert evictions(w) == [] and not any("/pods" in p for _, p, _ in w.api.calls), "nothing listed"
    assert w.reconciler.held_nodes() == {"n0"}, "so the source reads it GPU by GPU"
    w.signals("n0", xid=79, pods={0: "bystander", 1: "victim"})
    await w.reconciler.round(["n0"])
    assert evictions(w) == ["/api/v1/namespaces/ml/pods/victim/eviction"]
