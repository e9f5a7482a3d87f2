"""Bad input end to end, each against the shared local control plane: a malformed rule file, a
node pool whose target does not exist, and Helm values the chart's schema rejects. Each is
refused with a message a person can act on (exit code 2 where it is configuration), and the
cluster is read afterwards to show that nothing was changed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from node_watch import NODE_EVENTS_NAMESPACE, metric, node_events

from gpumon.controller.act.events import COMPONENT
from gpumon.controller.core import contract
from gpumon.controller.core.contract import DELETE_MACHINE_ANNOTATION
from gpumon.devcluster import capi
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.localservers import ControllerProcess, ExporterProcess
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.nodes import GPU, NodeTemplate
from gpumon.devcluster.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpumon"
TEST_LABEL = "test.gpumon.io/id"


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _gpumon_key(key: str) -> bool:
    """A label or annotation key the controller may write on a node: its own domain
    (``gpumon.io/…``), or the Cluster API deletion mark its autoscaler puts on a node it removes."""
    domain = key.partition("/")[0] if "/" in key else ""
    return domain == "gpumon.io" or domain.endswith(".gpumon.io") or key == DELETE_MACHINE_ANNOTATION


def _by_gpumon(event: client.CoreV1Event) -> bool:
    component = event.source.component if event.source is not None else None
    return component == COMPONENT or event.reporting_component == COMPONENT or event.reason.startswith("Gpu")


async def node_state(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    """Everything on a node that the controller could have written, and nothing else: Kubernetes
    and kwok change the rest on their own schedule, so comparing it fails at random. Seen here
    within 15 s of a node turning Ready (when ``make_nodes`` returns): the node lifecycle
    controller adds the ``beta.kubernetes.io/{arch,os}`` labels, lifts its
    ``node.kubernetes.io/not-ready`` taint and records a ``RegisteredNode`` Event; later a late
    kwok heartbeat brings Ready=Unknown and ``node.kubernetes.io/unreachable`` taints, and every
    heartbeat moves times, resourceVersion and managedFields."""
    node = await core.read_node(name)
    return {
        "labels": {k: v for k, v in (node.metadata.labels or {}).items() if _gpumon_key(k)},
        "annotations": {k: v for k, v in (node.metadata.annotations or {}).items() if _gpumon_key(k)},
        # The node lifecycle controller owns node.kubernetes.io/*; any other taint could be ours
        # (gpumon.io/gpu-unhealthy, or a person's taint it puts back on recovery).
        "taints": sorted(
            (t.key, t.value or "", t.effect)
            for t in node.spec.taints or ()
            if not t.key.startswith("node.kubernetes.io/")
        ),
        "unschedulable": bool(node.spec.unschedulable),
        "conditions": [
            (c.status, c.reason, c.message)
            for c in node.status.conditions or ()
            if c.type == contract.CONDITION_TYPE
        ],
        "events": sorted((e.reason, e.message) for e in await node_events(core, name) if _by_gpumon(e)),
    }


async def cluster_state(api: client.ApiClient, namespace: str, nodes: list[str]) -> dict[str, Any]:
    """What gpumon or Helm could have written, as plain data: on each node what the controller
    writes (:func:`node_state`), and everything in the namespace that is not the namespace's own
    default."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    coordination = client.CoordinationV1Api(api)
    state: dict[str, Any] = {name: await node_state(core, name) for name in nodes}
    state["namespace"] = {
        "leases": [x.metadata.name for x in (await coordination.list_namespaced_lease(namespace)).items],
        "configmaps": [
            x.metadata.name
            for x in (await core.list_namespaced_config_map(namespace)).items
            if x.metadata.name != "kube-root-ca.crt"
        ],
        "secrets": [x.metadata.name for x in (await core.list_namespaced_secret(namespace)).items],
        "serviceaccounts": [
            x.metadata.name
            for x in (await core.list_namespaced_service_account(namespace)).items
            if x.metadata.name != "default"
        ],
        "services": [x.metadata.name for x in (await core.list_namespaced_service(namespace)).items],
        "deployments": [x.metadata.name for x in (await apps.list_namespaced_deployment(namespace)).items],
        "daemonsets": [x.metadata.name for x in (await apps.list_namespaced_daemon_set(namespace)).items],
        "events": [e.reason for e in (await core.list_namespaced_event(namespace)).items],
    }
    return state


# -- a malformed rule file ------------------------------------------------------------------------

BAD_RULES = {
    "not-yaml": ("rules:\n  - name: gpu-hot\n    signal: [temperature\n", ["rules.yaml", "not valid YAML"]),
    "missing-threshold": (
        "rules:\n  - name: gpu-hot\n    signal: temperature\n    op: '>='\n    severity: unhealthy\n",
        ["'gpu-hot'", "threshold"],
    ),
    "unknown-signal": (
        "rules:\n  - name: fans\n    signal: fan_speed\n    op: '<'\n    threshold: 10\n",
        ["'fans'", "signal"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_RULES))
async def test_a_malformed_rule_file_stops_the_controller_before_it_touches_the_cluster(
    api: client.ApiClient,
    devcluster: DevCluster,
    namespace: str,
    test_id: str,
    make_nodes: NodeMaker,
    tmp_path: Path,
    case: str,
) -> None:
    # A node whose GPU is lost: a controller that got past its configuration would quarantine it.
    (node,) = await make_nodes(1, NodeTemplate(gpus=1, labels={TEST_LABEL: test_id}))
    exporter = ExporterProcess(
        tmp_path / "exporter", "--backend", "simulated", "--node-name", node, "--simulate-gpus", "1",
        env={"GPUMON_PODS__ENABLED": "false"},
    )  # fmt: skip
    text, expected = BAD_RULES[case]
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    try:
        exporter.start()
        exporter.inject({"gpu": 0, "fault": "lost"})
        config = tmp_path / "controller.yaml"
        config.write_text(yaml.safe_dump({
            "dry_run": False,
            "kubeconfig": str(devcluster.kubeconfig),
            "namespace": namespace,
            "node_selector": f"{TEST_LABEL}={test_id}",
            "signals": {"source": "direct", "direct": {"endpoints": {node: exporter.url}}},
            "policy": {"rules_file": str(rules)},
        }))  # fmt: skip
        before = await cluster_state(api, namespace, [node])
        done = await asyncio.to_thread(
            run, [sys.executable, "-m", "gpumon.cli", "controller", "--config", str(config), "--act"]
        )
    finally:
        exporter.stop()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    message = done.stderr.strip()
    assert message.startswith("gpumon controller: "), message
    for word in expected:
        assert word in message, message
    assert len(message.splitlines()) <= 4, message  # one message, not a dump
    assert await cluster_state(api, namespace, [node]) == before


async def test_the_node_comparison_sees_every_write_of_the_controller_and_nothing_else(
    api: client.ApiClient, namespace: str, test_id: str, make_nodes: NodeMaker
) -> None:
    """The test above proves nothing if :func:`node_state` misses a write of the controller, and
    fails at random if it sees what Kubernetes and kwok change by themselves."""
    core = client.CoreV1Api(api)
    (node,) = await make_nodes(1, NodeTemplate(gpus=1, labels={TEST_LABEL: test_id}))
    made: list[str] = []

    async def event(reason: str, component: str) -> None:
        body = {
            "metadata": {"generateName": f"{node}."},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": reason, "message": f"{reason} on {node}", "type": "Normal",
            "source": {"component": component},
        }  # fmt: skip
        made.append((await core.create_namespaced_event(NODE_EVENTS_NAMESPACE, body)).metadata.name)

    def taint(key: str, effect: str) -> dict[str, Any]:
        return {"key": key, "value": "x", "effect": effect}

    try:
        before = await node_state(core, node)
        # What Kubernetes' controllers and kwok write on a node by themselves.
        await core.patch_node(node, {
            "metadata": {
                "annotations": {"node.alpha.kubernetes.io/ttl": "15"},
                "labels": {"beta.kubernetes.io/arch": "amd64"},
            },
            "spec": {"taints": [taint("node.kubernetes.io/unreachable", "NoSchedule")]},
        })  # fmt: skip
        unknown = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
        await core.patch_node_status(node, {"status": {"conditions": [unknown]}})
        await event("RegisteredNode", "node-controller")
        assert await node_state(core, node) == before

        # Each kind of write the controller makes, one at a time: each one must show.
        writes: dict[str, dict[str, Any]] = {
            "taint": {"spec": {"taints": [taint(contract.TAINT_KEY, "NoSchedule")]}},
            "label": {"metadata": {"labels": {contract.LABEL_STATE: "quarantined"}}},
            "annotation": {"metadata": {"annotations": {contract.ANNOTATION_QUARANTINED_AT: "now"}}},
            "deletion mark": {"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "gpumon"}}},
            "cordon": {"spec": {"unschedulable": True}},
        }
        seen = before
        for what, patch in writes.items():
            await core.patch_node(node, patch)
            now = await node_state(core, node)
            assert now != seen, f"the comparison misses the controller's {what}"
            seen = now
        condition = {"type": contract.CONDITION_TYPE, "status": "True", "reason": "GpuLost", "message": "0"}
        await core.patch_node_status(node, {"status": {"conditions": [condition]}})
        now = await node_state(core, node)
        assert now != seen, "the comparison misses the controller's condition"
        await event("GpuQuarantined", COMPONENT)
        assert await node_state(core, node) != now, "the comparison misses the controller's Event"
    finally:
        for name in made:
            await core.delete_namespaced_event(name, NODE_EVENTS_NAMESPACE)


# -- a pool pointing at a missing target ----------------------------------------------------------

MISSING_TARGETS = {
    "no-such-machinedeployment": {"name": "no-such-pool"},
    "no-such-kind": {"name": "gpu-a", "group": "pools.example.com", "version": "v1", "kind": "GpuPool"},
}


@pytest.mark.parametrize("case", sorted(MISSING_TARGETS))
async def test_a_pool_with_a_missing_target_is_reported_and_nothing_is_scaled(
    api: client.ApiClient, devcluster: DevCluster, namespace: str, test_id: str, tmp_path: Path, case: str
) -> None:
    """Not a configuration error (the target may appear later, or RBAC may be fixed): the
    controller keeps running, refuses the pool, says why on an Event and in its metrics, and
    writes nothing, though a pending GPU pod is waiting for that pool."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    target = {"namespace": namespace, **MISSING_TARGETS[case]}
    await core.create_namespaced_pod(namespace, {
        "metadata": {"name": "waiting"},
        "spec": {"nodeSelector": {TEST_LABEL: test_id}, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "cuda", "image": "cuda:12", "resources": {"limits": {GPU: "1"}}}]},
    })  # fmt: skip
    await eventually(lambda: _unschedulable(core, namespace, "waiting"), what="the GPU pod Unschedulable")
    config = {
        "dry_run": False,
        "kubeconfig": str(devcluster.kubeconfig),
        "namespace": namespace,
        "identity": "e2e-bad-pool",
        "node_selector": f"{TEST_LABEL}={test_id}",
        "signals": {"source": "direct", "direct": {"endpoints": {}}},
        "leader": {"lease_duration_seconds": 4, "renew_deadline_seconds": 3, "retry_period_seconds": 0.5},
        "pools": [{
            "name": "gpu",
            "target": target,
            "node_selector": f"{TEST_LABEL}={test_id}",
            "template": {"resources": {GPU: 1}, "labels": {TEST_LABEL: test_id}},
            "max_replicas": 3,
        }],
    }  # fmt: skip
    controller = ControllerProcess(tmp_path / "controller", config, "--act")
    try:
        await asyncio.to_thread(controller.start)

        async def unreadable() -> client.CoreV1Event | None:
            found = (await core.list_namespaced_event(namespace)).items
            return next((e for e in found if e.reason == "GpuPoolUnreadable"), None)

        event = await eventually(unreadable, what="a GpuPoolUnreadable Event")
        assert target["name"] in event.message and "cannot read" in event.message, event.message

        async def refused_rounds() -> float | None:
            text = await asyncio.to_thread(controller.metrics)
            rounds = metric(text, "gpumon_autoscaler_plans_total", pool="gpu", action="refused")
            return rounds if rounds is not None and rounds >= 2 else None

        await eventually(refused_rounds, what="two refused autoscaling rounds")
        text = await asyncio.to_thread(controller.metrics)
        assert metric(text, "gpumon_autoscaler_pool_refused", pool="gpu") == 1
        assert controller.running  # a runtime condition, not a reason to exit
    finally:
        controller.stop()
    reasons = {e.reason for e in (await core.list_namespaced_event(namespace)).items}
    assert not {r for r in reasons if r.startswith("GpuPool")} - {"GpuPoolUnreadable"}, reasons
    if case == "no-such-machinedeployment":
        with pytest.raises(ApiException) as missing:
            await custom.get_namespaced_custom_object(
                capi.GROUP, capi.VERSION, namespace, capi.MACHINE_DEPLOYMENTS, target["name"]
            )
        assert missing.value.status == 404  # not created behind anyone's back
    assert not (await core.list_node(label_selector=f"{TEST_LABEL}={test_id}")).items
    pod = await core.read_namespaced_pod("waiting", namespace)
    assert pod.spec.node_name is None and pod.metadata.deletion_timestamp is None


async def _unschedulable(core: client.CoreV1Api, namespace: str, name: str) -> bool | None:
    pod = await core.read_namespaced_pod(name, namespace)
    conditions = pod.status.conditions or ()
    return True if any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions) else None


# -- Helm values the chart's schema rejects -------------------------------------------------------

BAD_VALUES = {
    "replicas-not-a-number": (
        "controller.replicas",
        "two",
        "at '/controller/replicas': got string, want integer",
    ),
    "unknown-profile": (
        "exporter.metricsProfile",
        "dcgmm",
        "at '/exporter/metricsProfile': value must be one of",
    ),
    "misspelt-key": (
        "exporter.podAtribution.enabled",
        "false",
        "additional properties 'podAtribution' not allowed",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
async def test_chart_values_the_schema_rejects_install_nothing(
    api: client.ApiClient, devcluster: DevCluster, namespace: str, helm: Path, case: str
) -> None:
    key, value, message = BAD_VALUES[case]
    release = "gpumon-bad"
    before = await cluster_state(api, namespace, [])
    done = await asyncio.to_thread(run, [
        str(helm), "install", release, str(CHART), "--namespace", namespace,
        "--kubeconfig", str(devcluster.kubeconfig), "--set", f"{key}={value}",
    ])  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert await cluster_state(api, namespace, []) == before
    # No release recorded, and nothing cluster-wide from the chart.
    selector = f"app.kubernetes.io/instance={release}"
    rbac = client.RbacAuthorizationV1Api(api)
    assert not (await rbac.list_cluster_role(label_selector=selector)).items
    assert not (await rbac.list_cluster_role_binding(label_selector=selector)).items
    secrets = await client.CoreV1Api(api).list_secret_for_all_namespaces(
        label_selector=f"owner=helm,name={release}"
    )
    assert not secrets.items
