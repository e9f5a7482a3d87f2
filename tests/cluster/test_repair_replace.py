"""The repair ladder's replacement step on the real control plane, through the pool's own
machinery: Cluster API v1.13.6's manager (a Machine deleted, its MachineSet making a new one)
and Karpenter v1.15.0 with its kwok provider (a NodeClaim deleted). The controller runs with the
shipped ServiceAccount and its RBAC (controller-autoscaling.yaml, controller-repair.yaml, or
without the latter where that is what a test is about).

Beside it, Karpenter's own node repair (its NodeRepair gate on in the session's Karpenter): it
replaces a node holding a condition its kwok provider's repair policies name, and leaves a node
gpumon quarantines alone until one does.

Where the tests stop: kwok runs no containers, so the reboot Job before a replacement is a pod
held by a scheduling gate that never runs (the reboot times out); the replacement itself is
Cluster API's and Karpenter's own controllers, unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from capi_pools import CapiPool, PoolFactory, at_size, create
from controller_harness import (  # noqa: F401 - fixtures
    TEST_LABEL,
    KubeconfigFactory,
    controller_config,
    events,
    exporters,
    fresh_signals,
    node_obj,
    running,
    running_pods,
    sa_kubeconfig_for_fixture,
    tainted,
    wait_for_event,
)
from kubernetes_asyncio import client
from metrics_text import parse, select
from test_cluster_api_pools import mhc_object, pool_config
from test_karpenter_pools import (  # noqa: F401 - the fixture
    TAINT_KEY,
    deployment_on_a_karpenter_node,
    gpu_pod,
    moved_off,
    node_pool,
    quarantined,
)
from test_repair_ladder import NEVER, ladder_done

from gpumon.config.controller import ControllerConfig
from gpumon.controller.core import contract as c
from gpumon.controller.core.node_owner import NodeOwner, node_owner
from gpumon.devcluster import capi, karpenter, nodes
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.waiting import eventually

STATE = "gpumon-controller"
SA = "gpumon-controller"
HOLD = "test.gpumon.io/hold"  # a finalizer that keeps a deleted object there until the test lets go


def machine_deletes(audit_log: Path, machine: str) -> list[str]:
    """Who deleted the Machine, once per request, by the API server's audit log (its policy
    records every delete of a Machine: gpumon.devcluster.components.audit_policy)."""
    users = []
    for line in audit_log.read_text().splitlines():
        event: dict[str, Any] = json.loads(line)
        ref = event.get("objectRef") or {}
        if event.get("verb") == "delete" and ref.get("resource") == "machines" and ref.get("name") == machine:
            users.append(event["user"]["username"])
    return users


async def metrics_text(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        return await resp.text()


async def replacements(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    cm = await core.read_namespaced_config_map(STATE, namespace)
    annotations = cm.metadata.annotations or {}
    return {k: v for k, v in annotations.items() if k.startswith(c.REPLACEMENT_ANNOTATION_PREFIX)}


@contextlib.asynccontextmanager
async def watching_replicas(read: Any) -> AsyncIterator[list[int]]:
    """The pool's replicas read every 0.2 s while the block runs."""
    seen: list[int] = []

    async def poll() -> None:
        while True:
            seen.append(await read())
            await asyncio.sleep(0.2)

    task = asyncio.create_task(poll())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def reboot_asked(
    pool: CapiPool, names: list[str], namespace: str, test_id: str, kubeconfig: Path, repair: dict[str, Any]
) -> AsyncIterator[tuple[Any, list[int], ControllerConfig]]:
    """The pool's nodes' exporters and the controller running with ``repair`` on the pool; once
    both nodes' signals are fresh, the first node's GPU 0 asks for a node reboot. Yields the
    running controller, the pool's replicas as read every 0.2 s, and the controller's config
    (the exporters serve until the block ends, for a second controller)."""
    pools = [
        pool_config(pool, test_id, min_replicas=2, max_replicas=4, replace_quarantined=False, repair=repair)
    ]
    async with exporters(names, gpus=8) as ex:
        cfg = controller_config(
            kubeconfig=kubeconfig,
            namespace=namespace,
            test_id=test_id,
            endpoints={n: e.url for n, e in ex.items()},
            pools=pools,
        )
        async with running(cfg) as ctl, watching_replicas(pool.replicas) as seen:
            await eventually(lambda: fresh_signals(ctl, 2), what="both nodes' signals")
            ex[names[0]].fault(gpu=0, fault="recovery_action", action="node_reboot")
            yield ctl, seen, cfg


async def test_a_reboot_that_never_finishes_is_followed_by_the_machine_replaced_through_cluster_api(
    api: client.ApiClient,
    devcluster: DevCluster,
    namespace: str,
    test_id: str,
    capi_pool: PoolFactory,
    sa_kubeconfig_for: KubeconfigFactory,
) -> None:
    """A GPU whose driver asks for a node reboot; the reboot Job never runs and the attempt
    times out at its deadline; the ladder deletes the node's Machine, Cluster API drains and
    deletes the Node and its MachineSet makes a new Machine whose Node joins. The pool's
    replicas stay 2 throughout, the autoscaler watching it neither scales up nor down, and the
    replacement is recorded on the controller's ConfigMap until it succeeded (Event on the
    MachineDeployment)."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    pool = await capi_pool(replicas=2)
    names = sorted(await eventually(lambda: at_size(pool, 2), what="2 nodes", timeout_seconds=90))
    bad = names[0]
    machine = {node: m for m, node in (await pool.linked()).items()}[bad]
    kubeconfig: Path = await sa_kubeconfig_for(autoscaling=True, repair=True)
    repair = {
        "steps": ["reboot", "replace"],
        "reboot_job": NEVER,
        "reboot_deadline_seconds": 6,
        "replace_deadline_seconds": 120,
    }
    async with reboot_asked(pool, names, namespace, test_id, kubeconfig, repair) as (ctl, seen, _):

        async def deleting() -> bool | None:
            machines = {m["metadata"]["name"]: m for m in await pool.machines()}
            m = machines.get(machine)
            return True if m is None or m["metadata"].get("deletionTimestamp") else None

        await eventually(deleting, what="the bad node's Machine deleting", timeout_seconds=60)
        deleted_at = time.monotonic()
        (escalated,) = await events(core, "default", bad, "GpuRepairEscalated")
        assert "reboot timed_out: now replace" in escalated.message, escalated.message
        recorded = await replacements(core, namespace)
        assert len(recorded) == 1 and bad in next(iter(recorded.values())), recorded

        async def replaced() -> set[str] | None:
            now = await at_size(pool, 2)
            return now if now and bad not in now else None

        after = await eventually(replaced, what="a new node in the pool", timeout_seconds=120)
        (joined,) = after - set(names)
        done = await wait_for_event(core, namespace, pool.name, "GpuRepairSucceeded", seconds=60)
        print(f"Machine deleting -> replacement recorded as succeeded: {time.monotonic() - deleted_at:.1f}s")
        assert bad in done.message and f"Machine {machine} is gone" in done.message, done.message
        assert joined in done.message, done.message
        assert await replacements(core, namespace) == {}, "the record goes with its end"
        metrics = await metrics_text(ctl.url)
    assert set(seen) == {2}, f"the pool's replicas moved during the swap: {sorted(set(seen))}"
    scaled = [
        e.reason
        for e in await events(core, namespace, pool.name)
        if e.reason in ("GpuPoolScaleUp", "GpuPoolScaleDown", "GpuPoolScaledDown")
    ]
    assert scaled == [], scaled
    assert machine not in {m["metadata"]["name"] for m in await pool.machines()}
    assert len(await pool.machines()) == 2
    assert f"system:serviceaccount:{namespace}:{SA}" in machine_deletes(devcluster.layout.audit_log, machine)
    for line in (
        'gpumon_controller_repairs_total{result="timed_out",step="reboot"} 1.0',
        'gpumon_controller_repairs_total{result="started",step="replace"} 1.0',
        'gpumon_controller_repairs_total{result="succeeded",step="replace"} 1.0',
    ):
        assert line in metrics, line
    md = await custom.get_namespaced_custom_object(
        capi.GROUP, capi.VERSION, namespace, capi.MACHINE_DEPLOYMENTS, pool.name
    )
    assert md["spec"]["replicas"] == 2


async def test_a_machine_health_check_covering_the_machine_replaces_the_node_gpumon_deleting_nothing(
    api: client.ApiClient,
    devcluster: DevCluster,
    namespace: str,
    test_id: str,
    capi_pool: PoolFactory,
    sa_kubeconfig_for: KubeconfigFactory,
) -> None:
    """A pool that replaces straight away, its Machines judged by a MachineHealthCheck that
    watches GpuReplacementRequested=True: the ladder sets that condition on the bad node and
    deletes nothing; Cluster API's health check marks the Machine, its MachineSet deletes it and
    makes a new one. By the API server's audit log, only Cluster API deleted the Machine; the
    pool's replicas stay 2 and the replacement ends as succeeded."""
    core = client.CoreV1Api(api)
    pool = await capi_pool(replicas=2)
    names = sorted(await eventually(lambda: at_size(pool, 2), what="2 nodes", timeout_seconds=90))
    mhc = capi.machine_health_check(
        pool.name, namespace, deployment=pool.name, conditions=[(c.REPLACEMENT_CONDITION_TYPE, "True", 0)]
    )
    await create(api, namespace, mhc)

    async def judging() -> bool | None:
        return True if ((await mhc_object(pool)).get("status") or {}).get("expectedMachines") == 2 else None

    await eventually(judging, what="the MachineHealthCheck judging both Machines", timeout_seconds=90)
    bad = names[0]
    machine = {node: m for m, node in (await pool.linked()).items()}[bad]
    kubeconfig: Path = await sa_kubeconfig_for(autoscaling=True, repair=True)
    repair = {"steps": ["replace"], "replace_immediately": True, "replace_deadline_seconds": 120}
    async with reboot_asked(pool, names, namespace, test_id, kubeconfig, repair) as (_, seen, _):
        asked = await wait_for_event(core, "default", bad, "GpuRepairReplaceRequested", seconds=60)
        asked_at = time.monotonic()
        assert f"MachineHealthCheck {pool.name} covers Machine {machine}" in asked.message, asked.message
        conditions = {x["type"]: x for x in (await node_obj(core, bad))["status"]["conditions"]}
        assert conditions[c.REPLACEMENT_CONDITION_TYPE]["status"] == "True"

        async def replaced() -> set[str] | None:
            now = await at_size(pool, 2)
            return now if now and bad not in now else None

        await eventually(replaced, what="a new node in the pool", timeout_seconds=120)
        print(f"GpuReplacementRequested set -> a new node in the pool: {time.monotonic() - asked_at:.1f}s")
        done = await wait_for_event(core, namespace, pool.name, "GpuRepairSucceeded", seconds=60)
        assert f"Machine {machine} is gone" in done.message, done.message
        blind = [e for e in await events(core, "default", bad) if e.reason == "GpuRepairHealthCheckBlind"]
        assert blind == [], "the check watches the condition"
    assert set(seen) == {2}, f"the pool's replicas moved during the swap: {sorted(set(seen))}"
    deleters = set(machine_deletes(devcluster.layout.audit_log, machine))
    assert deleters and f"system:serviceaccount:{namespace}:{SA}" not in deleters, deleters


@dataclass(frozen=True)
class Owner:
    """What a replacement deletes (a Machine, a NodeClaim), as the test reads it."""

    what: str
    there: Callable[[], Awaitable[bool]]  # there and not deleting

    async def going(self) -> bool | None:
        return None if await self.there() else True


async def refused_until_granted(
    controller: contextlib.AbstractAsyncContextManager[tuple[Any, ...]],
    core: client.CoreV1Api,
    bad: str,
    owner: Owner,
    sa_kubeconfig_for: KubeconfigFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``controller`` runs without controller-repair.yaml, the replacement of ``bad`` asked for
    (it yields the running controller first). The refusal (403) is told in one
    GpuRepairReplaceUnavailable Event over four more repair rounds, the owner still there; the
    RBAC applied, the next try deletes the owner. Each refusal counted, the outage logged once
    and its end once, no task restarted."""
    with caplog.at_level("INFO", logger="gpumon.controller.shell.replacements"):
        async with controller as (ctl, *_):
            metrics = await _refused_then_granted(ctl, core, bad, owner, sa_kubeconfig_for)
    said = [r.getMessage() for r in caplog.records]
    assert said.count("repair replacement unavailable") == 1, "logged once per outage"
    assert "repair replacement available again" in said
    counted = [x for x in metrics.splitlines() if x.startswith("gpumon_controller_repair_errors_total{")]
    assert counted and all('error="KubeError"' in line for line in counted), counted
    assert 'gpumon_controller_task_restarts_total{task="repair"}' not in metrics, "nothing crashed"


async def _refused_then_granted(
    ctl: Any, core: client.CoreV1Api, bad: str, owner: Owner, sa_kubeconfig_for: KubeconfigFactory
) -> str:
    """The controller's metrics as they were before the grant."""
    told = await wait_for_event(core, "default", bad, "GpuRepairReplaceUnavailable", seconds=60)
    assert "deploy/rbac/controller-repair.yaml" in told.message and "403" in told.message, told.message
    loop = ctl.controller.repair
    assert loop is not None
    after = loop.rounds + 4

    async def four_more_rounds() -> bool | None:
        return True if loop.rounds >= after else None

    await eventually(four_more_rounds, what="four more repair rounds", timeout_seconds=60)
    metrics = await metrics_text(ctl.url)
    assert len(await events(core, "default", bad, "GpuRepairReplaceUnavailable")) == 1
    assert await owner.there(), f"the {owner.what} went without the RBAC"
    await sa_kubeconfig_for(autoscaling=True, repair=True)  # a person applies the RBAC
    await eventually(owner.going, what=f"the {owner.what} deleting once granted", timeout_seconds=120)
    return metrics


REPLACE_AT_ONCE = {"steps": ["replace"], "replace_immediately": True, "replace_deadline_seconds": 300}


async def test_without_rbac_for_machines_the_refusal_is_told_once_and_the_swap_follows_the_grant(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    capi_pool: PoolFactory,
    sa_kubeconfig_for: KubeconfigFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pool that replaces straight away, its controller without controller-repair.yaml: the
    API refuses it the node's Machine (403), which is counted each time, logged and told in a
    GpuRepairReplaceUnavailable Event once for the outage, and asked again with backoff; nothing
    crashes and the Machine stays. Once the RBAC is applied, the next try goes through: the
    Machine is replaced and the outage's end is logged."""
    core = client.CoreV1Api(api)
    pool = await capi_pool(replicas=2)
    names = sorted(await eventually(lambda: at_size(pool, 2), what="2 nodes", timeout_seconds=90))
    bad = names[0]
    machine = {node: m for m, node in (await pool.linked()).items()}[bad]

    async def read() -> dict[str, Any] | None:
        return {m["metadata"]["name"]: m for m in await pool.machines()}.get(machine)

    async def there() -> bool:
        m = await read()
        return m is not None and not m["metadata"].get("deletionTimestamp")

    kubeconfig: Path = await sa_kubeconfig_for(autoscaling=True)
    controller = reboot_asked(pool, names, namespace, test_id, kubeconfig, REPLACE_AT_ONCE)
    await refused_until_granted(controller, core, bad, Owner("Machine", there), sa_kubeconfig_for, caplog)


async def test_without_rbac_for_node_claims_the_refusal_is_told_once_and_the_deletion_follows_the_grant(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    node_pool: str,  # noqa: F811 - the fixture
    sa_kubeconfig_for: KubeconfigFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same for a Karpenter node (#27, missing RBAC for NodeClaims): the API refuses the
    controller the node's NodeClaim (403), counted each time, logged and told once for the
    outage, asked again with backoff, nothing crashing and the NodeClaim left alone; once the
    RBAC is applied the next try deletes the NodeClaim."""
    core = client.CoreV1Api(api)
    bad, owner = await karpenter_node(api, namespace, test_id, node_pool)
    pool = {**await karpenter_pool(api, namespace, test_id, node_pool), "repair": REPLACE_AT_ONCE}

    async def there() -> bool:
        try:
            claim = await client.CustomObjectsApi(api).get_cluster_custom_object(
                karpenter.GROUP, karpenter.VERSION, karpenter.NODE_CLAIMS, owner.name
            )
        except client.ApiException as e:
            if e.status == 404:
                return False
            raise
        return not claim["metadata"].get("deletionTimestamp")

    kubeconfig: Path = await sa_kubeconfig_for(autoscaling=True)
    controller = controlling(bad, pool, namespace, test_id, kubeconfig, fault="node_reboot")
    await refused_until_granted(controller, core, bad, Owner("NodeClaim", there), sa_kubeconfig_for, caplog)


async def test_a_controller_killed_mid_replacement_is_followed_by_one_that_finishes_it_deleting_nothing(
    api: client.ApiClient,
    devcluster: DevCluster,
    namespace: str,
    test_id: str,
    capi_pool: PoolFactory,
    sa_kubeconfig_for: KubeconfigFactory,
) -> None:
    """The first controller deletes the bad node's Machine and is killed at once. A test
    finalizer on the Machine and on its Node holds both there, deleting, so the second
    controller, once it leads, finds the Node's record running the replacement and its Machine
    deleting: over three of its rounds it deletes nothing. Released, Cluster API finishes and
    the second controller ends the replacement as succeeded from the ConfigMap's record. By the
    API server's audit log gpumon's ServiceAccount deleted the Machine exactly once."""
    core = client.CoreV1Api(api)
    pool = await capi_pool(replicas=2)
    names = sorted(await eventually(lambda: at_size(pool, 2), what="2 nodes", timeout_seconds=90))
    bad = names[0]
    machine = {node: m for m, node in (await pool.linked()).items()}[bad]
    kubeconfig: Path = await sa_kubeconfig_for(autoscaling=True, repair=True)
    repair = {"steps": ["replace"], "replace_immediately": True, "replace_deadline_seconds": 300}
    user = f"system:serviceaccount:{namespace}:{SA}"
    custom = client.CustomObjectsApi(api)

    async def read_machine() -> dict[str, Any]:
        obj: dict[str, Any] = await custom.get_namespaced_custom_object(
            capi.GROUP, capi.VERSION, namespace, capi.MACHINES, machine
        )
        return obj

    async def hold(held: bool) -> None:
        for obj, write in (
            (
                await read_machine(),
                lambda body: custom.patch_namespaced_custom_object(
                    capi.GROUP,
                    capi.VERSION,
                    namespace,
                    capi.MACHINES,
                    machine,
                    body,
                    _content_type="application/merge-patch+json",
                ),
            ),
            (
                await node_obj(core, bad),
                lambda body: core.patch_node(bad, body, _content_type="application/merge-patch+json"),
            ),
        ):
            kept = [f for f in obj["metadata"].get("finalizers") or () if f != HOLD]
            await write({"metadata": {"finalizers": [*kept, HOLD] if held else kept}})

    await hold(True)
    async with reboot_asked(pool, names, namespace, test_id, kubeconfig, repair) as (first, _, cfg):

        async def deleting() -> bool | None:
            return True if (await read_machine())["metadata"].get("deletionTimestamp") else None

        await eventually(deleting, what="the Machine deleting", timeout_seconds=60)
        await first.crash()
        assert len(await replacements(core, namespace)) == 1, "recorded before the delete"
        async with running(cfg.model_copy(update={"identity": "c1"})) as second:
            loop = second.controller.repair
            assert loop is not None

            async def three_rounds() -> bool | None:
                return True if loop.rounds >= 3 else None

            await eventually(three_rounds, what="three rounds of the second controller", timeout_seconds=60)
            assert await node_obj(core, bad), "the Node held there, its record running the replacement"
            assert machine_deletes(devcluster.layout.audit_log, machine).count(user) == 1
            await hold(False)
            done = await wait_for_event(core, namespace, pool.name, "GpuRepairSucceeded", seconds=120)
            assert f"Machine {machine} is gone" in done.message, done.message
            assert await replacements(core, namespace) == {}
    started = [e for e in await events(core, "default", bad, "GpuRepairStarted") if "replace" in e.message]
    assert len(started) == 1, [e.message for e in started]
    deletes = machine_deletes(devcluster.layout.audit_log, machine)
    assert deletes.count(user) == 1, deletes


@contextlib.asynccontextmanager
async def controlling(
    node: str,
    pool: dict[str, Any],
    namespace: str,
    test_id: str,
    kubeconfig: Path,
    *,
    fault: str | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """The node's exporter and the controller with ``pool``, once the node's signals are fresh;
    with ``fault``, the node's GPU 2 then asks for that recovery action. Yields the running
    controller and the node's exporter."""
    async with exporters([node], gpus=8) as ex:
        cfg = controller_config(
            kubeconfig=kubeconfig,
            namespace=namespace,
            test_id=test_id,
            endpoints={node: ex[node].url},
            pools=[pool],
        )
        async with running(cfg) as ctl:
            await eventually(lambda: fresh_signals(ctl, 1), what="the node's signals")
            if fault is not None:
                ex[node].fault(gpu=2, fault="recovery_action", action=fault)
            yield ctl, ex[node]


async def no_consolidation(api: client.ApiClient, pool: str) -> None:
    """The NodePool's consolidation off (``consolidateAfter: Never``)."""
    await client.CustomObjectsApi(api).patch_cluster_custom_object(
        karpenter.GROUP,
        karpenter.VERSION,
        karpenter.NODE_POOLS,
        pool,
        {"spec": {"disruption": {"consolidateAfter": "Never"}}},
        _content_type="application/merge-patch+json",
    )


async def karpenter_node(
    api: client.ApiClient, namespace: str, test_id: str, pool: str
) -> tuple[str, NodeOwner]:
    """A node Karpenter launched for a pod, the pod gone again, and its NodeClaim: the node
    stays while it is empty (consolidation off for the NodePool)."""
    core = client.CoreV1Api(api)
    await no_consolidation(api, pool)
    await core.create_namespaced_pod(namespace, gpu_pod("first", test_id))

    async def placed() -> str | None:
        pod = await core.read_namespaced_pod("first", namespace)
        return pod.spec.node_name if pod.status.phase == "Running" else None

    node = await eventually(placed, what="Karpenter's node running the pod", timeout_seconds=90)
    owner = node_owner(await node_obj(core, node))
    assert owner is not None and owner.kind == "NodeClaim"
    await core.delete_namespaced_pod("first", namespace, grace_period_seconds=0)
    return node, owner


async def karpenter_pool(api: client.ApiClient, namespace: str, test_id: str, pool: str) -> dict[str, Any]:
    """A gpumon pool over the NodePool's nodes; its /scale target (a MachineDeployment nothing
    reconciles) is refused for scaling, and is where the pool's Events go."""
    md = capi.machine_deployment(test_id, namespace, replicas=0)
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        capi.GROUP, capi.VERSION, namespace, capi.MACHINE_DEPLOYMENTS, md
    )
    return {
        "name": "karpenter",
        "target": {"namespace": namespace, "name": test_id},
        "node_selector": f"{karpenter.NODEPOOL_LABEL}={pool}",
        "template": {"resources": {nodes.GPU: 8}, "labels": {TEST_LABEL: test_id}},
        "max_replicas": 4,
    }


async def node_claim_gone(api: client.ApiClient, name: str) -> bool | None:
    try:
        await client.CustomObjectsApi(api).get_cluster_custom_object(
            karpenter.GROUP, karpenter.VERSION, karpenter.NODE_CLAIMS, name
        )
    except client.ApiException as e:
        return True if e.status == 404 else None
    return None


async def test_a_flapping_gpu_has_its_karpenter_node_claim_deleted(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    node_pool: str,  # noqa: F811 - the fixture
    sa_kubeconfig_for: KubeconfigFactory,
) -> None:
    """A Karpenter node's GPU asks for a reset; the reset runs and the GPU comes back; the same
    GPU faults again within the flap window, so the ladder goes straight to replacement and
    deletes the node's NodeClaim, although the quarantined node carries
    ``karpenter.sh/do-not-disrupt``: that annotation holds Karpenter's own disruption, not an
    explicit deletion. Karpenter drains and removes the node; the replacement ends when the
    NodeClaim is gone."""
    core = client.CoreV1Api(api)
    bad, owner = await karpenter_node(api, namespace, test_id, node_pool)
    pool = {
        **await karpenter_pool(api, namespace, test_id, node_pool),
        "repair": {
            "steps": ["reset", "replace"],
            # The test's NodePool taints its nodes with the test's key: the Job tolerates it.
            "reset_job": {
                "template": {
                    "spec": {
                        "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
                        "containers": [{"name": "step", "image": "nvidia/cuda:12"}],
                    }
                }
            },
            "reset_deadline_seconds": 60,
            "replace_deadline_seconds": 120,
            "flap_window_seconds": 600,
        },
    }
    kubeconfig: Path = await sa_kubeconfig_for(autoscaling=True, repair=True)
    async with controlling(bad, pool, namespace, test_id, kubeconfig) as (ctl, exporter):
        exporter.fault(gpu=2, fault="recovery_action", action="gpu_reset")
        await eventually(lambda: tainted(core, bad), what="the Karpenter node quarantined")
        await wait_for_event(core, "default", bad, "GpuRepairStarted", seconds=60)
        await eventually(lambda: _reset_done(api, namespace), what="the reset Job done", timeout_seconds=90)
        exporter.fault(gpu=2, fault="clear")  # the reset's effect
        uuid = exporter.uuid(2)
        await eventually(ladder_done(core, bad, uuid), what="the GPU back in service", timeout_seconds=90)

        exporter.fault(gpu=2, fault="recovery_action", action="gpu_reset")  # the same GPU again
        quarantined = await eventually(lambda: tainted(core, bad), what="quarantined again")
        assert quarantined["metadata"]["annotations"][c.KARPENTER_DO_NOT_DISRUPT_ANNOTATION] == "true"

        again_at = time.monotonic()
        await eventually(
            lambda: node_claim_gone(api, owner.name),
            what="the NodeClaim deleted by Karpenter",
            timeout_seconds=120,
        )
        print(f"quarantined again -> NodeClaim gone: {time.monotonic() - again_at:.1f}s")
        assert bad not in {n.metadata.name for n in (await core.list_node()).items}, "its Node went first"
        (started,) = [
            e for e in await events(core, "default", bad, "GpuRepairStarted") if "replace" in e.message
        ]
        assert f"faulted again within 600s of a repair: {uuid}" in started.message, started.message
        done = await wait_for_event(core, namespace, test_id, "GpuRepairSucceeded", seconds=60)
        assert f"NodeClaim {owner.name} is gone" in done.message, done.message
        assert await replacements(core, namespace) == {}
        metrics = await metrics_text(ctl.url)
        for line in (
            'gpumon_controller_repairs_total{result="succeeded",step="reset"} 1.0',
            'gpumon_controller_repairs_total{result="started",step="replace"} 1.0',
            'gpumon_controller_repairs_total{result="succeeded",step="replace"} 1.0',
        ):
            assert line in metrics, line


async def test_an_open_breaker_holds_the_node_claims_deletion_until_a_person_closes_it(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    node_pool: str,  # noqa: F811 - the fixture
    sa_kubeconfig_for: KubeconfigFactory,
) -> None:
    """A Karpenter pool that replaces straight away, its breaker opened by a person (on the
    controller's ConfigMap): a GPU asking for a reboot quarantines the node and the replacement
    is refused with the breaker's reason; over two more rounds of the repair loop the NodeClaim
    is not deleted and no replacement is recorded. Closed, the NodeClaim goes."""
    core = client.CoreV1Api(api)
    bad, owner = await karpenter_node(api, namespace, test_id, node_pool)
    pool = {
        **await karpenter_pool(api, namespace, test_id, node_pool),
        "repair": {"steps": ["replace"], "replace_immediately": True, "replace_deadline_seconds": 120},
    }
    key = f"{c.BREAKER_ANNOTATION_PREFIX}{pool['name']}"
    opened = json.dumps({"openedAt": "2026-01-01T00:00:00Z", "reason": "a person said so"})

    async def breaker(value: str | None) -> None:
        await core.patch_namespaced_config_map(STATE, namespace, {"metadata": {"annotations": {key: value}}})

    kubeconfig: Path = await sa_kubeconfig_for(autoscaling=True, repair=True)
    async with controlling(bad, pool, namespace, test_id, kubeconfig) as (ctl, exporter):
        await breaker(opened)
        exporter.fault(gpu=2, fault="recovery_action", action="node_reboot")
        refused = await wait_for_event(core, "default", bad, "GpuRepairRefused", seconds=60)
        assert "circuit breaker open" in refused.message and "a person said so" in refused.message
        loop = ctl.controller.repair
        assert loop is not None
        first = loop.rounds

        async def two_more_rounds() -> bool | None:
            return True if loop.rounds >= first + 2 else None

        await eventually(two_more_rounds, what="two more repair rounds", timeout_seconds=60)
        claim = await client.CustomObjectsApi(api).get_cluster_custom_object(
            karpenter.GROUP, karpenter.VERSION, karpenter.NODE_CLAIMS, owner.name
        )
        assert not claim["metadata"].get("deletionTimestamp"), "deleted through an open breaker"
        assert await replacements(core, namespace) == {}
        await breaker(None)  # a person closes it
        await eventually(
            lambda: node_claim_gone(api, owner.name),
            what="the NodeClaim deleted once the breaker closed",
            timeout_seconds=120,
        )
        done = await wait_for_event(core, namespace, test_id, "GpuRepairSucceeded", seconds=60)
        assert f"NodeClaim {owner.name} is gone" in done.message, done.message


async def _reset_done(api: client.ApiClient, namespace: str) -> bool | None:
    jobs = (await client.BatchV1Api(api).list_namespaced_job(namespace)).items
    return True if any((j.status.succeeded or 0) > 0 for j in jobs) else None


# --- Karpenter's own node repair (its NodeRepair gate is on in the session's Karpenter) ---------

# The kwok provider's simulated fault, one of its repair policies: replace once held 30 s (drain
# bound 45 s) (sigs.k8s.io/karpenter@v1.15.0 kwok/cloudprovider/cloudprovider.go:188, 218-225).
# The 30 s count from the condition's lastTransitionTime, never from before the Node's creation
# (pkg/controllers/node/health/policy.go:322-326, 347).
KWOK_UNHEALTHY = "KWOKUnhealthy"
KWOK_TOLERATION_SECONDS = 30.0
# Karpenter's disruption controller runs its methods, repair first, every 10 s while none acts
# (pkg/controllers/disruption/controller.go:72, 105-110, 192); each run counts one here.
REPAIR_PASSES = "karpenter_voluntary_disruption_decision_evaluation_duration_seconds_count"
REPAIR_ELIGIBLE = "karpenter_voluntary_disruption_eligible_nodes"


async def kwok_unhealthy(core: client.CoreV1Api, node: str) -> None:
    """``KWOKUnhealthy=True`` on the Node, as a node agent would set a condition a repair policy
    names; its transition at the Node's creation, the earliest Karpenter counts from."""
    created = (await node_obj(core, node))["metadata"]["creationTimestamp"]
    condition = {
        "type": KWOK_UNHEALTHY,
        "status": "True",
        "reason": "SimulatedFault",
        "message": "set by the test",
        "lastTransitionTime": created,
        "lastHeartbeatTime": created,
    }
    await core.patch_node_status(node, {"status": {"conditions": [condition]}})


async def karpenter_repair_metrics(devcluster: DevCluster) -> tuple[float, float]:
    """Karpenter's repair passes so far and the nodes its last pass found eligible for repair."""
    (component,) = [x for x in devcluster.components if x.name == "karpenter"]
    port = next(a.split("=", 1)[1] for a in component.argv if a.startswith("--metrics-port="))
    series = parse(await metrics_text(f"http://127.0.0.1:{port}"))
    passes = select(series, REPAIR_PASSES, reason="unhealthy")
    eligible = select(series, REPAIR_ELIGIBLE, reason="unhealthy")
    return sum(passes.values()), sum(eligible.values())


async def test_karpenters_repair_replaces_a_node_held_past_its_policys_toleration(
    api: client.ApiClient,
    devcluster: DevCluster,
    namespace: str,
    test_id: str,
    node_pool: str,  # noqa: F811 - the fixture
) -> None:
    """The session's Karpenter runs with NodeRepair on. A Deployment's pod on a Karpenter node
    (consolidation off for the NodePool); the Node gets the kwok provider's KWOKUnhealthy=True
    (transition at the Node's creation: Karpenter's 30 s toleration runs from there). Karpenter's
    repair, the only disruption method that acts on a condition, selects the KWOKUnhealthy policy,
    disrupts the node for reason Unhealthy, runs the pod on a new node of the NodePool and deletes
    the old NodeClaim. Without the gate nothing of this happens."""
    core = client.CoreV1Api(api)
    await no_consolidation(api, node_pool)
    first, owner = await deployment_on_a_karpenter_node(api, namespace, test_id)
    bad = first.spec.node_name
    await kwok_unhealthy(core, bad)
    set_at = time.monotonic()
    disrupting = await wait_for_event(core, "default", bad, "DisruptionTerminating", seconds=120)
    assert disrupting.message == "Disrupting Node: Unhealthy", disrupting.message
    await eventually(
        lambda: node_claim_gone(api, owner.name), what="the NodeClaim replaced", timeout_seconds=120
    )
    print(f"{KWOK_UNHEALTHY} set -> NodeClaim gone: {time.monotonic() - set_at:.1f}s")
    moved = await eventually(
        lambda: moved_off(core, namespace, bad), what="the pod Running on a new node", timeout_seconds=60
    )
    new = await node_obj(core, moved.spec.node_name)
    assert new["metadata"]["labels"][karpenter.NODEPOOL_LABEL] == node_pool
    now = node_owner(new)
    assert now is not None and now.name != owner.name
    log = (devcluster.layout.logs / "karpenter.log").read_text(errors="replace").splitlines()
    selected = [line for line in log if "selected repair policy" in line and bad in line]
    assert selected and f'"condition":"{KWOK_UNHEALTHY}"' in selected[0], selected


async def test_karpenters_repair_leaves_a_gpumon_quarantine_alone_until_one_of_its_policies_matches(
    api: client.ApiClient,
    devcluster: DevCluster,
    namespace: str,
    test_id: str,
    node_pool: str,  # noqa: F811 - the fixture
    sa_kubeconfig_for: KubeconfigFactory,
) -> None:
    """With NodeRepair on: a Deployment's pod on a Karpenter node whose GPU overheats; gpumon
    quarantines the node (GpuUnhealthy=True, its taint, karpenter.sh/do-not-disrupt) and evicts the
    pod, which Karpenter runs on a new node. GpuUnhealthy is in none of the kwok provider's repair
    policies: over five of Karpenter's repair passes after the quarantine (its own count; 10 s apart
    while nothing acts, so longer than any toleration of the kwok policies but Ready's 10 min) no
    node is eligible for repair, and the quarantined node, its NodeClaim and gpumon's record stay.
    Once the node also holds a condition a policy names (KWOKUnhealthy, as a node agent would set),
    Karpenter's repair deletes its NodeClaim although it carries do-not-disrupt, and gpumon's
    record goes with the Node; gpumon's controller carries on."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    first, owner = await deployment_on_a_karpenter_node(api, namespace, test_id)
    bad = first.spec.node_name
    async with quarantined(api, first, test_id, await sa_kubeconfig_for()) as (ctl, _, node):
        quarantined_at = time.monotonic()
        conditions = {x["type"]: x["status"] for x in node["status"]["conditions"]}
        assert conditions[c.CONDITION_TYPE] == "True", conditions
        await eventually(
            lambda: moved_off(core, namespace, bad),
            what="the evicted pod on a new node",
            timeout_seconds=90,
        )
        before, _ = await karpenter_repair_metrics(devcluster)

        async def passes(count: int) -> tuple[float, float] | None:
            now = await karpenter_repair_metrics(devcluster)
            return now if now[0] >= before + count else None

        _, eligible = await eventually(
            lambda: passes(5), what="five of Karpenter's repair passes", timeout_seconds=120
        )
        window = time.monotonic() - quarantined_at
        print(f"quarantined, five repair passes later: {window:.1f}s")
        assert window > KWOK_TOLERATION_SECONDS, window
        assert eligible == 0, f"{eligible} node(s) eligible for Karpenter's repair"
        held = await node_obj(core, bad)
        claim = await custom.get_cluster_custom_object(
            karpenter.GROUP, karpenter.VERSION, karpenter.NODE_CLAIMS, owner.name
        )
        assert not held["metadata"].get("deletionTimestamp") and not claim["metadata"].get(
            "deletionTimestamp"
        ), "Karpenter disrupted the quarantined node"
        assert c.ANNOTATION_UNHEALTHY_GPUS in held["metadata"]["annotations"]
        assert c.TAINT_KEY in {t["key"] for t in held["spec"].get("taints") or ()}
        assert {x["type"]: x["status"] for x in held["status"]["conditions"]}[c.CONDITION_TYPE] == "True"
        assert await events(core, "default", bad, "DisruptionTerminating") == []

        await kwok_unhealthy(core, bad)  # a condition Karpenter's policies name
        disrupting = await wait_for_event(core, "default", bad, "DisruptionTerminating", seconds=120)
        assert disrupting.message == "Disrupting Node: Unhealthy", disrupting.message
        await eventually(
            lambda: node_claim_gone(api, owner.name), what="the NodeClaim deleted", timeout_seconds=120
        )
        assert bad not in {n.metadata.name for n in (await core.list_node()).items}, "the record went"
        metrics = await metrics_text(ctl.url)
    assert "gpumon_controller_task_restarts_total{" not in metrics, "nothing crashed"
