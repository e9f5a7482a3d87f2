"""The controller end to end on the real control plane: faults on simulated exporters become
taints, conditions and evictions; the scheduler and the Deployment controller move the work.
The controller runs as the ServiceAccount of deploy/rbac/controller.yaml, not as admin."""

from __future__ import annotations

import json
import time

import pytest
from controller_harness import (  # noqa: F401 - fixtures
    Scene,
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

from gpumon.controller.core.objects import from_rfc3339
from gpumon.devcluster.waiting import eventually

TAINT = "gpumon.io/gpu-unhealthy"


async def _deployment_on_one_node(scene: Scene, app: str, replicas: int) -> tuple[str, list[client.V1Pod]]:
    """A node carrying ``replicas`` pods of a Deployment (made before any other node exists)."""
    (node,) = await scene.nodes(1)
    pods = await scene.deployment(app, replicas)
    assert {p.spec.node_name for p in pods} == {node}
    return node, pods


async def test_fatal_xid_quarantines_the_node_and_moves_only_the_pod_on_the_bad_gpu(scene: Scene) -> None:
    core, namespace = scene.core, scene.namespace
    bad, pods = await _deployment_on_one_node(scene, "train", 3)
    good = await scene.nodes(2)
    async with exporters([bad, *good]) as ex:
        for gpu, pod in enumerate(pods):  # GPUs 0, 1, 2, as the kubelet would have assigned them
            ex[bad].placement.pods[gpu] = (namespace, pod.metadata.name)
        victim, stay = pods[1], [pods[0], pods[2]]
        async with scene.controller(ex) as ctl:
            faulted = time.time()
            ex[bad].fault(gpu=1, fault="xid", code=79)
            node = await eventually(lambda: tainted(core, bad), what="the bad node tainted")
            fault_to_taint = time.time() - faulted
            assert our_taint(node) == {"key": TAINT, "value": "unhealthy", "effect": "NoSchedule"}
            cond = gpu_condition(node)
            assert cond is not None and cond["status"] == "True" and cond["reason"] == "XidFatal"
            assert ex[bad].uuid(1) in cond["message"]
            (record,) = json.loads(node["metadata"]["annotations"]["gpumon.io/unhealthy-gpus"])
            assert (record["uuid"], record["index"], record["reason"]) == (ex[bad].uuid(1), 1, "XidFatal")
            assert node["metadata"]["annotations"]["gpumon.io/cordon-preexisting"] == "false"

            async def moved() -> list[client.V1Pod] | None:
                now_running = await running_pods(core, namespace, "train")
                names = {p.metadata.name for p in now_running}
                ok = len(now_running) == 3 and victim.metadata.name not in names
                return now_running if ok else None

            after = await eventually(moved, what="the victim's replacement Running", timeout_seconds=90)
            by_name = {p.metadata.name: p for p in after}
            for pod in stay:  # untouched: same pod, same node
                assert by_name[pod.metadata.name].metadata.uid == pod.metadata.uid
                assert by_name[pod.metadata.name].spec.node_name == bad
            (replacement,) = [p for p in after if p.metadata.name not in {s.metadata.name for s in stay}]
            assert replacement.spec.node_name in good

            await wait_for_event(core, "default", bad, "GpuQuarantined")
            await wait_for_event(core, namespace, victim.metadata.name, "GpuPodEvicted")

            async def drained() -> bool | None:
                labels = (await node_obj(core, bad))["metadata"].get("labels", {})
                return True if labels.get("gpumon.io/state") == "drained" else None

            await eventually(drained, what="state label drained")
            # No cache of the fleet's pods: the drain listed the bad node's, and no other's.
            assert ctl.controller.metrics.pod_lists.labels("drain", "ok")._value.get() >= 1
            assert not [i for i in ctl.controller.informers.informers if i.selection.path == "/api/v1/pods"]
            hist = ctl.controller.metrics.fault_to_taint
            assert hist._sum.get() > 0  # measured by the controller too (signal time to write)
            print(f"fault to taint: {fault_to_taint:.3f}s (controller's own measure {hist._sum.get():.3f}s)")


@pytest.mark.parametrize("escalation", ["report", "delete"])
async def test_pdb_allowing_no_disruption_blocks_eviction_until_the_deadline_then_escalates(
    scene: Scene, escalation: str
) -> None:
    core, namespace = scene.core, scene.namespace
    bad, pods = await _deployment_on_one_node(scene, "serve", 2)
    await scene.pdb("keep-both", "serve", min_available=2, allowed=0)
    (good,) = await scene.nodes(1)
    kubeconfig = await scene.kubeconfigs(delete=escalation == "delete")
    async with exporters([bad, good]) as ex:
        for gpu, pod in enumerate(pods):
            ex[bad].placement.pods[gpu] = (namespace, pod.metadata.name)
        victim = pods[0]
        drain = {"deadline_seconds": 4, "escalation": escalation, "retry_initial_seconds": 0.5}
        async with scene.controller(ex, kubeconfig=kubeconfig, drain=drain) as ctl:
            ex[bad].fault(gpu=0, fault="xid", code=79)
            blocked = await wait_for_event(core, "default", bad, "GpuEvictionBlocked")
            assert victim.metadata.name in blocked.message and f"{namespace}/keep-both" in blocked.message
            deadline = await wait_for_event(core, "default", bad, "GpuDrainDeadlineExceeded")
            assert victim.metadata.name in deadline.message and "keep-both" in deadline.message
            evictions = ctl.controller.metrics.evictions
            assert evictions.labels("blocked")._value.get() >= 2  # retried with backoff, then escalated
            if escalation == "report":
                assert "report-only" in deadline.message
                current = {
                    p.metadata.name: p.metadata.uid for p in await running_pods(core, namespace, "serve")
                }
                assert current.get(victim.metadata.name) == victim.metadata.uid  # nothing forced
            else:
                await wait_for_event(core, namespace, victim.metadata.name, "GpuPodDeleted")

                async def replaced() -> bool | None:
                    now = await running_pods(core, namespace, "serve")
                    names = {p.metadata.name for p in now}
                    return True if len(now) == 2 and victim.metadata.name not in names else None

                await eventually(replaced, what="the deleted pod replaced", timeout_seconds=90)
                assert evictions.labels("deleted")._value.get() == 1


async def test_thermal_rule_waits_for_its_duration_and_recovers_only_after_recover_after(
    scene: Scene,
) -> None:
    core = scene.core
    (node,) = await scene.nodes(1)
    hold, recover = 4.0, 4.0
    rules = [{"name": "thermal-unhealthy", "for": hold, "recoverAfter": recover}]
    async with exporters([node]) as ex, scene.controller(ex, policy={"rules": rules}):
        ex[node].fault(gpu=2, fault="overheat", celsius=97)
        tainted_node = await eventually(lambda: tainted(core, node), what="tainted after the `for`")
        ann = tainted_node["metadata"]["annotations"]
        (record,) = json.loads(ann["gpumon.io/unhealthy-gpus"])
        assert record["reason"] == "Thermal" and record["rules"] == ["thermal-unhealthy"]
        first_seen = from_rfc3339(record["firstSeen"])
        quarantined = from_rfc3339(ann["gpumon.io/quarantined-at"])
        assert first_seen is not None and quarantined is not None
        # Timestamps have one-second resolution: allow one second of rounding.
        assert quarantined - first_seen >= hold - 1, "acted before the rule's `for` elapsed"
        ex[node].fault(gpu=2, fault="clear")
        cleared = time.time()

        async def recovered() -> dict | None:
            # Two writes: the taint (metadata and spec), then the condition (status).
            n = await node_obj(core, node)
            cond = gpu_condition(n)
            return n if our_taint(n) is None and cond is not None and cond["status"] == "False" else None

        after = await eventually(recovered, what="taint lifted after recoverAfter")
        cond = gpu_condition(after)
        assert cond is not None and cond["reason"] == "GpuHealthy"
        recovered_at = from_rfc3339(cond["lastTransitionTime"])
        assert recovered_at is not None and recovered_at - cleared >= recover - 1, "recovered too early"
        assert "gpumon.io/unhealthy-gpus" not in after["metadata"].get("annotations", {})
        await wait_for_event(core, "default", node, "GpuRecovered")


async def test_a_node_cordoned_by_a_person_stays_cordoned_after_recovery(scene: Scene) -> None:
    core = scene.core
    person, fresh = await scene.nodes(2)
    await core.patch_node(person, {"spec": {"unschedulable": True}})
    rules = [{"name": "thermal-unhealthy", "for": 0, "recoverAfter": 2}]
    async with (
        exporters([person, fresh]) as ex,
        scene.controller(ex, quarantine={"cordon": True}, policy={"rules": rules}),
    ):
        for n in (person, fresh):
            ex[n].fault(gpu=0, fault="overheat", celsius=98)
        for n in (person, fresh):
            await eventually(lambda n=n: tainted(core, n), what=f"{n} quarantined")
        assert (await node_obj(core, person))["metadata"]["annotations"][
            "gpumon.io/cordon-preexisting"
        ] == "true"
        assert (await node_obj(core, fresh))["spec"]["unschedulable"] is True  # gpumon cordoned this one
        for n in (person, fresh):
            ex[n].fault(gpu=0, fault="clear")

        async def both_recovered() -> list[dict] | None:
            found = [await node_obj(core, n) for n in (person, fresh)]
            return found if all(our_taint(n) is None for n in found) else None

        p, f = await eventually(both_recovered, what="both recovered")
        assert p["spec"].get("unschedulable") is True, "gpumon undid a person's cordon"
        assert not f["spec"].get("unschedulable"), "gpumon left its own cordon behind"
