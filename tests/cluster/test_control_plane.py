"""The control plane comes up whole: every component healthy, kwok acting as the kubelet of
annotated nodes, the CRDs served with their scale subresource; the API server restarts in place."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from gpumon.devcluster.cluster import DevCluster, StartupError
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.waiting import eventually


def test_every_component_is_healthy(devcluster: DevCluster) -> None:
    """The base five always; the parts a test started on demand (Cluster API, Karpenter) too."""
    health = devcluster.health()
    assert {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"} <= set(health)
    assert {name: p.ok for name, p in health.items()} == dict.fromkeys(health, True), health


def test_api_server_readyz_checks_all_pass(devcluster: DevCluster) -> None:
    verbose = devcluster.kubectl("get", "--raw", "/readyz?verbose")
    assert "readyz check passed" in verbose
    assert "[-]" not in verbose, verbose


def test_admin_is_cluster_admin(devcluster: DevCluster) -> None:
    assert devcluster.kubectl("auth", "can-i", "*", "*").strip() == "yes"


async def test_crds_are_established_with_scale_subresources(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    crds = {c.metadata.name: c for c in (await ext.list_custom_resource_definition()).items}
    for name in (
        "machinedeployments.cluster.x-k8s.io",
        "machinesets.cluster.x-k8s.io",
        "machinepools.cluster.x-k8s.io",
    ):
        established = {c.type: c.status for c in crds[name].status.conditions}.get("Established")
        assert established == "True", name
        v1beta2 = next(v for v in crds[name].spec.versions if v.name == "v1beta2")
        assert v1beta2.served and v1beta2.storage
        assert v1beta2.subresources.scale.spec_replicas_path == ".spec.replicas"
    for name in (
        "servicemonitors.monitoring.coreos.com",
        "podmonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
    ):
        assert name in crds


async def test_kwok_node_becomes_ready_and_holds_its_lease(
    api: client.ApiClient, make_nodes: NodeMaker
) -> None:
    [name] = await make_nodes(1)
    coordination = client.CoordinationV1Api(api)

    async def lease() -> client.V1Lease | None:
        leases = await coordination.list_namespaced_lease("kube-node-lease")
        return next((x for x in leases.items if x.metadata.name == name), None)

    found = await eventually(lease, what=f"lease of node {name}")
    assert found.spec.lease_duration_seconds == 40
    assert found.spec.renew_time is not None
    assert [(o.kind, o.name) for o in found.metadata.owner_references] == [("Node", name)]


def test_the_api_server_restarts_in_place(devcluster: DevCluster) -> None:
    """Same port, certificates and etcd: the admin kubeconfig works again and the data is there."""
    devcluster.kubectl("create", "configmap", "restart-probe", "-n", "default", "--from-literal=k=v")
    try:
        with pytest.raises(StartupError, match="still running"):
            devcluster.start_component("kube-apiserver")
        with pytest.raises(KeyError, match="kube-nothing"):
            devcluster.stop_component("kube-nothing")
        devcluster.stop_component("kube-apiserver")
        assert not devcluster.health()["kube-apiserver"].ok
        assert devcluster.health()["etcd"].ok
        devcluster.start_component("kube-apiserver")
        devcluster.wait_healthy("kube-apiserver")
        got = devcluster.kubectl("get", "cm", "restart-probe", "-n", "default", "-o", "jsonpath={.data.k}")
        assert got == "v"
    finally:
        devcluster.kubectl("delete", "configmap", "restart-probe", "-n", "default", "--ignore-not-found")
    health = devcluster.health()
    assert {name: p.ok for name, p in health.items()} == dict.fromkeys(health, True), health
