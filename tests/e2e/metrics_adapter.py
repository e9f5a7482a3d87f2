"""prometheus-adapter (built from ``sigs.k8s.io/prometheus-adapter`` into the tool cache by
``hack/build-tools.sh adapter``) serving ``external.metrics.k8s.io`` through the aggregation
layer of the shared local control plane, with the project's own adapter rules.

Layout (docs/e2e.md): the adapter runs in a network namespace of the test's own and listens on
its end of a veth pair; a selector-less Service and its Endpoints point at that address (the
API server refuses loopback Endpoints); the APIService ``v1beta1.external.metrics.k8s.io``
names the Service. The adapter reaches the API server and Prometheus through relays on the
root end of the pair. Its identity is a ServiceAccount with what the adapter's own manifests
grant: ``system:auth-delegator``, ``extension-apiserver-authentication-reader`` in kube-system,
and read access to the objects it maps series to.

On exit the APIService goes first: an APIService whose backend is gone breaks discovery for
every client of the shared cluster (namespace deletion among them)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from netns import Netns, TcpRelay, network_namespace

from gpumon.devcluster import binaries
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.localservers import LoggedProcess
from gpumon.devcluster.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus-adapter" / "config.yaml"
GROUP = "external.metrics.k8s.io"
API_SERVICE = f"v1beta1.{GROUP}"
PORT = 6443  # inside the namespace: nothing else listens there
ACCOUNT = "prometheus-adapter"


def adapter_binary() -> Path:
    return binaries.locate_prometheus_adapter()


class AdapterProcess(LoggedProcess):
    name = "prometheus-adapter"
    available_after = 0.0  # seconds from registration to the APIService being Available

    def __init__(self, workdir: Path, ns: Netns, *, prometheus_url: str, kubeconfig: Path) -> None:
        super().__init__(workdir / "adapter.log")
        self.workdir = workdir
        self.argv = ns.argv(
            [
                str(adapter_binary()),
                f"--prometheus-url={prometheus_url}",
                f"--config={RULES}",
                f"--bind-address={ns.address}",
                f"--secure-port={PORT}",
                f"--cert-dir={workdir / 'certs'}",  # a self-signed serving certificate is made here
                f"--lister-kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                # Series are discovered on this cadence (default 10 m): a workload's series must be
                # listed before its metric can be served.
                "--metrics-relist-interval=5s",
                "--v=2",
            ]
        )

    def start(self) -> None:
        self._spawn(self.argv)


@dataclass(frozen=True)
class _Rbac:
    namespace: str
    suffix: str

    @property
    def names(self) -> dict[str, str]:
        return {
            "delegator": f"{ACCOUNT}-auth-delegator-{self.suffix}",
            "reader": f"{ACCOUNT}-resource-reader-{self.suffix}",
            "auth_reader": f"{ACCOUNT}-auth-reader-{self.suffix}",
        }

    def _subject(self) -> list[dict[str, str]]:
        return [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": self.namespace}]

    async def create(self, api: client.ApiClient) -> None:
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        n = self.names
        await core.create_namespaced_service_account(self.namespace, {"metadata": {"name": ACCOUNT}})
        await rbac.create_cluster_role(
            {
                "metadata": {"name": n["reader"]},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["namespaces", "pods", "services", "nodes", "configmaps"],
                        "verbs": ["get", "list", "watch"],
                    }
                ],
            }
        )
        for binding, role in ((n["delegator"], "system:auth-delegator"), (n["reader"], n["reader"])):
            await rbac.create_cluster_role_binding(
                {
                    "metadata": {"name": binding},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": self._subject(),
                }
            )
        await rbac.create_namespaced_role_binding(
            "kube-system",
            {
                "metadata": {"name": n["auth_reader"]},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "extension-apiserver-authentication-reader",
                },
                "subjects": self._subject(),
            },
        )

    async def delete(self, api: client.ApiClient) -> None:
        rbac = client.RbacAuthorizationV1Api(api)
        n = self.names
        with contextlib.suppress(ApiException):
            await rbac.delete_namespaced_role_binding(n["auth_reader"], "kube-system")
        for name in (n["delegator"], n["reader"]):
            with contextlib.suppress(ApiException):
                await rbac.delete_cluster_role_binding(name)
        with contextlib.suppress(ApiException):
            await rbac.delete_cluster_role(n["reader"])


def _kubeconfig(cluster: DevCluster, server: str, token: str) -> dict[str, Any]:
    ca = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"][
        "certificate-authority-data"
    ]
    return {
        "apiVersion": "v1",
        "kind": "Config",
        # The serving certificate names loopback and `kubernetes…`, not the relay's address.
        "clusters": [
            {
                "name": "devcluster",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": ca,
                    "tls-server-name": "kubernetes",
                },
            }
        ],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "adapter", "context": {"cluster": "devcluster", "user": ACCOUNT}}],
        "current-context": "adapter",
    }


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


async def _available(registration: client.ApiregistrationV1Api, seen: list[str]) -> bool | None:
    svc = await registration.read_api_service(API_SERVICE)
    conditions = (svc.status and svc.status.conditions) or []
    seen[:] = [f"{c.type}={c.status} {c.reason}: {c.message}" for c in conditions]
    return True if any(c.type == "Available" and c.status == "True" for c in conditions) else None


@contextlib.asynccontextmanager
async def external_metrics_api(
    api: client.ApiClient,
    cluster: DevCluster,
    *,
    prometheus_port: int,
    namespace: str,
    workdir: Path,
    timeout_seconds: float = 120.0,
) -> AsyncIterator[AdapterProcess]:
    """prometheus-adapter registered as ``external.metrics.k8s.io`` until the block exits.
    Its Service lives in ``namespace``; the cluster-wide objects are removed on exit."""
    core, registration = client.CoreV1Api(api), client.ApiregistrationV1Api(api)
    rbac = _Rbac(namespace, namespace)
    apiserver_port = int(cluster.server.rsplit(":", 1)[1])
    with contextlib.ExitStack() as stack:
        ns = stack.enter_context(network_namespace())
        to_apiserver = stack.enter_context(TcpRelay(ns.host_address, ("127.0.0.1", apiserver_port)))
        to_prometheus = stack.enter_context(TcpRelay(ns.host_address, ("127.0.0.1", prometheus_port)))
        try:
            await rbac.create(api)
            token = (
                await core.create_namespaced_service_account_token(
                    ACCOUNT, namespace, {"spec": {"expirationSeconds": 3600}}
                )
            ).status.token
            kubeconfig = _write(
                workdir / "adapter.kubeconfig",
                _kubeconfig(cluster, f"https://{ns.host_address}:{to_apiserver.port}", token),
            )
            adapter = AdapterProcess(
                workdir,
                ns,
                prometheus_url=f"http://{ns.host_address}:{to_prometheus.port}",
                kubeconfig=kubeconfig,
            )
            adapter.start()
            stack.callback(adapter.stop)
            await core.create_namespaced_service(
                namespace,
                {
                    "metadata": {"name": ACCOUNT},
                    "spec": {"ports": [{"name": "https", "port": 443, "targetPort": PORT}]},
                },
            )
            await core.create_namespaced_endpoints(
                namespace,
                {
                    "metadata": {"name": ACCOUNT},
                    "subsets": [
                        {"addresses": [{"ip": ns.address}], "ports": [{"name": "https", "port": PORT}]}
                    ],
                },
            )
            await registration.create_api_service(
                {
                    "metadata": {"name": API_SERVICE},
                    "spec": {
                        "group": GROUP,
                        "version": "v1beta1",
                        "service": {"name": ACCOUNT, "namespace": namespace, "port": 443},
                        # The adapter's certificate is self-signed on start (--cert-dir).
                        "insecureSkipTLSVerify": True,
                        "groupPriorityMinimum": 100,
                        "versionPriority": 100,
                    },
                }
            )
            t0 = time.monotonic()
            conditions: list[str] = []
            await eventually(
                lambda: _alive_and(adapter, _available(registration, conditions)),
                what=f"APIService {API_SERVICE} Available",
                timeout_seconds=timeout_seconds,
                interval_seconds=0.5,
                seen=lambda: conditions,
            )
            adapter.available_after = time.monotonic() - t0
            yield adapter
        finally:
            with contextlib.suppress(ApiException):
                await registration.delete_api_service(API_SERVICE)
            await rbac.delete(api)


async def _alive_and(adapter: AdapterProcess, check: Any) -> bool | None:
    if not adapter.running:
        check.close()
        raise RuntimeError(f"prometheus-adapter exited:\n{adapter.log_tail()}")
    result: bool | None = await check
    return result
