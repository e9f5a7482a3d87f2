"""Doctor's Kubernetes API family against the real API server: listing this node's pods with
credentials that may, and with a service account that may not."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller_harness import _write_kubeconfig
from kubernetes_asyncio import client

from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.doctor import kubeapi
from gpumon.doctor.result import Status


def pod_on(node: str, name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    }


async def test_listing_this_nodes_pods(
    api: client.ApiClient, devcluster: DevCluster, namespace: str, make_nodes: NodeMaker
) -> None:
    (node,) = await make_nodes(1)
    core = client.CoreV1Api(api)
    for i in range(2):
        await core.create_namespaced_pod(namespace, pod_on(node, f"p{i}"))
    facts = await asyncio.to_thread(
        kubeapi.gather, node, node_from_env=True, timeout_seconds=30, kubeconfig=devcluster.kubeconfig
    )
    _, r = kubeapi.judge(facts)
    assert (r.status, r.found) == (Status.OK, f"as the kubeconfig: 2 pod(s) on node {node}")


async def test_a_service_account_without_rbac_is_forbidden(
    api: client.ApiClient, devcluster: DevCluster, namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    token = (await core.create_namespaced_service_account_token("nobody", namespace, request)).status.token
    kubeconfig = _write_kubeconfig(devcluster.kubeconfig, token, tmp_path / "nobody.yaml")
    facts = await asyncio.to_thread(
        kubeapi.gather, "any-node", node_from_env=True, timeout_seconds=30, kubeconfig=kubeconfig
    )
    _, r = kubeapi.judge(facts)
    assert r.status is Status.FAIL and r.found.startswith("as the kubeconfig: forbidden: 403")
    assert "list on pods" in r.fix
