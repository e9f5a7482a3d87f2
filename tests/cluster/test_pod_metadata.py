"""The exporter's pod list+watch (gpumon.kube.informer) on gpumon's API client against the real API
server: this node's pods only, their sharing annotations, container IDs as the kubelet reports
them, deletion, and an RBAC refusal that heals once the exporter's role is granted; credentials
from a kubeconfig (client certificate; service account token) and as a pod finds them (the
service host and port, the mounted token and CA)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes_asyncio import client

from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.waiting import eventually
from gpumon.exporter.pod_metadata import PodMeta, pod_watch
from gpumon.k8s import sharing
from gpumon.kube.client import KubeClient, KubeError
from gpumon.kube.credentials import Credentials, in_cluster
from gpumon.kube.informer import View
from gpumon.kube.kubeconfig import from_kubeconfig

CONTAINER_ID = "4d" * 32


def gpu_pod(name: str, node: str, annotations: dict[str, str], limits: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": node,  # bound directly, as the gpushare and HAMi schedulers do
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": limits}},
                {"name": "sidecar", "image": "registry.k8s.io/pause:3.10"},
            ],
        },
    }


async def quick(seconds: float) -> None:
    """Retry backoff shortened for the test (the real one waits 1, 2, 4, ... 30 s)."""
    await asyncio.sleep(min(seconds, 0.2))


class Watches:
    """Pod watches started as a node's exporter would start them, with the errors they count."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.clients: list[KubeClient] = []

    def start(self, node: str, credentials: Credentials) -> View[PodMeta]:
        self.clients.append(KubeClient(credentials))
        watch = pod_watch(node, lambda source, kind: self.errors.append((source, kind)), sleep=quick)
        self.tasks.append(asyncio.create_task(watch.informer.run(self.clients[-1])))
        return watch


@pytest.fixture
async def watches() -> AsyncIterator[Watches]:
    w = Watches()
    yield w
    for task in w.tasks:
        task.cancel()
    await asyncio.gather(*w.tasks, return_exceptions=True)
    for c in w.clients:
        await c.close()


@pytest.fixture
async def account(devcluster: DevCluster, api: client.ApiClient, namespace: str, tmp_path: Path) -> Path:
    """A directory as the kubelet mounts a pod's service account ("exporter", no role yet):
    ``token`` and ``ca.crt``."""
    core = client.CoreV1Api(api)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": "exporter"}})
    token = await core.create_namespaced_service_account_token(
        "exporter", namespace, {"spec": {"expirationSeconds": 3600}}
    )
    (tmp_path / "token").write_text(str(token.status.token))
    (tmp_path / "ca.crt").write_bytes(
        base64.b64decode(admin_cluster(devcluster)["certificate-authority-data"])
    )
    return tmp_path


def admin_cluster(devcluster: DevCluster) -> dict[str, Any]:
    doc = yaml.safe_load(devcluster.kubeconfig.read_text())
    cluster: dict[str, Any] = doc["clusters"][0]["cluster"]
    return cluster


async def test_this_nodes_pods_with_annotations_ids_and_deletion(
    devcluster: DevCluster, api: client.ApiClient, namespace: str, make_nodes: NodeMaker, watches: Watches
) -> None:
    mine, other = await make_nodes(2)
    core = client.CoreV1Api(api)
    # The admin kubeconfig: its client certificate and CA embedded (the data fields).
    watch = watches.start(mine, from_kubeconfig(devcluster.kubeconfig))

    gpushare = {sharing.GPUSHARE_INDEX: "0", sharing.GPUSHARE_ASSIGNED: "true", "unrelated": "x"}
    await core.create_namespaced_pod(
        namespace, gpu_pod("share", mine, gpushare, {sharing.GPUSHARE_MEMORY_RESOURCE: "8"})
    )
    hami = {sharing.HAMI_ALLOCATED: "GPU-0a1b2c3d-0000-4000-8000-000000000001,NVIDIA,4096,30:;;"}
    await core.create_namespaced_pod(namespace, gpu_pod("hami", mine, hami, {}))
    await core.create_namespaced_pod(namespace, gpu_pod("elsewhere", other, gpushare, {}))

    def by_name() -> dict[str, Any] | None:
        pods = {p.name: p for p in watch.items().values() if p.namespace == namespace}
        return pods if set(pods) == {"share", "hami"} else None

    pods = await eventually(_async(by_name), what="both pods seen")
    assert pods["share"].annotations == {sharing.GPUSHARE_INDEX: "0", sharing.GPUSHARE_ASSIGNED: "true"}
    assert pods["share"].containers[0].limits == {sharing.GPUSHARE_MEMORY_RESOURCE: "8"}
    assert pods["hami"].annotations == {sharing.HAMI_ALLOCATED: hami[sharing.HAMI_ALLOCATED]}

    # The kubelet reports container IDs in the pod status; the watch picks them up.
    await core.patch_namespaced_pod_status(
        "share",
        namespace,
        {
            "status": {
                "containerStatuses": [
                    {
                        "name": "main",
                        "containerID": f"containerd://{CONTAINER_ID}",
                        "image": "registry.k8s.io/pause:3.10",
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "state": {"running": {}},
                    }
                ]
            }
        },
    )

    def container_ids() -> dict[str, str] | None:
        share = next((p for p in watch.items().values() if p.name == "share"), None)
        return dict(share.container_ids) if share is not None and share.container_ids else None

    assert await eventually(_async(container_ids), what="container ID seen") == {CONTAINER_ID: "main"}

    await core.delete_namespaced_pod("hami", namespace, grace_period_seconds=0)
    await eventually(
        _async(lambda: True if all(p.name != "hami" for p in watch.items().values()) else None),
        what="deleted pod gone from the view",
    )
    assert watch.informer.up and watch.synced.is_set()


async def test_rbac_refusal_is_counted_and_heals_when_granted(
    devcluster: DevCluster,
    api: client.ApiClient,
    namespace: str,
    make_nodes: NodeMaker,
    watches: Watches,
    account: Path,
) -> None:
    (node,) = await make_nodes(1)
    core = client.CoreV1Api(api)
    # A kubeconfig of the service account: the CA as a file beside it, the token in a tokenFile.
    kubeconfig = account / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": admin_cluster(devcluster)["server"],
                            "certificate-authority": "ca.crt",
                        },
                    }
                ],
                "users": [{"name": "exporter", "user": {"tokenFile": "token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "exporter"}}],
                "current-context": "x",
            }
        )
    )
    watch = watches.start(node, from_kubeconfig(kubeconfig))
    await eventually(
        _async(lambda: True if ("api", "forbidden") in watches.errors else None), what="403 counted"
    )
    assert not watch.synced.is_set()

    rbac = client.RbacAuthorizationV1Api(api)
    role = f"{namespace}-pod-reader"
    await rbac.create_cluster_role(
        {
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        }
    )
    try:
        await rbac.create_cluster_role_binding(
            {
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "exporter", "namespace": namespace}],
            }
        )
        await core.create_namespaced_pod(namespace, gpu_pod("late", node, {}, {}))
        await eventually(
            _async(lambda: True if any(p.name == "late" for p in watch.items().values()) else None),
            what="pods listed once the role is granted",
        )
        assert watch.informer.up
    finally:
        await rbac.delete_cluster_role_binding(role)
        await rbac.delete_cluster_role(role)


async def test_in_a_pod_the_service_account_and_the_service_address(
    devcluster: DevCluster, namespace: str, make_nodes: NodeMaker, watches: Watches, account: Path
) -> None:
    """What a pod has: KUBERNETES_SERVICE_HOST/PORT and the token and CA the kubelet mounts. The
    service account is refused (as it is without the chart's ClusterRole): the request reached
    the API server over verified TLS and was authenticated as that account, not as anonymous."""
    (node,) = await make_nodes(1)
    server = urlsplit(admin_cluster(devcluster)["server"])
    env = {"KUBERNETES_SERVICE_HOST": str(server.hostname), "KUBERNETES_SERVICE_PORT": str(server.port)}
    credentials = in_cluster(env, account)
    assert credentials is not None
    async with KubeClient(credentials, request_timeout=10) as kube:
        with pytest.raises(KubeError) as refused:
            await kube.get("/api/v1/namespaces/" + namespace + "/pods")
    assert refused.value.status == 403
    assert f"system:serviceaccount:{namespace}:exporter" in refused.value.message
    # And the watch with those credentials counts the refusal, as the exporter's would.
    watches.start(node, credentials)
    await eventually(
        _async(lambda: True if ("api", "forbidden") in watches.errors else None), what="403 counted"
    )


def _async(check: Any) -> Any:
    async def run() -> Any:
        return check()

    return run
