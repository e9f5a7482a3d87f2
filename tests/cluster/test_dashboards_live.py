"""Every query of the committed dashboards, sent to a real Prometheus as Grafana would send it,
returns data. The Prometheus scrapes a real controller (``gpumon controller --act``, as the
shipped ServiceAccount) and one real exporter process per node on the session's local control
plane: three whole-GPU nodes of a Cluster API pool, a gpushare node and a cGPU node, with pods
the real scheduler placed (whole GPUs, ``aliyun.com/gpu-mem`` shares, ``gpu-mem`` plus
``gpu-core.percentage``). The test plays what kwok does not: the kubelet's pod-resources answer
and the gpushare extender's annotations. One pool node gets a lost GPU (Xid 79) under a pod,
an overheating GPU and ECC errors: the controller quarantines it, evicts the pod and asks the
pool for a replacement; the driver asks for a reset of a GPU no pod holds, and the pool's repair
ladder starts its reset Job. It is started before its RBAC is bound (as a release applied out of
order is), so its API errors panel has something to show.

Each panel target runs through ``/api/v1/query`` or ``/api/v1/query_range`` and each template
variable through ``/api/v1/label/<name>/values`` over the last five minutes. Grafana's side is
reproduced, not mocked: variables set to "All" become their ``allValue`` (``.*``),
``$__rate_interval``/``$__interval``/``$__range`` become durations for the range and step used.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from controller_harness import POOL_LABEL, TEST_LABEL, apply_rbac, rbac_docs, running_pods, token_kubeconfig
from kubernetes_asyncio import client, config
from podresources_server import short_socket_dir

from gpumon.devcluster import capi, nodes, podresources_server
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.localservers import ControllerProcess, ExporterProcess, PrometheusProcess
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.waiting import eventually
from gpumon.devcluster.workloads import gpu_deployment
from gpumon.k8s.resources import CGPU_CORE_RESOURCE, GPUSHARE_MEMORY_RESOURCE
from gpumon.k8s.sharing import GPUSHARE_ASSIGNED, GPUSHARE_INDEX, GPUSHARE_POD_MEMORY
from gpumon.kube.client import KubeClient
from gpumon.kube.kubeconfig import from_kubeconfig

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = {
    p.stem: json.loads(p.read_text()) for p in sorted((REPO / "dashboards" / "json").glob("*.json"))
}

RANGE_SECONDS = 300
STEP_SECONDS = 5
# Grafana: max($__interval + scrape interval, 4 x scrape interval); scrape interval is 1 s here.
RATE_INTERVAL = f"{4 * STEP_SECONDS}s"

CLUSTER = "dash-live"  # the `cluster` label, added by the scrape config as relabeling would
EXPORTER_JOB = "gpumon-exporter"  # the job names the dashboards and alerts expect
CONTROLLER_JOB = "gpumon-controller"
POOL = "gpu-pool"
KIND_LABEL = "test.gpumon.io/kind"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class NodeKind:
    """Nodes of one kind, their simulated card and the Deployment that runs on them."""

    name: str
    count: int
    pool: bool  # in the Cluster API pool the controller sizes
    template: nodes.NodeTemplate
    model: str
    replicas: int
    limits: Mapping[str, str]


SHARED = nodes.SharedGpus(2, 15)  # two T4 (15 GiB each, in the device plugin's GiB)
KINDS = (
    NodeKind("pool", 3, True, nodes.NodeTemplate(gpus=4), "A100-SXM4-80GB", 6, {nodes.GPU: "1"}),
    NodeKind(
        "gpushare",
        1,
        False,
        nodes.NodeTemplate(gpus=0, shared=SHARED),
        "T4",
        3,
        {GPUSHARE_MEMORY_RESOURCE: "4"},
    ),
    NodeKind(
        "cgpu",
        1,
        False,
        nodes.NodeTemplate(gpus=0, shared=SHARED),
        "T4",
        2,
        {GPUSHARE_MEMORY_RESOURCE: "3", CGPU_CORE_RESOURCE: "30"},
    ),
)
# The exporter's per-pod allocation series for each resource a pod holds: one per pod here.
ALLOCATION_SERIES = {
    nodes.GPU: "gpumon_pod_gpu_allocated",
    GPUSHARE_MEMORY_RESOURCE: "gpumon_pod_gpu_memory_allocated_bytes",
    CGPU_CORE_RESOURCE: "gpumon_pod_gpu_core_allocated_ratio",
}
# On the pool node holding a pod on GPU 0: what the dashboards show and the controller acts on.
# GPU 3 holds no pod: the driver asking for its reset starts the pool's repair ladder at once.
FAULTS = (
    {"gpu": 0, "fault": "xid", "code": 79},
    {"gpu": 2, "fault": "overheat", "celsius": 97},
    {"gpu": 3, "fault": "ecc", "count": 2},
    {"gpu": 3, "fault": "recovery_action", "action": "gpu_reset"},
)
# The pool repairs: a reset Job (kwok completes it; nothing plays the reset, so the ladder goes on
# waiting for the GPU), for the repair panels to have something to show.
REPAIR = {
    "steps": ["reset"],
    "reset_job": {"template": {"spec": {"containers": [{"name": "reset", "image": "x"}]}}},
}


@dataclass(frozen=True)
class Fleet:
    prometheus: PrometheusProcess
    exporters: Mapping[str, ExporterProcess]
    broken: str  # the pool node the faults went to


def _labelled(kind: NodeKind, test_id: str) -> nodes.NodeTemplate:
    """The kind's template with this run's labels: the test's, the kind's and the pool's."""
    labels = {TEST_LABEL: test_id, KIND_LABEL: kind.name, **({POOL_LABEL: POOL} if kind.pool else {})}
    return dataclasses.replace(kind.template, labels=labels)


def _exporter_config(node: str, kind: NodeKind, seed: int, socket: Path, workdir: Path) -> dict[str, Any]:
    return {
        "node_name": node,
        "backend": "simulated",
        "simulation": {"gpus": kind.template.gpu_count, "model": kind.model, "seed": seed},
        "sampling": {"fast_interval_seconds": 1, "slow_interval_seconds": 1},
        # kwok pods run no process: an empty /proc attributes none, allocations remain.
        "pods": {"pod_resources_socket": str(socket), "host_proc": str(workdir / "proc"), "api": True},
    }


def _controller_config(
    kubeconfig: Path, namespace: str, test_id: str, endpoints: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "dry_run": False,
        "kubeconfig": str(kubeconfig),
        "namespace": namespace,
        "identity": "dash-live",
        "node_selector": f"{TEST_LABEL}={test_id}",
        "signals": {
            "source": "direct",
            "stale_after_seconds": 10,
            "direct": {"endpoints": dict(endpoints), "heartbeat_seconds": 1, "poll_interval_seconds": 1},
        },
        "drain": {"deadline_seconds": 60, "retry_initial_seconds": 0.5, "retry_max_seconds": 2},
        "leader": {"lease_duration_seconds": 4, "renew_deadline_seconds": 3, "retry_period_seconds": 0.5},
        "pools": [
            {
                "name": POOL,
                "target": {"namespace": namespace, "name": POOL},
                "node_selector": f"{POOL_LABEL}={POOL}",
                "template": nodes.pool_template(_labelled(KINDS[0], test_id)),
                "min_replicas": 1,
                "max_replicas": 6,
                "repair": REPAIR,
            }
        ],
    }


def _prometheus_config(
    prometheus: PrometheusProcess, exporters: Sequence[ExporterProcess], controller: ControllerProcess
) -> dict[str, Any]:
    cfg = prometheus.config(
        {
            EXPORTER_JOB: [e.target for e in exporters],
            CONTROLLER_JOB: [controller.url.removeprefix("http://")],
        }
    )
    for job in cfg["scrape_configs"]:
        for static in job["static_configs"]:
            static["labels"] = {"cluster": CLUSTER}
    return cfg


def _kubelet_answer(pods: Sequence[client.V1Pod]) -> list[Any]:
    """What the node's kubelet says over pod-resources: whole GPUs by index in the order the
    pods came (the device plugin's ``DEVICE_ID_STRATEGY=index``); shared pods hold no device."""
    out = []
    gpu = 0
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        container = pod.spec.containers[0]
        wanted = int((container.resources.limits or {}).get(nodes.GPU, 0))
        devices = {nodes.GPU: [str(i) for i in range(gpu, gpu + wanted)]} if wanted else {}
        gpu += wanted
        out.append(
            podresources_server.pod_resources(
                pod.metadata.namespace, pod.metadata.name, {container.name: devices}
            )
        )
    return out


async def _place_shared(core: client.CoreV1Api, pods: Sequence[client.V1Pod], gpus: int) -> None:
    """The gpushare extender and device plugin: each shared pod on a card, in turn (two cards
    share three pods), marked assigned."""
    for i, pod in enumerate(sorted(pods, key=lambda p: p.metadata.name)):
        memory = (pod.spec.containers[0].resources.limits or {})[GPUSHARE_MEMORY_RESOURCE]
        annotations = {GPUSHARE_INDEX: str(i % gpus), GPUSHARE_POD_MEMORY: memory, GPUSHARE_ASSIGNED: "true"}
        await core.patch_namespaced_pod(
            pod.metadata.name,
            pod.metadata.namespace,
            {"metadata": {"annotations": annotations}},
            _content_type=MERGE_PATCH,
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    test_id = f"dash-live-{secrets.token_hex(3)}"
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(devcluster.kubeconfig), client_configuration=cfg)
    async with (
        client.ApiClient(cfg) as api,
        KubeClient(from_kubeconfig(devcluster.kubeconfig)) as kube,
        contextlib.AsyncExitStack() as stack,
    ):
        core = client.CoreV1Api(api)
        await core.create_namespace({"metadata": {"name": test_id}})
        stack.push_async_callback(core.delete_namespace, test_id)
        yield await _build(api, kube, stack, devcluster, test_id, tmp_path_factory.mktemp("dash-live"))


async def _build(
    api: client.ApiClient,
    kube: KubeClient,
    stack: contextlib.AsyncExitStack,
    devcluster: DevCluster,
    test_id: str,
    root: Path,
) -> Fleet:
    """Everything the fixture describes, each part stopped or deleted by ``stack``."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    kinds: dict[str, NodeKind] = {}
    for kind in KINDS:
        maker = NodeMaker(kube, f"{test_id}-{kind.name}")
        stack.push_async_callback(maker.delete_all)
        kinds |= dict.fromkeys(await maker(kind.count, _labelled(kind, test_id)), kind)

    sockets = stack.enter_context(short_socket_dir())
    kubelets: dict[str, podresources_server.PodResourcesFixture] = {}
    exporters: dict[str, ExporterProcess] = {}
    for seed, (name, kind) in enumerate(kinds.items(), start=1):
        socket = sockets / f"{seed}.sock"
        kubelets[name] = stack.enter_context(
            podresources_server.serve(socket, podresources_server.PodResourcesFixture())
        )
        workdir = root / name
        (workdir / "proc").mkdir(parents=True)
        (workdir / "exporter.yaml").write_text(
            yaml.safe_dump(_exporter_config(name, kind, seed, socket, workdir))
        )
        exporter = ExporterProcess(
            workdir,
            "--config",
            str(workdir / "exporter.yaml"),
            env={"KUBECONFIG": str(devcluster.kubeconfig)},  # its pod watch
        )
        stack.callback(exporter.stop)
        exporter.spawn()
        exporters[name] = exporter

    # The controller as the shipped ServiceAccount, started before its rights are bound.
    docs = rbac_docs(delete=False, autoscaling=True, repair=True)
    identity = [d for d in docs if d["kind"] in ("ServiceAccount", "ConfigMap")]
    await apply_rbac(api, identity, test_id, test_id)
    kubeconfig = await token_kubeconfig(api, devcluster, test_id, root / "controller.kubeconfig")
    endpoints = {n: e.url for n, e in exporters.items()}
    controller = ControllerProcess(
        root / "controller", _controller_config(kubeconfig, test_id, test_id, endpoints), "--act"
    )
    prometheus = PrometheusProcess(root / "prometheus")
    stack.callback(prometheus.stop)
    prometheus.start(_prometheus_config(prometheus, list(exporters.values()), controller))
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        capi.GROUP,
        capi.VERSION,
        test_id,
        capi.MACHINE_DEPLOYMENTS,
        capi.machine_deployment(POOL, test_id, replicas=sum(k.count for k in KINDS if k.pool)),
    )
    stack.callback(controller.stop)
    controller.spawn()
    prometheus.wait_for("gpumon_controller_api_errors_total")  # Forbidden: no rights yet
    bindings = await apply_rbac(api, [d for d in docs if d not in identity], test_id, test_id)
    rbac = client.RbacAuthorizationV1Api(api)
    for binding in bindings:
        stack.push_async_callback(rbac.delete_cluster_role_binding, binding)
    await eventually(lambda: _leading(controller), what="the controller leading", timeout_seconds=120)
    for exporter in exporters.values():
        exporter.wait_ready()

    # The workloads, placed by the real scheduler; then what the kubelets and gpushare say.
    placed: dict[str, list[client.V1Pod]] = {}
    for kind in KINDS:
        selector = {TEST_LABEL: test_id, KIND_LABEL: kind.name}
        await apps.create_namespaced_deployment(
            test_id,
            gpu_deployment(kind.name, replicas=kind.replicas, limits=kind.limits, node_selector=selector),
        )
    for kind in KINDS:
        pods = await eventually(
            functools.partial(_all_running, core, test_id, kind),
            what=f"{kind.replicas} pods of {kind.name} Running",
            timeout_seconds=120,
        )
        if kind.template.shared:
            await _place_shared(core, pods, kind.template.gpu_count)
        for pod in pods:
            placed.setdefault(pod.spec.node_name, []).append(pod)
    for name, kubelet in kubelets.items():
        kubelet.pods = _kubelet_answer(placed.get(name, []))
    for resource, metric in ALLOCATION_SERIES.items():
        count = sum(k.replicas for k in KINDS if resource in k.limits)
        prometheus.wait_for(f"count({metric}) == {count}")

    # A pool node breaks under a pod: quarantine, eviction, a replacement asked of the pool.
    broken = sorted(n for n, k in kinds.items() if k.pool and placed.get(n))[0]
    for fault in FAULTS:
        exporters[broken].inject(fault)
    prometheus.wait_for('gpumon_gpu_throttled{reason="hw_thermal"} == 1')
    prometheus.wait_for(f'gpumon_controller_quarantined_nodes{{pool="{POOL}"}} == 1')
    prometheus.wait_for('gpumon_controller_evictions_total{result="evicted"} > 0')
    prometheus.wait_for("gpumon_controller_fault_to_taint_seconds_count > 0")
    # The kubelet lets go of the evicted pod's GPU: the bad GPUs are free, and the reset starts.
    staying = {p.metadata.name for p in await running_pods(core, test_id, "pool")}
    kubelets[broken].pods = [p for p in kubelets[broken].pods if p.name in staying]
    prometheus.wait_for('gpumon_controller_repairs_total{step="reset", result="started"} > 0')
    pool_size = sum(k.count for k in KINDS if k.pool)
    prometheus.wait_for(f'gpumon_autoscaler_replicas{{pool="{POOL}", kind="current"}} > {pool_size}')
    return Fleet(prometheus, exporters, broken)


async def _leading(controller: ControllerProcess) -> bool | None:
    return True if await asyncio.to_thread(controller.leading) else None


async def _all_running(core: client.CoreV1Api, namespace: str, kind: NodeKind) -> list[client.V1Pod] | None:
    pods = await running_pods(core, namespace, kind.name)
    return pods if len(pods) == kind.replicas else None


@dataclass(frozen=True)
class Target:
    dashboard: str
    panel: str
    ref_id: str
    expr: str
    instant: bool


def _targets() -> list[Target]:
    return [
        Target(uid, panel["title"], t["refId"], t["expr"], bool(t.get("instant")))
        for uid, d in DASHBOARDS.items()
        for panel in d["panels"]
        if panel["type"] != "row"
        for t in panel["targets"]
    ]


def _variables() -> list[tuple[str, dict[str, Any]]]:
    return [
        (uid, v) for uid, d in DASHBOARDS.items() for v in d["templating"]["list"] if v["type"] == "query"
    ]


def _regex_escape(value: str) -> str:
    """Grafana's escaping of a chosen value for a Prometheus regex matcher: regex metacharacters
    get a backslash, itself escaped for the PromQL string literal."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    def substitute(self, expr: str, values: dict[str, str] | None = None) -> str:
        """Grafana's interpolation: variables (default "All" = their allValue) and interval macros."""
        builtins = {
            "__rate_interval": RATE_INTERVAL,
            "__interval": f"{STEP_SECONDS}s",
            "__range": f"{int(self.end - self.start)}s",
        }

        def value(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            if name in builtins:
                return builtins[name]
            return _regex_escape(values[name]) if values and name in values else ".*"

        return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


@pytest.fixture(scope="module")
def window(fleet: Fleet) -> Window:
    """The last five minutes, just after a fresh (informational) Xid arrived on a healthy node,
    so the Xid timeline has an event inside the range whatever ran before."""
    node = next(n for n in sorted(fleet.exporters) if n != fleet.broken)
    selector = f'gpumon_gpu_xid_errors_total{{node="{node}", gpu="0", xid="13"}}'
    before = fleet.prometheus.query(selector)
    count = float(before[0]["value"][1]) if before else 0.0
    fleet.exporters[node].inject({"gpu": 0, "fault": "xid", "code": 13})
    fleet.prometheus.wait_for(f"{selector} > {count}")
    end = time.time() + 1
    return Window(end - RANGE_SECONDS, end)


@pytest.mark.parametrize(
    "target", [pytest.param(t, id=f"{t.dashboard}:{t.panel}:{t.ref_id}") for t in _targets()]
)
def test_panel_query_returns_data(target: Target, fleet: Fleet, window: Window) -> None:
    prometheus = fleet.prometheus
    # A count that falls back to 0 (`... or vector(0)`) has data whatever its left side reads:
    # the left side itself must return data.
    expr = window.substitute(target.expr).removesuffix(" or vector(0)")
    if target.instant:
        data = prometheus.api("query", query=expr, time=f"{window.end:.3f}")
    else:
        data = prometheus.api(
            "query_range",
            query=expr,
            start=f"{window.start:.3f}",
            end=f"{window.end:.3f}",
            step=str(STEP_SECONDS),
        )
    assert data["result"], f"no data for {expr}"


def _label_values(prometheus: PrometheusProcess, query: str, window: Window) -> list[str]:
    """A Grafana ``label_values(selector, label)`` variable query, as the data source sends it."""
    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip())
    assert m, f"not a label_values() query: {query}"
    selector, label = m.groups()
    params = {"match[]": selector, "start": f"{window.start:.3f}", "end": f"{window.end:.3f}"}
    values: list[str] = prometheus.api(f"label/{label}/values", **params)
    return values


@pytest.mark.parametrize(
    "uid, variable",
    [pytest.param(uid, v, id=f"{uid}:${v['name']}") for uid, v in _variables()],
)
def test_variable_query_returns_values(
    uid: str, variable: dict[str, Any], fleet: Fleet, window: Window
) -> None:
    assert _label_values(fleet.prometheus, window.substitute(variable["query"]), window)


def test_variables_narrow_each_other(fleet: Fleet, window: Window) -> None:
    """Choosing one value of each variable in turn (as a user does) still leaves values for the
    next one, and the values are what the fleet has."""
    variables = {v["name"]: v for _, v in _variables()}
    chosen: dict[str, str] = {}
    for name in ("cluster", "node", "gpu"):
        values = _label_values(fleet.prometheus, window.substitute(variables[name]["query"], chosen), window)
        assert values, f"${name} is empty once {chosen} is chosen"
        chosen[name] = sorted(values)[0]
    assert chosen == {"cluster": CLUSTER, "node": sorted(fleet.exporters)[0], "gpu": "0"}
