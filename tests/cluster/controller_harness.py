"""Running the real controller against the real local control plane, as the ServiceAccount of
the shipped RBAC (deploy/rbac/controller.yaml), with simulated exporters served in-process.

Each exporter is gpumon's own exporter app on simulated GPUs; which pod holds which GPU (what
the kubelet's pod-resources API tells a real exporter; kwok runs no kubelet) is set by the
test through :class:`Placement`. The controller reads the exporters directly through a static
node -> URL map (``signals.direct.endpoints``): kwok's pods are not real processes, so an
exporter DaemonSet could not serve anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

# The Deployment of one-GPU pods pinned to a test's own nodes, as the scheduling tests use it.
from test_scheduling import gpu_deployment

from gpumon.config import ExporterConfig, PodsConfig, SamplingConfig
from gpumon.config.controller import ControllerConfig
from gpumon.controller.app import CONTROLLER, Controller, make_app
from gpumon.devcluster import nodes
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.podresources_server import PodResourcesFixture, serve
from gpumon.devcluster.waiting import eventually
from gpumon.devices.simulated import FaultScenario, SimulatedBackend, parse_fault
from gpumon.exporter.attribution import build_attribution
from gpumon.exporter.server import make_app as make_exporter_app
from gpumon.gpu.model import GpuSample, PodGpuUsage, PodRef
from gpumon.kube.client import KubeClient, connect
from gpumon.kube.kubeconfig import from_kubeconfig

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "deploy" / "rbac" / "controller.yaml"
RBAC_DELETE = REPO / "deploy" / "rbac" / "controller-escalation-delete.yaml"
RBAC_AUTOSCALING = REPO / "deploy" / "rbac" / "controller-autoscaling.yaml"
RBAC_REPAIR = REPO / "deploy" / "rbac" / "controller-repair.yaml"
TEST_LABEL = "test.gpumon.io/id"
POOL_LABEL = "gpumon.io/pool"
SA = "gpumon-controller"


def own_nodes(test_id: str, gpus: int = 4, **labels: str) -> nodes.NodeTemplate:
    return nodes.NodeTemplate(gpus=gpus, labels={TEST_LABEL: test_id, **labels})


# --- RBAC: the shipped files, moved into the test's namespace ---------------------------------


def _localised(doc: dict[str, Any], namespace: str, suffix: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    kind, meta = doc["kind"], doc["metadata"]
    if kind in ("ServiceAccount", "ConfigMap", "Role", "RoleBinding"):
        meta["namespace"] = namespace
    if kind == "ClusterRoleBinding":
        meta["name"] = f"{meta['name']}-{suffix}"  # one per test; the ClusterRole is shared
    for subject in doc.get("subjects") or ():
        subject["namespace"] = namespace
    return doc


async def _apply(api: client.ApiClient, doc: dict[str, Any]) -> None:
    kind, meta = doc["kind"], doc["metadata"]
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    create: Callable[..., Awaitable[Any]] = {
        "ServiceAccount": lambda: core.create_namespaced_service_account(meta["namespace"], doc),
        "ConfigMap": lambda: core.create_namespaced_config_map(meta["namespace"], doc),
        "Role": lambda: rbac.create_namespaced_role(meta["namespace"], doc),
        "RoleBinding": lambda: rbac.create_namespaced_role_binding(meta["namespace"], doc),
        "ClusterRole": lambda: rbac.create_cluster_role(doc),
        "ClusterRoleBinding": lambda: rbac.create_cluster_role_binding(doc),
    }[kind]
    try:
        await create()
    except client.exceptions.ApiException as e:
        if e.status != 409:
            raise
        if kind == "ClusterRole":
            await rbac.replace_cluster_role(meta["name"], doc)  # shared by tests: keep it current


def rbac_docs(delete: bool, autoscaling: bool, repair: bool = False) -> list[dict[str, Any]]:
    optional = ((RBAC_DELETE, delete), (RBAC_AUTOSCALING, autoscaling), (RBAC_REPAIR, repair))
    paths = (RBAC, *(path for path, wanted in optional if wanted))
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def _write_kubeconfig(admin_kubeconfig: Path, token: str, out: Path) -> Path:
    cluster = yaml.safe_load(admin_kubeconfig.read_text())["clusters"][0]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": SA, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": SA}}],
        "current-context": "sa",
    }
    out.write_text(yaml.safe_dump(doc))
    return out


async def apply_rbac(
    api: client.ApiClient, docs: Sequence[dict[str, Any]], namespace: str, test_id: str
) -> list[str]:
    """Apply shipped RBAC documents (see :func:`rbac_docs`) moved into ``namespace``; returns
    the names of the ClusterRoleBindings made, to delete afterwards."""
    bindings = []
    for doc in docs:
        local = _localised(doc, namespace, test_id)
        await _apply(api, local)
        if local["kind"] == "ClusterRoleBinding":
            bindings.append(local["metadata"]["name"])
    return bindings


async def token_kubeconfig(api: client.ApiClient, devcluster: DevCluster, namespace: str, out: Path) -> Path:
    """A kubeconfig holding a token of the ServiceAccount in ``namespace`` (which must exist)."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    token = (
        await client.CoreV1Api(api).create_namespaced_service_account_token(SA, namespace, request)
    ).status.token
    return _write_kubeconfig(devcluster.kubeconfig, token, out)


async def service_account_kubeconfig(
    api: client.ApiClient,
    devcluster: DevCluster,
    namespace: str,
    test_id: str,
    out: Path,
    *,
    delete: bool = False,
    autoscaling: bool = False,
    repair: bool = False,
) -> tuple[Path, list[str]]:
    """Apply the shipped RBAC in ``namespace`` and return a kubeconfig holding a token of its
    ServiceAccount, plus the names of the ClusterRoleBindings to delete afterwards."""
    bindings = await apply_rbac(api, rbac_docs(delete, autoscaling, repair), namespace, test_id)
    return await token_kubeconfig(api, devcluster, namespace, out), bindings


# --- simulated exporters ----------------------------------------------------------------------


class Placement:
    """Which pod holds which GPU, as kubelet pod-resources would say (set by the test)."""

    def __init__(self) -> None:
        self.pods: dict[int, tuple[str, str]] = {}  # GPU index -> (namespace, pod)

    async def refresh(self) -> None:
        return None

    def attribute(self, gpus: Sequence[GpuSample]) -> tuple[PodGpuUsage, ...]:
        by_index = {g.identity.index: g for g in gpus}
        return tuple(
            PodGpuUsage(
                PodRef(ns, pod, "cuda"), i, by_index[i].identity.uuid, allocated_resources=(nodes.GPU,)
            )
            for i, (ns, pod) in sorted(self.pods.items())
            if i in by_index
        )


@dataclass
class Exporter:
    node: str
    backend: SimulatedBackend
    server: TestServer
    # Which pod holds which GPU, set by the test; None when the exporter runs its real
    # attribution (then ``kubelet`` is what the node's kubelet says over pod-resources).
    placement: Placement | None = None
    kubelet: PodResourcesFixture | None = None

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def fault(self, **spec: Any) -> None:
        self.backend.inject(parse_fault(spec))

    def uuid(self, index: int) -> str:
        return self.backend.devices()[index].uuid

    async def stop(self) -> None:
        await self.server.close()


SAMPLING = SamplingConfig(fast_interval_seconds=0.2, slow_interval_seconds=0.5, call_timeout_seconds=5)


@asynccontextmanager
async def exporters(
    names: Sequence[str],
    gpus: int = 4,
    *,
    scenario: FaultScenario | None = None,
    backends: Mapping[str, SimulatedBackend] | None = None,
) -> AsyncIterator[dict[str, Exporter]]:
    """An exporter per node on simulated GPUs: ``backends`` by node where the GPUs must be
    particular ones (a DRA node's, whose UUIDs its ResourceSlice publishes), else fresh ones."""
    out: dict[str, Exporter] = {}
    try:
        for i, name in enumerate(names):
            given = (backends or {}).get(name)
            backend = given if given is not None else SimulatedBackend(gpus, seed=i, scenario=scenario)
            placement = Placement()
            cfg = ExporterConfig(node_name=name, backend="simulated", sampling=SAMPLING)
            server = TestServer(make_exporter_app(cfg, backend, attributor=placement), host="127.0.0.1")
            await server.start_server()
            out[name] = Exporter(name, backend, server, placement=placement)
        yield out
    finally:
        for e in out.values():
            await e.server.close()


@asynccontextmanager
async def attributing_exporter(
    name: str, kubeconfig: Path, workdir: Path, gpus: int, scenario: FaultScenario | None = None
) -> AsyncIterator[Exporter]:
    """An exporter running its real pod attribution, as on a node: the kubelet's pod-resources
    (a real gRPC server the test feeds, kwok runs no kubelet), this node's pods and their
    sharing annotations from the API server (as ``kubeconfig``'s identity), and a /proc without
    GPU processes."""
    proc = workdir / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    # A unix socket path holds at most 107 bytes: pytest's tmp_path can be longer.
    short = Path(tempfile.mkdtemp(prefix="gpumon-kubelet-"))
    socket = short / "kubelet.sock"
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, short, ignore_errors=True)
        kubelet = stack.enter_context(serve(socket, PodResourcesFixture()))
        pods = PodsConfig(pod_resources_socket=socket, host_proc=proc)
        kube = KubeClient(from_kubeconfig(kubeconfig))
        attributor = build_attribution(pods, name, call_timeout_seconds=5, pods_api=kube)
        backend = SimulatedBackend(gpus, scenario=scenario)
        cfg = ExporterConfig(node_name=name, backend="simulated", sampling=SAMPLING, pods=pods)
        app = make_exporter_app(cfg, backend, attributor=attributor)
        app.cleanup_ctx.insert(0, attributor.lifespan)  # as the exporter's command does
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            yield Exporter(name, backend, server, kubelet=kubelet)
        finally:
            await server.close()
            await kube.close()


# --- the controller ---------------------------------------------------------------------------


def controller_config(
    *,
    kubeconfig: Path,
    namespace: str,
    test_id: str,
    endpoints: Mapping[str, str],
    **over: Any,
) -> ControllerConfig:
    base: dict[str, Any] = {
        "dry_run": False,
        "kubeconfig": kubeconfig,
        "namespace": namespace,
        "identity": "c0",
        "listen_address": "127.0.0.1",
        "port": 0,
        "node_selector": f"{TEST_LABEL}={test_id}",
        "signals": {
            "source": "direct",
            "stale_after_seconds": 5,
            "direct": {"endpoints": dict(endpoints), "heartbeat_seconds": 0.5, "poll_interval_seconds": 0.5},
        },
        "policy": {"recover_after_seconds": 3},
        "drain": {"deadline_seconds": 60, "retry_initial_seconds": 0.5, "retry_max_seconds": 2},
        "leader": {"lease_duration_seconds": 4, "renew_deadline_seconds": 3, "retry_period_seconds": 0.5},
    }
    return ControllerConfig.model_validate(_merge(base, over))


def _merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class Running:
    controller: Controller
    url: str
    api: KubeClient
    runner: web.AppRunner
    stopped: bool = field(default=False)

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.runner.cleanup()
            await self.api.close()

    async def crash(self) -> None:
        """Stop dead, as a killed process would: no lease hand-over."""
        for task in self.controller.tasks:
            task.cancel()
        await asyncio.gather(*self.controller.tasks, return_exceptions=True)
        await self.stop()  # its elector no longer leads, so nothing is released


@asynccontextmanager
async def running(config: ControllerConfig) -> AsyncIterator[Running]:
    api = connect(config.kubeconfig)
    runner = web.AppRunner(make_app(config, api), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    handle = Running(runner.app[CONTROLLER], f"http://{host}:{port}", api, runner)
    try:
        yield handle
    finally:
        await handle.stop()


# --- reading the cluster ----------------------------------------------------------------------


async def running_pods(core: client.CoreV1Api, namespace: str, app: str) -> list[client.V1Pod]:
    pods = (await core.list_namespaced_pod(namespace, label_selector=f"app={app}")).items
    return [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]


async def node_obj(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    """The node as plain JSON (field names as in YAML)."""
    resp = await core.read_node(name, _preload_content=False)
    try:
        return json.loads(await resp.read())
    finally:
        resp.release()


def our_taint(node: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (t for t in node.get("spec", {}).get("taints") or () if t["key"] == "gpumon.io/gpu-unhealthy"), None
    )


def gpu_condition(node: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (c for c in node.get("status", {}).get("conditions") or () if c["type"] == "GpuUnhealthy"), None
    )


async def events(
    core: client.CoreV1Api, namespace: str, name: str, reason: str | None = None
) -> list[client.CoreV1Event]:
    found = (await core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")).items
    return [e for e in found if reason is None or e.reason == reason]


async def wait_for_event(
    core: client.CoreV1Api, namespace: str, name: str, reason: str, seconds: float = 60.0
) -> client.CoreV1Event:
    async def found() -> client.CoreV1Event | None:
        evs = await events(core, namespace, name, reason)
        return evs[0] if evs else None

    return await eventually(found, what=f"event {reason} on {name}", timeout_seconds=seconds)


# --- fixtures (imported by the test modules) -------------------------------------------------

KubeconfigFactory = Callable[..., Awaitable[Path]]


@pytest.fixture(name="sa_kubeconfig_for")
async def sa_kubeconfig_for_fixture(
    api: client.ApiClient, devcluster: DevCluster, namespace: str, test_id: str, tmp_path: Path
) -> AsyncIterator[KubeconfigFactory]:
    """``await sa_kubeconfig_for(delete=False, autoscaling=False)``: a kubeconfig of the shipped
    ServiceAccount, with the optional RBAC files applied as asked."""
    bindings: list[str] = []

    async def make(*, delete: bool = False, autoscaling: bool = False, repair: bool = False) -> Path:
        out = tmp_path / f"sa-{len(bindings)}.yaml"
        path, made = await service_account_kubeconfig(
            api, devcluster, namespace, test_id, out, delete=delete, autoscaling=autoscaling, repair=repair
        )
        bindings.extend(made)
        return path

    yield make
    rbac = client.RbacAuthorizationV1Api(api)
    for name in dict.fromkeys(bindings):
        await rbac.delete_cluster_role_binding(name)


async def fresh_signals(ctl: Running, count: int) -> bool | None:
    return True if ctl.controller.reconciler.signal_counts()["fresh"] == count else None


async def tainted(core: client.CoreV1Api, name: str) -> dict[str, Any] | None:
    node = await node_obj(core, name)
    return node if our_taint(node) else None


@dataclass
class Scene:
    """One test's corner of the shared cluster: its namespace, its nodes (labelled with the
    test's id), and controllers running as the shipped ServiceAccount."""

    api: client.ApiClient
    namespace: str
    test_id: str
    kubeconfig: Path
    kubeconfigs: KubeconfigFactory
    make_nodes: NodeMaker

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    async def nodes(self, count: int, gpus: int = 4, **labels: str) -> list[str]:
        return await self.make_nodes(count, own_nodes(self.test_id, gpus, **labels))

    async def deployment(self, app: str, replicas: int) -> list[client.V1Pod]:
        """A Deployment of one-GPU pods on this test's nodes; its pods (by name) once all Running."""
        await client.AppsV1Api(self.api).create_namespaced_deployment(
            self.namespace, gpu_deployment(app, replicas, self.test_id)
        )

        async def all_running() -> list[client.V1Pod] | None:
            pods = await running_pods(self.core, self.namespace, app)
            return pods if len(pods) == replicas else None

        pods = await eventually(all_running, what=f"{replicas} pods of {app} Running")
        return sorted(pods, key=lambda p: p.metadata.name)

    async def pdb(self, name: str, app: str, min_available: int, allowed: int) -> None:
        """A PodDisruptionBudget over ``app``, once the disruption controller computed it."""
        policy = client.PolicyV1Api(self.api)
        spec = {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}
        await policy.create_namespaced_pod_disruption_budget(
            self.namespace, {"metadata": {"name": name}, "spec": spec}
        )

        async def settled() -> bool | None:
            pdb = await policy.read_namespaced_pod_disruption_budget(name, self.namespace)
            s = pdb.status
            ok = s is not None and s.observed_generation == pdb.metadata.generation
            return True if ok and s.disruptions_allowed == allowed else None

        await eventually(settled, what=f"PDB {name} computed: {allowed} disruptions allowed")

    def config(self, ex: Mapping[str, Exporter], **over: Any) -> ControllerConfig:
        over.setdefault("kubeconfig", self.kubeconfig)
        return controller_config(
            namespace=self.namespace,
            test_id=self.test_id,
            endpoints={n: e.url for n, e in ex.items()},
            **over,
        )

    @asynccontextmanager
    async def controller(self, ex: Mapping[str, Exporter], **over: Any) -> AsyncIterator[Running]:
        """A running controller that has heard from every exporter in ``ex``."""
        async with running(self.config(ex, **over)) as ctl:
            await eventually(
                lambda: fresh_signals(ctl, len(ex)), what=f"fresh signals from {len(ex)} exporters"
            )
            yield ctl


@pytest.fixture(name="scene")
async def scene_fixture(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    make_nodes: NodeMaker,
    sa_kubeconfig_for: KubeconfigFactory,
) -> Scene:
    return Scene(api, namespace, test_id, await sa_kubeconfig_for(), sa_kubeconfig_for, make_nodes)
