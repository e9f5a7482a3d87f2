"""The controller across interruptions of the real control plane: the API server restarted in
place mid-quarantine, and the leader killed mid-drain. Afterwards the work resumes with no
action lost and none done twice. What is counted:

- quarantines: one ``GpuQuarantined`` Event per node, no ``GpuQuarantineUpdated``, the node's
  ``quarantined-at`` and ``drain-started-at`` unchanged across the interruption, and
  ``gpumon_controller_actions_total{action="quarantine",result="success"}`` summed over the
  replicas equal to the number of bad nodes;
- evictions: one successful Eviction API call per affected pod: the controllers'
  ``gpumon_controller_evictions_total{result="evicted"}`` equals the number of pods carrying a
  ``GpuPodEvicted`` Event, one each (a second eviction of a pod would raise the count but not
  the Events, which are per pod), every such pod was on a bad node, and the pods on healthy
  GPUs are untouched (same UID, same node). Right after an API server restart kube-scheduler's
  cache can lag and put a replacement on the node just tainted; gpumon evicts that one too, so
  the affected pods are the ones on bad GPUs plus any such newcomer;
- nothing lost: every drain completes (label ``drained``), the condition is set, and every
  evicted pod's replacement runs on a healthy node.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from controller_harness import (  # noqa: F401 - fixtures
    Running,
    Scene,
    events,
    exporters,
    gpu_condition,
    node_obj,
    our_taint,
    running_pods,
    sa_kubeconfig_for_fixture,
    scene_fixture,
    tainted,
    wait_for_event,
)
from kubernetes_asyncio import client

from gpumon.controller.core import contract as c
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.waiting import eventually

APISERVER = "kube-apiserver"
# The API server's other clients in the devcluster, all client-go: see api_server_down.
CLIENTS = ("kube-controller-manager", "kube-scheduler", "kwok")


@dataclass
class Outage:
    # Wall-clock times (as the controller's fault-to-taint latency is measured).
    stopped_at: float = 0.0  # the API server had exited
    started_at: float = 0.0  # spawned again
    healthy_at: float = 0.0  # its /readyz answered
    clients_at: float = 0.0  # kube-controller-manager, kube-scheduler and kwok healthy again


@asynccontextmanager
async def api_server_down(devcluster: DevCluster) -> AsyncIterator[Outage]:
    """The API server stopped for the body and started again in place after it (same port,
    certificates and etcd), also when the body fails, so later tests find a working cluster.
    Stopping and waiting run in threads, so the controller under test keeps running.

    kube-controller-manager, kube-scheduler and kwok are down for the outage too, and started
    afresh once the API server is ready. Left running, they come back on client-go's schedule,
    not ours: each informer retries with a backoff that grows through the outage to 30-60 s,
    and one whose retry lands in the first second after the API server opens its port (RBAC
    not loaded yet) gets 403 Forbidden and waits another round. Measured under load: the
    controller manager's caches stayed at their pre-outage version for over 90 s ("read
    version: 332 is not as new as written version: 381"), so no PDB status, no replacement
    pod, no drain finished. The controller under test lives through the real outage either way."""
    outage = Outage()
    await asyncio.gather(*(asyncio.to_thread(devcluster.stop_component, n) for n in (APISERVER, *CLIENTS)))
    outage.stopped_at = time.time()
    try:
        yield outage
    finally:
        devcluster.start_component(APISERVER)  # from this thread: it owns the cluster's children
        outage.started_at = time.time()
        await asyncio.to_thread(devcluster.wait_healthy, APISERVER)
        outage.healthy_at = time.time()
        for name in CLIENTS:
            devcluster.start_component(name)
        await asyncio.to_thread(devcluster.wait_healthy, *CLIENTS)
        outage.clients_at = time.time()


async def _leading(ctl: Running, leading: bool = True) -> bool | None:
    return True if ctl.controller.is_leader() == leading else None


def _lease_changes(ctl: Running) -> tuple[float, float]:
    """gpumon_controller_leadership_changes_total, gained and lost."""
    changes = ctl.controller.metrics.leadership_changes
    return changes.labels("gained")._value.get(), changes.labels("lost")._value.get()


async def _in_state(core: client.CoreV1Api, node: str, state: c.NodePhase) -> dict[str, Any] | None:
    n = await node_obj(core, node)
    return n if n["metadata"].get("labels", {}).get(c.LABEL_STATE) == state else None


def _failures(ctl: Running) -> dict[str, float]:
    m = ctl.controller.metrics
    (lists,) = m.pod_lists.collect()
    return {
        "quarantine writes": m.actions.labels("quarantine", "error")._value.get(),
        # The pending drain lists its node's pods before it evicts: that list fails first.
        "drain pod lists": sum(
            s.value
            for s in lists.samples
            if s.name.endswith("_total") and s.labels["reader"] == "drain" and s.labels["result"] != "ok"
        ),
        "evictions": m.evictions.labels("error")._value.get(),
        "events": m.events.labels("failed")._value.get(),
    }


async def _failed(ctl: Running) -> bool | None:
    """The quarantine write and the pending drain were both tried, and failed."""
    f = _failures(ctl)
    return True if f["quarantine writes"] >= 1 and f["drain pod lists"] + f["evictions"] >= 1 else None


def _evicted(*ctls: Running) -> int:
    return sum(int(ctl.controller.metrics.evictions.labels("evicted")._value.get()) for ctl in ctls)


def _quarantines(*ctls: Running) -> int:
    return sum(
        int(ctl.controller.metrics.actions.labels("quarantine", "success")._value.get()) for ctl in ctls
    )


async def _check_quarantined_once(core: client.CoreV1Api, node: dict[str, Any]) -> None:
    """Condition set, drain done, and exactly one quarantine on record for this node."""
    name = node["metadata"]["name"]
    cond = gpu_condition(node)
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "XidFatal"), cond
    assert our_taint(node) is not None
    assert len(await events(core, "default", name, "GpuQuarantined")) == 1
    updated = await events(core, "default", name, "GpuQuarantineUpdated")
    assert updated == [], [(e.first_timestamp, e.message) for e in updated]


async def _check_evicted_once(
    core: client.CoreV1Api,
    namespace: str,
    ctls: Sequence[Running],
    affected: list[client.V1Pod],
    bad_nodes: set[str],
) -> set[str]:
    """Every affected pod evicted, none twice, none from a healthy node; the evicted pods' names."""
    found = await core.list_namespaced_event(namespace, field_selector="reason=GpuPodEvicted")
    names = [e.involved_object.name for e in found.items]
    assert len(names) == len(set(names)), names
    assert {p.metadata.name for p in affected} <= set(names), names
    assert _evicted(*ctls) == len(names), f"{_evicted(*ctls)} evictions of {len(names)} pods"
    for e in found.items:
        assert any(f"evicted from node {n}:" in e.message for n in bad_nodes), e.message
    return set(names)


async def _replaced(
    core: client.CoreV1Api, namespace: str, app: str, gone: list[client.V1Pod], healthy: set[str]
) -> list[client.V1Pod] | None:
    """``app``'s pods once every pod of ``gone`` is replaced by one Running on a healthy node."""
    pods = await running_pods(core, namespace, app)
    names = {p.metadata.name for p in pods}
    if any(p.metadata.name in names for p in gone):
        return None
    new = [p for p in pods if p.metadata.uid not in {g.metadata.uid for g in gone}]
    fresh = [p for p in new if p.spec.node_name in healthy]
    return pods if len(fresh) >= len(gone) else None


# How the leader lives through the outage: "held", its renew deadline outlasts the outage, so it
# keeps acting and its writes fail against the stopped server; "lapsed", the harness's
# 3 s deadline passes, it stops acting and leads again once its lease can be renewed.
LEADERSHIP = {
    "held": {"lease_duration_seconds": 90, "renew_deadline_seconds": 60, "retry_period_seconds": 0.5},
    "lapsed": {},
}


@pytest.mark.parametrize("leadership", sorted(LEADERSHIP))
async def test_api_server_restart_mid_quarantine_loses_and_repeats_nothing(
    scene: Scene, devcluster: DevCluster, leadership: str
) -> None:
    core, namespace = scene.core, scene.namespace
    # `bad` is full with two pods of `serve`, a PDB keeping both; `late` (one GPU) takes `train`.
    (bad,) = await scene.nodes(1, gpus=2)
    serve = await scene.deployment("serve", 2)
    (late,) = await scene.nodes(1, gpus=1)
    (train,) = await scene.deployment("train", 1)
    assert {p.spec.node_name for p in serve} == {bad} and train.spec.node_name == late
    await scene.pdb("keep-serve", "serve", min_available=2, allowed=0)
    good = await scene.nodes(2, gpus=2)
    victim, bystander = serve
    async with exporters([bad, late, *good], gpus=2) as ex:
        for gpu, pod in enumerate(serve):  # GPUs 0 and 1, as the kubelet would have assigned them
            ex[bad].placement.pods[gpu] = (namespace, pod.metadata.name)
        ex[late].placement.pods[0] = (namespace, train.metadata.name)
        async with scene.controller(ex, leader=LEADERSHIP[leadership]) as ctl:
            await eventually(lambda: _leading(ctl), what="the controller leads")

            # Quarantined, and its drain pending: the PDB refuses the eviction, retried with backoff.
            ex[bad].fault(gpu=0, fault="xid", code=79)
            blocked = await wait_for_event(core, "default", bad, "GpuEvictionBlocked")
            assert victim.metadata.name in blocked.message
            before = await eventually(lambda: _in_state(core, bad, c.NodePhase.DRAINING), what="draining")
            annotations = before["metadata"]["annotations"]

            latency = ctl.controller.metrics.fault_to_taint
            latency_before = latency._sum.get()
            async with api_server_down(devcluster) as outage:
                # A fault while the API server is gone: seen, judged, but nothing can be written.
                late_fault_at = time.time()
                ex[late].fault(gpu=0, fault="xid", code=79)

                async def judged() -> bool | None:
                    state = ctl.controller.reconciler._states.get(late)
                    return (
                        True if state is not None and any(t.firing for t in state.targets.values()) else None
                    )

                await eventually(judged, what="the new fault judged during the outage")
                if leadership == "held":
                    await eventually(lambda: _failed(ctl), what="writes failing against the stopped server")
                else:
                    await eventually(
                        lambda: _leading(ctl, False), what="leadership lapsed", timeout_seconds=30
                    )
                failed = _failures(ctl)

            health = await asyncio.to_thread(devcluster.health)
            assert all(probe.ok for probe in health.values()), health
            late_tainted = await eventually(
                lambda: tainted(core, late), what="late quarantined", timeout_seconds=90
            )
            # The controller's own fault-to-taint latency for `late` dates the taint's write.
            resumed = late_fault_at + (latency._sum.get() - latency_before) - outage.started_at
            still_draining = await _in_state(core, bad, c.NodePhase.DRAINING)
            assert still_draining is not None
            for key in (c.ANNOTATION_QUARANTINED_AT, c.ANNOTATION_DRAIN_STARTED_AT):
                was, now = annotations[key], still_draining["metadata"]["annotations"][key]
                assert now == was, f"{key} rewritten across the restart"
            # The drain was waiting for the PDB; let one pod go.
            await client.PolicyV1Api(scene.api).patch_namespaced_pod_disruption_budget(
                "keep-serve", namespace, {"spec": {"minAvailable": 1}}
            )
            bad_node = await eventually(
                lambda: _in_state(core, bad, c.NodePhase.DRAINED), what="bad drained", timeout_seconds=90
            )
            late_node = await eventually(
                lambda: _in_state(core, late, c.NodePhase.DRAINED), what="late drained", timeout_seconds=90
            )
            healthy = set(good)
            serve_now = await eventually(
                lambda: _replaced(core, namespace, "serve", [victim], healthy),
                what="victim replaced on a healthy node",
                timeout_seconds=90,
            )
            await eventually(
                lambda: _replaced(core, namespace, "train", [train], healthy),
                what="train replaced on a healthy node",
                timeout_seconds=90,
            )

            for node in (bad_node, late_node):
                await _check_quarantined_once(core, node)
            quarantined_at = bad_node["metadata"]["annotations"][c.ANNOTATION_QUARANTINED_AT]
            assert quarantined_at == annotations[c.ANNOTATION_QUARANTINED_AT]
            (record,) = json.loads(late_tainted["metadata"]["annotations"][c.ANNOTATION_UNHEALTHY_GPUS])
            assert (record["uuid"], record["index"]) == (ex[late].uuid(0), 0)
            evicted = await _check_evicted_once(core, namespace, [ctl], [victim, train], {bad, late})
            assert bystander.metadata.name not in evicted and _quarantines(ctl) == 2
            (still,) = [p for p in serve_now if p.metadata.name == bystander.metadata.name]
            assert (still.metadata.uid, still.spec.node_name) == (bystander.metadata.uid, bad)
            tried = [
                e.message for e in await events(core, "default", bad) if e.reason.startswith("GpuEviction")
            ]
            assert all(bystander.metadata.name not in m for m in tried), tried
            # The counter tells what the gauge, back at 1 by now, cannot: the outage cost the
            # lease where the renew deadline was shorter than it, and only there.
            gained, lost = _lease_changes(ctl)
            assert gained == lost + 1 and (lost >= 1 if leadership == "lapsed" else lost == 0), (gained, lost)
            print(
                f"\nAPI server down {outage.healthy_at - outage.stopped_at:.1f}s (stop -> healthy;"
                f" start -> healthy {outage.healthy_at - outage.started_at:.1f}s, its clients"
                f" {outage.clients_at - outage.healthy_at:.1f}s later); taint for the fault"
                f" seen during the outage written {resumed:.1f}s after the API server was started"
                f" (leadership {leadership}; failed while it was down: {failed});"
                f" {len(evicted)} pods evicted for 2 on bad GPUs;"
                f" informer relists: { {i.name: i.relists for i in ctl.controller.informers.informers} }"
            )


async def test_a_standby_finishes_the_drain_of_a_killed_leader_without_evicting_twice(scene: Scene) -> None:
    core, namespace = scene.core, scene.namespace
    (bad,) = await scene.nodes(1, gpus=2)
    serve = await scene.deployment("serve", 2)
    # One disruption allowed: the first eviction goes through, and its replacement has nowhere
    # to run (the only other GPUs are tainted), so the second eviction is refused for now.
    await scene.pdb("spare-one", "serve", min_available=1, allowed=1)
    # The exporter places no pod on a GPU here, so the whole node drains: both pods go.
    async with exporters([bad], gpus=2) as ex, scene.controller(ex, identity="a") as a:
        await eventually(lambda: _leading(a), what="a leads")
        async with scene.controller(ex, identity="b") as b:
            ex[bad].fault(gpu=0, fault="xid", code=79)
            await wait_for_event(core, "default", bad, "GpuEvictionBlocked")
            assert (_evicted(a), _evicted(b)) == (1, 0)
            draining = await eventually(lambda: _in_state(core, bad, c.NodePhase.DRAINING), what="draining")

            await a.crash()  # mid-drain, no hand-over
            crashed = time.monotonic()
            await eventually(lambda: _leading(b), what="b takes over", timeout_seconds=30)
            took_over = time.monotonic() - crashed

            async def b_tried() -> bool | None:
                return True if b.controller.metrics.evictions.labels("blocked")._value.get() >= 1 else None

            await eventually(b_tried, what="b retries the blocked eviction")
            now = await _in_state(core, bad, c.NodePhase.DRAINING)
            assert now is not None
            key = c.ANNOTATION_DRAIN_STARTED_AT
            assert now["metadata"]["annotations"][key] == draining["metadata"]["annotations"][key], (
                "b restarted the drain's deadline"
            )
            good = await scene.nodes(1, gpus=2)  # room for the replacements: the PDB lets go
            done = await eventually(
                lambda: _in_state(core, bad, c.NodePhase.DRAINED), what="drained by b", timeout_seconds=90
            )
            await eventually(
                lambda: _replaced(core, namespace, "serve", serve, set(good)),
                what="both pods replaced on the healthy node",
                timeout_seconds=90,
            )
            await _check_quarantined_once(core, done)
            await _check_evicted_once(core, namespace, [a, b], serve, {bad})
            assert _evicted(a) == 1 and _quarantines(a, b) == 1
            print(f"\nleader killed mid-drain: standby leading after {took_over:.1f}s, drain completed by it")
