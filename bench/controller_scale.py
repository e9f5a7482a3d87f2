"""The controller at fleet scale: 2,000 kwok GPU nodes (16,000 GPUs), 20,000 pods, one process
of simulated exporters, the real ``gpumon controller`` and a naive polling controller beside it.

``python -m bench controller-scale [--nodes N] [--quick] [--output FILE]`` (about ten minutes)
starts a local control plane (gpumon/devcluster), creates the nodes and their bound pods, starts
the signal farm (bench/signal_farm.py) and the controller as the shipped ServiceAccount, then
measures: its CPU, RSS and API requests at steady state, the time from one node's GPU going bad
to the node tainted and its first pod evicted, and the time from a burst of pending GPU pods to
the pool's scale request; then the same steady-state figures of bench/naive_controller.py on the
same cluster. It writes its section of bench/RESULTS.md (``--quick``: 200 nodes, printed).

API requests are counted by the API server itself: each client's ServiceAccount gets its own
FlowSchema, and ``apiserver_flowcontrol_dispatched_requests_total{flow_schema=…}`` is read from
the API server's /metrics before and after a window (``apiserver_request_total`` has no
per-client label).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import math
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import autoscale_plan, fleet_churn, scale_curve
from bench.cache_bytes import CacheSize, cache_size, stream_size
from bench.procs import cpu_seconds, free_port, memory
from bench.report import Grid, Row, Table, section_markdown, splice
from bench.run import alone, compare, cpu_model, log, mib
from bench.scale_fleet import (
    CONTROLLER_NAMESPACE,
    GPUS_PER_NODE,
    NAMESPACE,
    PENDING_NAMESPACE,
    POOL,
    POOL_NAMESPACE,
    bound_pods,
    controller_config,
    gpu_pod_name,
    node_manifest,
    node_names,
    nodes_needed,
    pending_pod,
    pool_target,
)
from bench.signal_farm import node_snapshot
from gpumon.config.controller import ControllerConfig
from gpumon.controller.core.contract import TAINT_KEY
from gpumon.controller.core.objects import node_from_json
from gpumon.devcluster import capi, kubeconfig, processes
from gpumon.devcluster.binaries import ETCD_VERSION, KUBERNETES_VERSION, KWOK_VERSION
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.components import Options
from gpumon.devcluster.localservers import ControllerProcess
from gpumon.kube.client import Conflict, KubeApi, KubeClient, KubeError, NotFound, Unreachable, connect
from gpumon.wire import v1 as wire

REPO = Path(__file__).resolve().parents[1]
# The default the controller asks its exporters for (a third of the staleness window).
HEARTBEAT_SECONDS = ControllerConfig().signals.heartbeat_seconds
RESULTS = REPO / "bench" / "RESULTS.md"
SECTION = "controller-scale"
RBAC = REPO / "deploy" / "rbac" / "controller.yaml"
# The bench configures a pool, so the controller needs the autoscaler's rights too.
RBAC_AUTOSCALING = REPO / "deploy" / "rbac" / "controller-autoscaling.yaml"
CONTROLLER_SA = "gpumon-controller"
NAIVE_SA = "gpumon-naive"
FAULT_GPU = 2
FAULT_XID = 79  # fallen off the bus: unhealthy, drain
CREATE_WORKERS = 24
DEADLINE = 600.0  # for anything the machine's load can stretch; a run stays bounded
MIB = 1 << 20
TARGET_CPU = ("≤ 0.1 core", 0.1)
TARGET_RSS = ("≤ 400 MiB", 400.0)
TARGET_TAINT = ("≤ 2 s", 2.0)
TARGET_QUARANTINE = ("≤ 5 s", 5.0)
TARGET_EVICTION = ("≤ 1 s after the taint", 1.0)
TARGET_SCALE = ("≤ 10 s", 10.0)


@dataclass(frozen=True, slots=True)
class Plan:
    nodes: int
    settle_seconds: float  # after every signal is fresh, before the steady window
    steady_seconds: float
    naive_seconds: float
    fault_trials: int  # ≤ 5: the controller's default rate limit of new quarantines
    pending: int
    quick: bool
    naive: bool = True  # measure the naive controller after gpumon (the single point does)
    restart: bool = False  # kill the controller and time its start again (the curve does)
    churn_seconds: float = 0.0  # after the trials, the fleet churns under the lease holder this long
    churn: fleet_churn.Rates = field(default_factory=fleet_churn.Rates)


FULL = Plan(
    nodes=2_000,
    settle_seconds=20,
    steady_seconds=60,
    naive_seconds=60,
    fault_trials=3,
    pending=500,
    quick=False,
)
QUICK = Plan(
    nodes=200, settle_seconds=5, steady_seconds=15, naive_seconds=10, fault_trials=2, pending=50, quick=True
)


# ---------------------------------------------------------------------------------------------
# Reading figures (pure)


def metric_values(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of the family ``name`` in a Prometheus text payload."""
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(name))
    return [
        (dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(wanted + "\n")
        for s in family.samples
        if s.name == name
    ]


def dispatched_by_flow(text: str) -> dict[str, float]:
    """API requests dispatched so far, by APF flow schema (each of our clients has its own)."""
    out: dict[str, float] = {}
    for labels, value in metric_values(text, "apiserver_flowcontrol_dispatched_requests_total"):
        out[labels.get("flow_schema", "")] = out.get(labels.get("flow_schema", ""), 0.0) + value
    return out


def metric_sum(text: str, name: str, **match: str) -> float:
    return sum(
        v for labels, v in metric_values(text, name) if all(labels.get(k) == x for k, x in match.items())
    )


def pod_lists(before: str, after: str) -> dict[str, float]:
    """``gpumon_controller_pod_lists_total``'s increase between two /metrics texts of one
    process, by "reader/result"."""

    def by_key(text: str) -> dict[str, float]:
        samples = metric_values(text, "gpumon_controller_pod_lists_total")
        return {f"{labels.get('reader')}/{labels.get('result')}": v for labels, v in samples}

    start, end = by_key(before), by_key(after)
    return {k: v - start.get(k, 0.0) for k, v in end.items()}


def has_taint(obj: Mapping[str, Any]) -> bool:
    return any(t.get("key") == TAINT_KEY for t in (obj.get("spec") or {}).get("taints") or ())


def leaving(kind: str, obj: Mapping[str, Any]) -> bool:
    return kind == "DELETED" or bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def seconds_text(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def cores(value: float) -> str:
    return f"{value:.3f} cores"


def per_second(value: float) -> str:
    return f"{value:,.2f}/s" if value < 100 else f"{value:,.0f}/s"


# ---------------------------------------------------------------------------------------------
# The cluster: objects in bulk, watches, the API server's own counters


async def retrying(request: Callable[[], Awaitable[object]], done: type[KubeError]) -> None:
    """``request`` with a few retries on transport errors and 5xx/429 (a busy API server); the
    error ``done`` says that what it asks for is so already."""
    for attempt in range(6):
        try:
            await request()
            return
        except done:
            return
        except KubeError as e:
            if not (isinstance(e, Unreachable) or e.status == 429 or e.status >= 500) or attempt == 5:
                raise
        await asyncio.sleep(0.2 * 2**attempt)


async def create(api: KubeApi, path: str, body: Mapping[str, Any]) -> None:
    """POST; an object that already exists is fine."""
    await retrying(functools.partial(api.post, path, body), Conflict)


async def delete(api: KubeApi, path: str, body: Mapping[str, Any] | None = None) -> None:
    """DELETE; an object already gone is fine."""
    await retrying(functools.partial(api.delete, path, body), NotFound)


async def create_all(api: KubeApi, items: Iterable[tuple[str, Mapping[str, Any]]]) -> float:
    """Create every (path, body) with a bounded pool of concurrent requests; seconds taken."""
    started = time.monotonic()
    queue: Iterator[tuple[str, Mapping[str, Any]]] = iter(items)

    async def worker() -> None:
        for path, body in queue:  # one shared iterator: each item goes to one worker
            await create(api, path, body)

    await asyncio.gather(*(worker() for _ in range(CREATE_WORKERS)))
    return time.monotonic() - started


async def list_all(
    api: KubeApi, path: str, params: Mapping[str, str] | None = None, *, at_most: float = math.inf
) -> list[Mapping[str, Any]]:
    """Every object at ``path`` in pages of 500, or the first pages holding ``at_most``."""
    items: list[Mapping[str, Any]] = []
    cont = ""
    while len(items) < at_most:
        doc = await api.get(path, {**(params or {}), "limit": "500", **({"continue": cont} if cont else {})})
        items += doc.get("items") or ()
        cont = str((doc.get("metadata") or {}).get("continue") or "")
        if not cont:
            break
    return items


def ready(node: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or ()
    )


async def poll(
    what: str, probe: Callable[[], Awaitable[str | None]], every: float = 3.0, deadline: float = DEADLINE
) -> float:
    """Call ``probe`` until it returns None (done); otherwise it returns progress to log."""
    started = time.monotonic()
    while (progress := await probe()) is not None:
        if time.monotonic() - started > deadline:
            raise RuntimeError(f"{what}: not done after {deadline:.0f} s ({progress})")
        log(f"{what}: {progress}")
        await asyncio.sleep(every)
    return time.monotonic() - started


async def first_event(
    api: KubeClient, path: str, params: Mapping[str, str], match: Callable[[str, Mapping[str, Any]], bool]
) -> tuple[float, Mapping[str, Any]]:
    """Watch from now; the wall time the first matching event arrived, and its object."""
    rv = str(
        ((await api.get(path, {**params, "limit": "1"})).get("metadata") or {}).get("resourceVersion", "")
    )
    watch = {**params, "watch": "1", "resourceVersion": rv, "timeoutSeconds": str(int(DEADLINE))}
    async for line in api.lines(path, watch):
        ev = json.loads(line)
        obj = ev.get("object") or {}
        if ev.get("type") in ("ADDED", "MODIFIED", "DELETED") and match(str(ev["type"]), obj):
            return time.time(), obj
    raise RuntimeError(f"watch of {path} {dict(params)} ended before the event")


def flow_schema(name: str, service_account: str) -> dict[str, Any]:
    """An APF FlowSchema matching one ServiceAccount, so the API server counts its requests apart
    (at the default service accounts' priority level: nothing is throttled differently)."""
    everything = {
        "verbs": ["*"],
        "apiGroups": ["*"],
        "resources": ["*"],
        "clusterScope": True,
        "namespaces": ["*"],
    }
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": "workload-low"},
            "matchingPrecedence": 500,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "serviceAccount": {"name": service_account, "namespace": CONTROLLER_NAMESPACE},
                        }
                    ],
                    "resourceRules": [everything],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }


@dataclass
class Cluster:
    """The control plane and what the bench reads from it."""

    dev: DevCluster
    api: KubeClient
    workdir: Path

    def pid(self, component: str) -> int:
        return next(c.pid for c in self.dev.children if c.name == component)

    async def kubectl(self, *args: str) -> str:
        return await asyncio.to_thread(self.dev.kubectl, *args)

    async def apiserver_metrics(self) -> str:
        return await self.kubectl("get", "--raw", "/metrics")

    async def service_account_kubeconfig(self, account: str) -> Path:
        token = (
            await self.kubectl("create", "token", account, "-n", CONTROLLER_NAMESPACE, "--duration=3h")
        ).strip()
        doc = yaml.safe_load(self.dev.kubeconfig.read_text())
        doc["users"] = [{"name": u["name"], "user": {"token": token}} for u in doc["users"]]
        return kubeconfig.write(doc, self.workdir / f"{account}.kubeconfig")

    async def prepare(self) -> tuple[Path, Path]:
        """Namespaces, the shipped RBAC, a naive client's account, FlowSchemas, the pool target;
        kubeconfigs of the controller's and the naive client's ServiceAccounts."""
        for ns in (NAMESPACE, PENDING_NAMESPACE, POOL_NAMESPACE, CONTROLLER_NAMESPACE):
            await create(self.api, "/api/v1/namespaces", {"metadata": {"name": ns}})
        await self.kubectl("apply", "-f", str(RBAC), "-f", str(RBAC_AUTOSCALING))
        await self.kubectl("create", "serviceaccount", NAIVE_SA, "-n", CONTROLLER_NAMESPACE)
        # The naive controller reads what the controller reads: the same ClusterRole.
        await self.kubectl(
            "create",
            "clusterrolebinding",
            NAIVE_SA,
            "--clusterrole=gpumon-controller",
            f"--serviceaccount={CONTROLLER_NAMESPACE}:{NAIVE_SA}",
        )
        schemas = self.workdir / "flowschemas.yaml"
        schemas.write_text(
            yaml.safe_dump_all([flow_schema(f"bench-{sa}", sa) for sa in (CONTROLLER_SA, NAIVE_SA)])
        )
        await self.kubectl("apply", "-f", str(schemas))
        target = pool_target()
        await create(
            self.api,
            f"/apis/{capi.GROUP}/{capi.VERSION}/namespaces/{POOL_NAMESPACE}/{capi.MACHINE_DEPLOYMENTS}",
            target,
        )
        for ns in (NAMESPACE, PENDING_NAMESPACE):  # pods are refused until the namespace's SA exists
            account = f"/api/v1/namespaces/{ns}/serviceaccounts/default"
            await poll(f"service account of {ns}", functools.partial(self._missing, account), every=0.5)
        return (
            await self.service_account_kubeconfig(CONTROLLER_SA),
            await self.service_account_kubeconfig(NAIVE_SA),
        )

    async def _missing(self, path: str) -> str | None:
        try:
            await self.api.get(path)
        except KubeError:
            return "not yet"
        return None


@dataclass(frozen=True, slots=True)
class Reading:
    """Counters read at one moment: differences over a window give the figures."""

    at: float
    cpu: float  # the client under test
    apiserver_cpu: float
    farm_cpu: float
    requests: float  # dispatched for the client's flow schema
    farm_snapshots: float
    load: tuple[float, float, float]


@dataclass(frozen=True, slots=True)
class Window:
    seconds: float
    cores: float
    apiserver_cores: float
    farm_cores: float
    requests_per_second: float
    snapshots_per_second: float
    load: tuple[float, float, float]

    @classmethod
    def between(cls, a: Reading, b: Reading) -> Window:
        s = b.at - a.at
        return cls(
            s,
            (b.cpu - a.cpu) / s,
            (b.apiserver_cpu - a.apiserver_cpu) / s,
            (b.farm_cpu - a.farm_cpu) / s,
            (b.requests - a.requests) / s,
            (b.farm_snapshots - a.farm_snapshots) / s,
            b.load,
        )


async def read(cluster: Cluster, farm: Farm, pid: int, account: str) -> Reading:
    text = await cluster.apiserver_metrics()
    return Reading(
        time.monotonic(),
        cpu_seconds(pid),
        cpu_seconds(cluster.pid("kube-apiserver")),
        cpu_seconds(farm.child.pid),
        dispatched_by_flow(text).get(f"bench-{account}", 0.0),
        (await farm.stats())["snapshots"],
        os.getloadavg(),
    )


async def window(cluster: Cluster, farm: Farm, pid: int, account: str, seconds: float) -> Window:
    before = await read(cluster, farm, pid, account)
    await asyncio.sleep(seconds)
    return Window.between(before, await read(cluster, farm, pid, account))


# ---------------------------------------------------------------------------------------------
# The signal farm and the two controllers as processes


@dataclass
class Farm:
    url: str
    session: aiohttp.ClientSession
    child: processes.Child

    async def stats(self) -> dict[str, int]:
        async with self.session.get(f"{self.url}/farm/stats") as resp:
            return dict(await resp.json())

    async def fault(self, node: str) -> float:
        body = {"node": node, "gpu": FAULT_GPU, "xid": FAULT_XID}
        async with self.session.post(f"{self.url}/farm/faults", json=body) as resp:
            answer = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"the farm refused the fault: {answer}")
            return float(answer["at"])


@asynccontextmanager
async def signal_farm(workdir: Path, nodes: int) -> AsyncIterator[Farm]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.signal_farm", "--nodes", str(nodes), "--port", str(port)]
    child = processes.spawn("signal-farm", argv, workdir / "signal-farm.log", cwd=REPO)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            farm = Farm(f"http://127.0.0.1:{port}", session, child)

            async def up() -> str | None:
                if child.exited() is not None:
                    raise RuntimeError(f"the signal farm exited:\n{processes.tail(child.log)}")
                try:
                    await farm.stats()
                except aiohttp.ClientError:
                    return "starting"
                return None

            await poll("signal farm", up, every=0.5)
            yield farm
    finally:
        processes.stop([child])


async def controller_metrics(session: aiohttp.ClientSession, ctl: ControllerProcess) -> str:
    async with session.get(f"{ctl.url}/metrics") as resp:
        return await resp.text()


async def metrics_if_answering(session: aiohttp.ClientSession, ctl: ControllerProcess) -> str | None:
    """The controller's /metrics, or None while it is not answering: not up yet, or a busy loop
    answering later than the session's timeout ("not yet", for polls bounded by their own
    deadline)."""
    try:
        return await controller_metrics(session, ctl)
    except (aiohttp.ClientError, TimeoutError):
        return None


def histogram_mean(text: str, name: str) -> tuple[float, int]:
    total, count = metric_sum(text, f"{name}_sum"), metric_sum(text, f"{name}_count")
    return (total / count if count else math.nan), int(count)


# ---------------------------------------------------------------------------------------------
# The phases


@dataclass(frozen=True, slots=True)
class Setup:
    nodes_seconds: float
    ready_seconds: float
    pods_seconds: float
    running_seconds: float


async def build_fleet(cluster: Cluster, names: Sequence[str]) -> Setup:
    api = cluster.api
    log(f"creating {len(names):,} nodes")
    nodes_seconds = await create_all(api, (("/api/v1/nodes", node_manifest(n)) for n in names))

    async def not_ready() -> str | None:
        count = sum(ready(n) for n in await list_all(api, "/api/v1/nodes"))
        return None if count >= len(names) else f"{count:,} of {len(names):,} Ready"

    # Listing every node costs the bench a second of CPU at 10,000 nodes: look less often there.
    ready_seconds = await poll("nodes Ready", not_ready, every=max(3.0, len(names) / 1000))
    total = len(names) * len(bound_pods(names[0]))
    log(f"creating {total:,} pods bound to them")
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    pods_seconds = await create_all(api, ((pods_path, p) for n in names for p in bound_pods(n)))

    async def not_running() -> str | None:
        # One item is enough to know; listing every pod still Pending would load the API server.
        left = await api.get(pods_path, {"fieldSelector": "status.phase!=Running", "limit": "1"})
        return "not all Running yet" if left.get("items") else None

    # kwok made 230 pods a second Running on the idle machine, 87 at 5,000 nodes and 37 at 10,000
    # with the machine shared: 100,000 take longer than DEADLINE, the bound is 25 a second.
    running_seconds = await poll("pods Running", not_running, every=5.0, deadline=max(DEADLINE, total / 25))
    return Setup(nodes_seconds, ready_seconds, pods_seconds, running_seconds)


@dataclass(frozen=True, slots=True)
class Fault:
    node: str
    to_taint: float
    taint_to_eviction: float
    evicted: str


async def fault_trial(cluster: Cluster, farm: Farm, node: str) -> Fault:
    api = cluster.api
    tainted = taint_watch(api, node)
    evicted = asyncio.create_task(
        first_event(
            api, f"/api/v1/namespaces/{NAMESPACE}/pods", {"fieldSelector": f"spec.nodeName={node}"}, leaving
        )
    )
    try:
        await asyncio.sleep(1.0)  # both watches are open (they start from before the fault anyway)
        at = await farm.fault(node)
        (taint_at, _), (evict_at, pod) = await asyncio.wait_for(asyncio.gather(tainted, evicted), DEADLINE)
    finally:
        tainted.cancel()
        evicted.cancel()
    return Fault(node, taint_at - at, evict_at - taint_at, str((pod.get("metadata") or {}).get("name")))


def coverage_lags(
    marked: Sequence[float], requests: Sequence[tuple[float, int]], per_node: int
) -> list[float]:
    """For each pending pod, in the order they were marked Unschedulable: how long until a scale
    request asked for enough nodes for it and every pod marked before it (0 when one already had).
    Every pod needs the same single GPU, so the k-th needs ceil(k / per_node) nodes."""
    lags = []
    for k, at in enumerate(sorted(marked), start=1):
        need = -(-k // per_node)
        covering = next((t for t, r in requests if r >= need), None)
        lags.append(math.inf if covering is None else max(0.0, covering - at))
    return lags


def unschedulable(obj: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


@dataclass(frozen=True, slots=True)
class Scale:
    """Times in seconds after the first pending pod was created."""

    requests: tuple[tuple[float, int], ...]  # (when, replicas) of every change of the target
    marked: tuple[float, ...]  # when each pod was seen Unschedulable
    created_seconds: float  # creating the burst took this long
    needed: int

    @property
    def final(self) -> int:
        return self.requests[-1][1] if self.requests else 0

    @property
    def lags(self) -> list[float]:
        return coverage_lags(self.marked, self.requests, GPUS_PER_NODE)


async def scale_trial(cluster: Cluster, pending: int) -> Scale:
    api = cluster.api
    path = f"/apis/{capi.GROUP}/{capi.VERSION}/namespaces/{POOL_NAMESPACE}/{capi.MACHINE_DEPLOYMENTS}"
    pods_path = f"/api/v1/namespaces/{PENDING_NAMESPACE}/pods"
    needed = nodes_needed(pending)
    seen: list[tuple[float, int]] = []
    marked: dict[str, float] = {}
    t0 = time.time()

    def replicas_changed(_: str, obj: Mapping[str, Any]) -> bool:
        replicas = int((obj.get("spec") or {}).get("replicas", 0))
        if not seen or seen[-1][1] != replicas:
            seen.append((time.time() - t0, replicas))
        return replicas >= needed

    def marked_unschedulable(_: str, obj: Mapping[str, Any]) -> bool:
        if unschedulable(obj):
            marked.setdefault(str((obj.get("metadata") or {}).get("name")), time.time() - t0)
        return len(marked) >= pending

    watches = [
        asyncio.create_task(
            first_event(api, path, {"fieldSelector": f"metadata.name={POOL}"}, replicas_changed)
        ),
        asyncio.create_task(first_event(api, pods_path, {}, marked_unschedulable)),
    ]
    try:
        await asyncio.sleep(1.0)
        t0 = time.time()
        log(f"creating {pending} pending GPU pods")
        created = await create_all(api, ((pods_path, pending_pod(i)) for i in range(pending)))
        try:
            await asyncio.wait_for(asyncio.gather(*watches), 180)
        except TimeoutError:
            log(f"gave up waiting: {len(marked)} pods Unschedulable, requests {seen}")
        await asyncio.sleep(5.0)  # a request beyond what is needed would show here
    finally:
        for task in watches:
            task.cancel()
    current = await api.get(f"{path}/{POOL}")
    replicas = int((current.get("spec") or {}).get("replicas", 0))
    if not seen or seen[-1][1] != replicas:
        seen.append((time.time() - t0, replicas))
    return Scale(tuple(seen), tuple(sorted(marked.values())), created, needed)


def taint_watch(api: KubeClient, node: str) -> asyncio.Task[tuple[float, Mapping[str, Any]]]:
    """The bench's own watch of ``node`` until gpumon's taint is on it (when, and the Node)."""
    return asyncio.create_task(
        first_event(
            api, "/api/v1/nodes", {"fieldSelector": f"metadata.name={node}"}, lambda _, o: has_taint(o)
        )
    )


async def kill(ctl: ControllerProcess) -> float:
    """SIGKILL, as a crash or an OOM kill would: the lease is not released. The wall time of the
    kill, once the process is gone."""
    assert ctl.child is not None
    ctl.child.process.kill()
    at = time.time()
    await asyncio.to_thread(ctl.child.process.wait)
    return at


def informers_synced(metrics_text: str) -> bool:
    synced = metric_values(metrics_text, "gpumon_controller_informer_synced")
    return bool(synced) and all(v == 1 for _, v in synced)


@dataclass(frozen=True, slots=True)
class Restart:
    """Seconds from the controller's process started again to each milestone."""

    node: str  # given a fault while the controller was down
    up: float  # its /metrics answers: the interpreter, the imports, the app built
    synced: float  # every informer's cache filled
    leading: float
    fresh: float  # every node's signals fresh
    decision: float  # that node tainted: its first correct decision


async def restart_trial(
    cluster: Cluster,
    farm: Farm,
    ctl: ControllerProcess,
    session: aiohttp.ClientSession,
    node: str,
    nodes: int,
) -> Restart:
    """Kill the controller (SIGKILL, as a crash or an OOM kill would), give ``node`` a fault
    while it is down, start it again with the same identity (a container restart: the lease is
    its own) and time it back to work."""
    tainted = taint_watch(cluster.api, node)
    try:
        await asyncio.sleep(1.0)  # the watch is open
        await kill(ctl)
        log(f"controller killed; fault on {node}; starting it again")
        await farm.fault(node)
        started = time.time()
        ctl.spawn()
        marks: dict[str, float] = {}
        while len(marks) < 4 and time.time() - started < DEADLINE:
            text = await metrics_if_answering(session, ctl) or ""
            at = time.time() - started
            if text:
                marks.setdefault("up", at)
            if informers_synced(text):
                marks.setdefault("synced", at)
            if metric_sum(text, "gpumon_controller_leader"):
                marks.setdefault("leading", at)
            if metric_sum(text, "gpumon_controller_nodes_by_signal_status", status="fresh") >= nodes:
                marks.setdefault("fresh", at)
            await asyncio.sleep(0.25)
        taint_at, _ = await asyncio.wait_for(tainted, DEADLINE)
    finally:
        tainted.cancel()
    return Restart(
        node,
        marks.get("up", math.nan),
        marks.get("synced", math.nan),
        marks.get("leading", math.nan),
        marks.get("fresh", math.nan),
        taint_at - started,
    )


def leader_change_fits(nodes: int, open_files: int) -> bool:
    """Whether two replicas' exporter streams fit: the farm, one process, holds a socket for each
    replica's stream to each node, under the same open-file limit as the bench."""
    return 2 * nodes + 1_000 <= open_files


@dataclass(frozen=True, slots=True)
class LeaderChange:
    """Seconds from the leader killed to each milestone on the standby replica."""

    node: str  # given a fault at the kill
    leading: float
    decision: float  # that node tainted


async def leader_change_trial(
    cluster: Cluster,
    farm: Farm,
    leader: ControllerProcess,
    standby: ControllerProcess,
    session: aiohttp.ClientSession,
    node: str,
) -> LeaderChange:
    """A second replica (another identity) started and synced; the leader killed (SIGKILL: the
    lease is not released) and ``node`` given a fault at once; the standby must wait for the
    lease to lapse, take it, and taint the node."""

    async def standby_synced() -> str | None:
        if not standby.running:
            raise RuntimeError(f"the standby replica exited:\n{standby.log_tail()}")
        text = await metrics_if_answering(session, standby)
        if text is None:
            return "starting"
        return None if informers_synced(text) else "syncing"

    standby.spawn()
    await poll("standby replica", standby_synced, every=1.0)
    tainted = taint_watch(cluster.api, node)
    try:
        await asyncio.sleep(1.0)  # the watch is open
        killed = await kill(leader)
        await farm.fault(node)
        leading = math.nan
        while not tainted.done() and time.time() - killed < DEADLINE:
            text = await metrics_if_answering(session, standby) or ""
            if math.isnan(leading) and metric_sum(text, "gpumon_controller_leader"):
                leading = time.time() - killed
            await asyncio.sleep(0.25)
        taint_at, _ = await asyncio.wait_for(tainted, DEADLINE)
    finally:
        tainted.cancel()
    return LeaderChange(node, leading, taint_at - killed)


# A /metrics answer later than this counts as unanswered: the poll keeps its 1 s pace (a late
# answer holds the next poll back by at most this) and a busy loop shows as a count, not a crash.
LEADER_POLL_TIMEOUT = 2.0


async def lease_holder(
    session: aiohttp.ClientSession, replicas: Sequence[ControllerProcess]
) -> ControllerProcess:
    """The replica whose gauge says it leads now: the restarted controller, or after a leader
    change the standby."""
    holding: list[ControllerProcess] = []

    async def none_leads() -> str | None:
        for replica in replicas:
            text = await metrics_if_answering(session, replica) if replica.running else None
            if text is not None and metric_sum(text, "gpumon_controller_leader"):
                holding.append(replica)
                return None
        return "no replica leads"

    await poll("the lease holder", none_leads, every=1.0, deadline=60.0)
    return holding[0]


@dataclass
class LeaderPolls:
    """The leader gauge as the once-a-second poll saw it, and the process's memory meanwhile."""

    samples: list[float | None] = field(default_factory=list)  # None: not answered in time
    slowest: float = 0.0
    rss: int = 0


async def poll_leader(ctl: ControllerProcess, pid: int, until: float, polls: LeaderPolls) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=LEADER_POLL_TIMEOUT)) as session:
        while (tick := time.monotonic()) < until:
            text = await metrics_if_answering(session, ctl)
            polls.samples.append(None if text is None else metric_sum(text, "gpumon_controller_leader"))
            if text is not None:
                polls.slowest = max(polls.slowest, time.monotonic() - tick)
            if ctl.running:
                polls.rss = max(polls.rss, memory(pid)[0])
            await asyncio.sleep(max(0.0, tick + 1.0 - time.monotonic()))


async def on_schedule(start: float, steps: Sequence[tuple[float, Callable[[], Awaitable[None]]]]) -> float:
    """Each step at its time after ``start``, one after another (a slow step makes the next
    late, never two at once); the most seconds a step ran late."""
    behind = 0.0
    for at, step in steps:
        wait = start + at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        behind = max(behind, -wait)
        await step()
    return behind


async def replace_pod(api: KubeApi, step: fleet_churn.PodStep, done: collections.Counter[str]) -> None:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    await delete(api, f"{path}/{step.delete}")
    done["pods_deleted"] += 1
    await create(api, path, fleet_churn.replacement(step))
    done["pods_created"] += 1


async def node_step(api: KubeApi, step: fleet_churn.NodeStep, done: collections.Counter[str]) -> None:
    """The node leaves as a drained node does (its pods deleted, at once: nothing runs them any
    more, then the Node); an earlier one joins (the Node, then its pods bound to it)."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    for pod in bound_pods(step.leaves):
        await delete(api, f"{path}/{pod['metadata']['name']}", {"gracePeriodSeconds": 0})
        done["node_pods_deleted"] += 1
    await delete(api, f"/api/v1/nodes/{step.leaves}")
    done["nodes_left"] += 1
    if step.joins is not None:
        await create(api, "/api/v1/nodes", node_manifest(step.joins))
        done["nodes_joined"] += 1
        for pod in bound_pods(step.joins):
            await create(api, path, pod)
            done["node_pods_created"] += 1


async def churn_phase(
    cluster: Cluster,
    farm: Farm,
    session: aiohttp.ClientSession,
    holder: ControllerProcess,
    names: Sequence[str],
    spared: Iterable[str],
    plan: Plan,
) -> fleet_churn.Churn:
    """The fleet churns for ``plan.churn_seconds`` under ``holder``, the replica holding the
    lease: its lease losses, CPU, memory, API requests and pod lists meanwhile."""
    assert holder.child is not None
    pid, rates, seconds = holder.child.pid, plan.churn, plan.churn_seconds
    steps = fleet_churn.schedule(names, spared, seconds, rates)
    log(
        f"churn: {seconds:g} s, {len(steps.pods):,} pods replaced and {len(steps.nodes)} nodes leaving "
        f"under {holder.config['identity']}"
    )
    log_from = holder.log_path.stat().st_size
    before = await controller_metrics(session, holder)
    done: collections.Counter[str] = collections.Counter()
    polls = LeaderPolls()
    start = time.monotonic()
    try:
        measured, pods_behind, nodes_behind, _ = await asyncio.gather(
            window(cluster, farm, pid, CONTROLLER_SA, seconds),
            on_schedule(
                start, [(s.at, functools.partial(replace_pod, cluster.api, s, done)) for s in steps.pods]
            ),
            on_schedule(
                start, [(s.at, functools.partial(node_step, cluster.api, s, done)) for s in steps.nodes]
            ),
            poll_leader(holder, pid, start + seconds, polls),
        )
    except FileNotFoundError as e:  # its /proc entry: the size fails, saying why
        raise RuntimeError(f"the lease holder exited during the churn:\n{holder.log_tail()}") from e
    after = await controller_metrics(session, holder)
    with holder.log_path.open("rb") as f:
        f.seek(log_from)
        lease = fleet_churn.lease_log(f.read().decode(errors="replace").splitlines())
    return fleet_churn.Churn(
        seconds=measured.seconds,
        pods_per_second=rates.pods_per_second,
        node_seconds=rates.node_seconds,
        away_steps=rates.away_steps,
        replica=str(holder.config["identity"]),
        lease_lost=lease.lost,
        leader_drops=fleet_churn.leader_drops(polls.samples),
        polls=len(polls.samples),
        unanswered=polls.samples.count(None),
        slowest_poll=polls.slowest,
        slow_rounds=lease.slow_rounds,
        failed_rounds=lease.failed_rounds,
        cpu_cores=measured.cores,
        rss_bytes=float(polls.rss),
        requests_per_second=measured.requests_per_second,
        apiserver_cores=measured.apiserver_cores,
        load=measured.load[0],
        pod_lists=pod_lists(before, after),
        pods_deleted=done["pods_deleted"],
        pods_created=done["pods_created"],
        node_pods_deleted=done["node_pods_deleted"],
        node_pods_created=done["node_pods_created"],
        nodes_left=done["nodes_left"],
        nodes_joined=done["nodes_joined"],
        behind=max(pods_behind, nodes_behind),
    )


@dataclass(frozen=True, slots=True)
class Naive:
    window: Window
    rss: int
    peak: int
    rounds: tuple[Mapping[str, Any], ...]


async def naive_run(cluster: Cluster, farm: Farm, workdir: Path, kubeconfig_file: Path, plan: Plan) -> Naive:
    argv = [
        sys.executable,
        "-m",
        "bench.naive_controller",
        "--kubeconfig",
        str(kubeconfig_file),
        "--farm",
        farm.url,
        "--nodes",
        str(plan.nodes),
    ]
    child = processes.spawn("naive-controller", argv, workdir / "naive.log", cwd=REPO)

    def rounds() -> list[Mapping[str, Any]]:
        lines = child.log.read_text().splitlines()
        return [json.loads(x) for x in lines if x.startswith("{")]

    async def first_round() -> str | None:
        if child.exited() is not None:
            raise RuntimeError(f"the naive controller exited:\n{processes.tail(child.log)}")
        return None if rounds() else "first round"

    try:
        await poll("naive controller", first_round, every=1.0)
        log(f"naive controller, {plan.naive_seconds:g} s window")
        w = await window(cluster, farm, child.pid, NAIVE_SA, plan.naive_seconds)
        rss, peak = memory(child.pid)
        done = tuple(rounds()[1:])  # the first round started cold
    finally:
        processes.stop([child])
    return Naive(w, rss, peak, done)


# ---------------------------------------------------------------------------------------------
# The run


@dataclass
class Outcome:
    setup: Setup | None = None
    sync_seconds: float = 0.0
    steady: Window | None = None
    rss: tuple[int, int] = (0, 0)
    farm: dict[str, int] = field(default_factory=dict)  # the farm's counters after the window
    faults: list[Fault] = field(default_factory=list)
    fault_to_taint_metric: tuple[float, int] = (math.nan, 0)
    scale: Scale | None = None
    pending_to_request_metric: tuple[float, int] = (math.nan, 0)
    naive: Naive | None = None
    restart: Restart | None = None
    leader_change: LeaderChange | None = None
    churn: fleet_churn.Churn | None = None
    cache: tuple[CacheSize, ...] = ()
    control_plane_rss: dict[str, int] = field(default_factory=dict)
    etcd_db_bytes: int = 0
    memory_available: int = 0
    loads: dict[str, tuple[float, float, float]] = field(default_factory=dict)


# Lease renewals the curve lets kwok make per second at any size (it renews each node's lease
# every quarter of its duration): at the kubelet's 40 s, 10,000 nodes would renew 1,000 a
# second, more than the API server on this machine can take beside everything else (2,000
# nodes' 200 a second kept it at 0.6 cores). The controller watches no Lease, so their rate is
# the control plane's load, not the controller's.
CURVE_LEASE_RENEWALS_PER_SECOND = 100
KUBELET_LEASE_SECONDS = 40
# Head-room over etcd's default 2 GiB backend quota for 100,000 pods and their history between
# the API server's compactions (every 5 minutes).
CURVE_ETCD_QUOTA_BYTES = 8 << 30
# kwok's default 4 pod workers, each waiting on one status PATCH at a time, brought 100,000 pods
# to Running at about 37 a second on the shared machine (the first 10,000-node run gave up after
# 2,000 s); the API server had CPU to spare, so more requests in flight, not more CPU, was missing.
CURVE_KWOK_POD_WORKERS = 16


def lease_seconds(nodes: int) -> int:
    """kwok's node lease duration for ``nodes``: the kubelet's, or longer so that the fleet
    renews at most CURVE_LEASE_RENEWALS_PER_SECOND."""
    return max(KUBELET_LEASE_SECONDS, math.ceil(4 * nodes / CURVE_LEASE_RENEWALS_PER_SECOND))


def control_plane_options(plan: Plan) -> Options:
    # A lease renewal late by minutes on a loaded machine must not turn nodes NotReady.
    if not plan.restart:  # the single point, as it was measured
        return Options(node_monitor_grace_period_seconds=300)
    lease = lease_seconds(plan.nodes)
    return Options(
        node_monitor_grace_period_seconds=max(300, 2 * lease),
        node_lease_duration_seconds=lease,
        etcd_flags=(f"--quota-backend-bytes={CURVE_ETCD_QUOTA_BYTES}",),
        kwok_pod_workers=CURVE_KWOK_POD_WORKERS,
    )


def etcd_db_bytes(dev: DevCluster) -> int:
    db = dev.layout.etcd_data / "member" / "snap" / "db"
    return db.stat().st_size if db.exists() else 0


# Enough objects for bytes per object, few enough that the bench's own memory stays small: the
# first pages, in name order.
CACHE_SAMPLE_NODES = 500


async def cache_sample(api: KubeApi) -> tuple[CacheSize, ...]:
    """Nodes as the API server lists them (in pages, as the informers list them), measured as
    the controller's views and as whole objects; and the same nodes' exporter state lines as the
    farm serves them, as the direct source keeps them and as parsed wire models. Pods are not
    sampled: the controller keeps no cache of them (gpumon/controller/shell/node_pods.py)."""
    nodes = await list_all(api, "/api/v1/nodes", at_most=CACHE_SAMPLE_NODES)
    now = time.time()
    lines = [
        wire.encode(wire.state_line(node_snapshot(name, seed, GPUS_PER_NODE, now), node=name, now=now))
        for seed, name in enumerate(node_names(CACHE_SAMPLE_NODES))
    ]
    return cache_size("nodes", nodes, node_from_json), stream_size(lines, now)


def memory_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


async def measure(plan: Plan, workdir: Path) -> Outcome:
    out = Outcome()
    out.loads["start"] = os.getloadavg()
    names = node_names(plan.nodes)
    with ExitStack() as stack:
        log("starting the control plane")
        dev = stack.enter_context(DevCluster.start(workdir / "cluster", options=control_plane_options(plan)))
        api = connect(dev.kubeconfig)
        try:
            cluster = Cluster(dev, api, workdir)
            controller_kubeconfig, naive_kubeconfig = await cluster.prepare()
            async with signal_farm(workdir, plan.nodes) as farm:
                out.setup = await build_fleet(cluster, names)
                out.memory_available = memory_available()
                out.control_plane_rss = {
                    c: memory(cluster.pid(c))[0] for c in ("kube-apiserver", "etcd", "kwok")
                }
                out.etcd_db_bytes = etcd_db_bytes(dev)
                out.loads["fleet built"] = os.getloadavg()
                out.cache = await cache_sample(api)
                await gpumon_phases(cluster, farm, workdir, controller_kubeconfig, names, plan, out)
                if plan.naive:
                    out.naive = await naive_run(cluster, farm, workdir, naive_kubeconfig, plan)
                out.loads["end"] = os.getloadavg()
        finally:
            await api.close()
    return out


async def gpumon_phases(
    cluster: Cluster,
    farm: Farm,
    workdir: Path,
    kubeconfig_file: Path,
    names: Sequence[str],
    plan: Plan,
    out: Outcome,
) -> None:
    config = controller_config(
        kubeconfig=str(kubeconfig_file),
        farm_url=farm.url,
        nodes=names,
        max_replicas=2 * nodes_needed(plan.pending),
    )
    ctl = ControllerProcess(workdir / "controller", config)
    replicas = [ctl]
    started = time.monotonic()
    ctl.spawn()
    assert ctl.child is not None
    pid = ctl.child.pid
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

            async def not_synced() -> str | None:
                if not ctl.running:
                    raise RuntimeError(f"the controller exited:\n{ctl.log_tail()}")
                text = await metrics_if_answering(session, ctl)
                if text is None:
                    return "starting"
                fresh = metric_sum(text, "gpumon_controller_nodes_by_signal_status", status="fresh")
                leading = metric_sum(text, "gpumon_controller_leader")
                return None if fresh >= len(names) and leading else f"{fresh:.0f} nodes with fresh signals"

            await poll("controller", not_synced, every=1.0)
            out.sync_seconds = time.monotonic() - started
            log(f"controller synced in {out.sync_seconds:.1f} s; settling {plan.settle_seconds:g} s")
            await asyncio.sleep(plan.settle_seconds)
            log(f"steady state, {plan.steady_seconds:g} s window")
            out.steady = await window(cluster, farm, pid, CONTROLLER_SA, plan.steady_seconds)
            out.rss = memory(pid)
            out.farm = await farm.stats()
            # Spread over the fleet; each a fresh node (no rule is flapping, no breaker near).
            trial_nodes = [
                names[(i * 2 + 1) * len(names) // (2 * plan.fault_trials)] for i in range(plan.fault_trials)
            ]
            for node in trial_nodes:
                log(f"fault: Xid {FAULT_XID} on GPU {FAULT_GPU} of {node}")
                out.faults.append(await fault_trial(cluster, farm, node))
                await asyncio.sleep(2.0)
            text = await controller_metrics(session, ctl)
            out.fault_to_taint_metric = histogram_mean(text, "gpumon_controller_fault_to_taint_seconds")
            out.scale = await scale_trial(cluster, plan.pending)
            text = await controller_metrics(session, ctl)
            out.pending_to_request_metric = histogram_mean(
                text, "gpumon_autoscaler_pending_to_request_seconds"
            )
            if plan.restart:
                # Another fresh node, the last by name: a restart's first rounds take the fleet
                # in name order but for the nodes that say something is wrong (until 2026-12-06
                # it was the first, which that order favours).
                node = next(n for n in reversed(names) if n not in trial_nodes)
                out.restart = await restart_trial(cluster, farm, ctl, session, node, len(names))
                log(f"restart: {out.restart}")
                if leader_change_fits(len(names), resource.getrlimit(resource.RLIMIT_NOFILE)[0]):
                    node = next(n for n in names if n not in trial_nodes and n != out.restart.node)
                    standby = ControllerProcess(workdir / "standby", {**config, "identity": "bench-standby"})
                    replicas.append(standby)
                    out.leader_change = await leader_change_trial(cluster, farm, ctl, standby, session, node)
                    log(f"leader change: {out.leader_change}")
            if plan.churn_seconds:
                holder = await lease_holder(session, replicas)
                out.churn = await churn_phase(cluster, farm, session, holder, names, faulted(out), plan)
                log(f"churn: {out.churn}")
    finally:
        for replica in replicas:
            replica.stop()


def faulted(out: Outcome) -> set[str]:
    """The nodes the trials gave a fault (quarantined): the churn leaves them alone."""
    nodes = {f.node for f in out.faults}
    nodes |= {t.node for t in (out.restart, out.leader_change) if t is not None}
    return nodes


# ---------------------------------------------------------------------------------------------
# Tables


def _list(seconds: Sequence[float]) -> str:
    return ", ".join(seconds_text(s) for s in seconds)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def steady_table(out: Outcome, plan: Plan) -> Table:
    steady, naive = out.steady, out.naive
    assert steady is not None and naive is not None
    nw, (rss, peak) = naive.window, out.rss
    rounds = [float(r["seconds"]) for r in naive.rounds]
    # What one round of polling everything costs, and so what a round every second would.
    cpu = _median([float(r["cpu_seconds"]) for r in naive.rounds])
    requests = _median([float(r["api_requests"]) for r in naive.rounds])
    snapshots = _median([float(r["snapshots"]) for r in naive.rounds])

    def naive_rate(per_round: float, measured: float, text: Callable[[float], str]) -> str:
        return f"{text(per_round)} at a round per second ({text(measured)} flat out)"

    def ratio(measured: float, per_round: float) -> str:
        return compare("", measured, per_round, str, lower_is_better=True).ratio

    return Table(
        f"Controller at scale: steady state ({plan.nodes:,} nodes, {plan.nodes * GPUS_PER_NODE:,} GPUs)",
        f"`gpumon controller --act` with direct signals from {plan.nodes:,} simulated exporters (one watch "
        f"stream each: {out.farm.get('watchers', 0):,} open, {out.farm.get('watch_connects', 0):,} "
        "connections made in all) and informers over the whole cluster, "
        f"measured over a {steady.seconds:.0f} s window {plan.settle_seconds:g} s after every node's "
        f"signals were fresh ({out.sync_seconds:.0f} s after start). The naive controller "
        "(`bench/naive_controller.py`) lists every Node and Pod and fetches every exporter's snapshot once a "
        f"second; a round took {_median(rounds):.1f} s here (median of {len(rounds)}, the first left out)"
        f"{', so it ran flat out' if _median(rounds) > 1 else ''}. A round costs {cpu:.1f} s of CPU, "
        f"{requests:.0f} API requests and {snapshots:,.0f} snapshots: what polling every second needs per "
        "second. The signal farm, one process serving every node's snapshots, used "
        f"{nw.farm_cores:.2f} cores meanwhile (a fleet's exporters would each serve their own). CPU is the "
        "process's utime + stime; API requests are counted by the API server per ServiceAccount (APF flow "
        f"schema). The kube-apiserver itself used {steady.apiserver_cores:.2f} cores during gpumon's window "
        f"(kwok renews {plan.nodes:,} node leases every 10 s) and {nw.apiserver_cores:.2f} during the naive "
        f"one's. Load average at the end of the windows: {_load(steady.load)} (gpumon), {_load(nw.load)} "
        "(naive).",
        (
            replace(
                alone("controller CPU", steady.cores, cores, target=TARGET_CPU),
                naive=naive_rate(cpu, nw.cores, cores),
                ratio=ratio(steady.cores, cpu),
            ),
            compare(
                "controller RSS", rss / MIB, naive.rss / MIB, mib, lower_is_better=True, target=TARGET_RSS
            ),
            compare(
                "controller peak RSS (VmHWM, initial lists included)",
                peak / MIB,
                naive.peak / MIB,
                mib,
                lower_is_better=True,
                target=TARGET_RSS,
            ),
            Row(
                "API requests/s the controller makes",
                "near zero beyond its watches",
                per_second(steady.requests_per_second),
                naive_rate(requests, nw.requests_per_second, per_second),
                ratio(steady.requests_per_second, requests),
            ),
            Row(
                "exporter requests/s (snapshots fetched)",
                "—",
                per_second(steady.snapshots_per_second),
                naive_rate(snapshots, nw.snapshots_per_second, per_second),
            ),
        ),
    )


def faults_table(out: Outcome, plan: Plan) -> Table:
    faults = out.faults
    taint = [f.to_taint for f in faults]
    evict = [f.taint_to_eviction for f in faults]
    partial = sum(f.evicted == gpu_pod_name(f.node, FAULT_GPU) for f in faults)
    naive = out.naive
    rounds = [float(r["seconds"]) for r in naive.rounds] if naive else []
    mean, _ = out.fault_to_taint_metric
    # A poller sees a fault within a round; a round takes at least its own CPU time on one core.
    cpu = _median([float(r["cpu_seconds"]) for r in naive.rounds]) if naive else math.nan
    naive_detection = f"≥ {cpu:.1f} s (a round's CPU; {_median(rounds):.1f} s here)" if rounds else "—"
    return Table(
        f"Controller at scale: one bad GPU among {plan.nodes * GPUS_PER_NODE:,}",
        f"{len(faults)} trials, each on another node: the signal farm gives GPU {FAULT_GPU} an Xid "
        f"{FAULT_XID} and pushes the exporter's health transition on that node's watch stream; the time "
        "runs from that push to the bench's own watches of the Node (our taint appears) and of the node's "
        f"pods (the first one being deleted). Per trial, to the taint: {_list(taint)}; taint to eviction: "
        f"{_list(evict)}. The evicted pod was the one on the bad GPU (partial drain) in {partial} of "
        f"{len(faults)} trials. The naive design cannot see a fault before its next poll round ends.",
        (
            alone("fault visible → node tainted (median)", _median(taint), seconds_text, target=TARGET_TAINT),
            replace(
                alone(
                    f"one bad node found and quarantined among {plan.nodes:,} (worst)",
                    max(taint),
                    seconds_text,
                    target=TARGET_QUARANTINE,
                ),
                naive=naive_detection,
            ),
            alone("node tainted → first eviction (worst)", max(evict), seconds_text, target=TARGET_EVICTION),
            alone("the controller's own first-bad-signal → taint (histogram mean)", mean, seconds_text),
            Row("pods evicted", "the bad GPU's", f"its pod only, {partial} of {len(faults)}"),
        ),
    )


def scale_table(out: Outcome, plan: Plan) -> Table:
    scale = out.scale
    assert scale is not None
    mean, count = out.pending_to_request_metric
    lags, req = scale.lags, scale.requests
    steps = (
        f"{len(req)} requests, {req[0][1]} at {req[0][0]:.1f} s … {req[-1][1]} at {req[-1][0]:.1f} s"
        if req
        else "none"
    )
    marked = scale.marked[-1] - scale.created_seconds if len(scale.marked) == plan.pending else math.inf
    exact = "yes" if scale.final == scale.needed else "**no**"
    return Table(
        "Controller at scale: pending GPU pods → pool scale request",
        f"{plan.pending} single-GPU pods that only the pool's nodes (none yet) can take, created in "
        f"{scale.created_seconds:.1f} s with {CREATE_WORKERS} concurrent requests. The kube-scheduler marks "
        f"them Unschedulable ({len(scale.marked)} seen, the last {seconds_text(marked)} after the last was "
        "created: it filters every node for each pod), and the controller asks the pool (a Cluster API "
        "MachineDeployment of 8-GPU nodes) for nodes through `/scale` as they come: "
        f"{steps} after the first pod was created, then watched for 5 s more. A pod's lag runs from the "
        "bench seeing it Unschedulable to a request with enough nodes for it and every pod marked before "
        "it. The naive autoscaler asks one node per pending pod.",
        (
            alone(
                f"pending GPU pod → scale request covering it (worst of {len(lags)})",
                max(lags, default=math.inf),
                seconds_text,
                target=TARGET_SCALE,
            ),
            alone("the same, median", _median(lags), seconds_text),
            alone(
                f"the controller's own histogram, oldest pod's condition time → request (mean of {count})",
                mean,
                seconds_text,
            ),
            alone("first pod created → first scale request", req[0][0] if req else math.inf, seconds_text),
            Row(
                "replicas requested",
                f"exactly {scale.needed}",
                f"{scale.final} ({exact})",
                f"{plan.pending}",
                f"{plan.pending / scale.final:.1f}× fewer" if scale.final else "—",
            ),
        ),
    )


def _load(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


def machine(out: Outcome, plan: Plan, seconds: float) -> list[tuple[str, str]]:
    setup = out.setup
    assert setup is not None
    pods = plan.nodes * len(bound_pods(node_names(1)[0]))
    software = (
        f"Linux {platform.release()}, Python {platform.python_version()}, Kubernetes "
        f"{KUBERNETES_VERSION}, etcd {ETCD_VERSION}, kwok {KWOK_VERSION}, aiohttp {version('aiohttp')}"
    )
    return [
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("command", "python -m bench controller-scale" + (" --quick" if plan.quick else "")),
        ("CPU", f"{cpu_model()}, nproc {os.cpu_count()}; nothing pinned"),
        ("load average (1/5/15 min)", "; ".join(f"{k}: {_load(v)}" for k, v in out.loads.items())),
        (
            "memory",
            f"{_total_memory() / 2**30:.1f} GiB, {out.memory_available / 2**30:.1f} GiB available with "
            "the fleet built; RSS of "
            + ", ".join(f"{k} {v / MIB:,.0f} MiB" for k, v in out.control_plane_rss.items()),
        ),
        ("software", software),
        (
            "fleet",
            f"{plan.nodes:,} nodes created in {setup.nodes_seconds:.0f} s, Ready "
            f"{setup.ready_seconds:.0f} s later; {pods:,} pods created in {setup.pods_seconds:.0f} s, "
            f"Running {setup.running_seconds:.0f} s later",
        ),
        ("duration", f"{seconds:.0f} s"),
    ]


def _total_memory() -> int:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal:"))
    return int(line.split()[1]) * 1024


INTRO = """\
The controller on a fleet: 2,000 kwok GPU nodes of 8 GPUs, 20,000 pods, a simulated exporter per
node, the real control plane (kube-apiserver, etcd, scheduler, controller-manager, kwok), and the
naive polling controller it replaces measured on the same cluster right after it. Targets:
docs/benchmarks.md, "Targets". Regenerate with `python -m bench controller-scale` (about ten
minutes; `--quick` runs 200 nodes and prints)."""

NOTES = (
    "Exporters are simulated at the signal level: `bench/signal_farm.py` serves every node's "
    "`/api/v1/watch` and `/api/v1/snapshot` from one process on one port, under a per-node prefix "
    "(`/nodes/<node>`), which the controller's static endpoint map (`signals.direct.endpoints`) "
    "addresses without any change. The documents are the exporter's own (its snapshot values, health "
    "judgement and serialisation); the GPUs' readings do not change between faults.",
    "Pods are bare pods bound through `spec.nodeName` (8 single-GPU pods and 2 CPU pods per node), so "
    "20,000 pods do not wait for the scheduler; kwok makes them Running. The controller still receives "
    "every pod's watch events and keeps only the GPU pods.",
    "The controller runs as the ServiceAccount of `deploy/rbac/controller.yaml` with its defaults "
    f"(leader election on, exporter heartbeats every {HEARTBEAT_SECONDS:g} s, a full re-evaluation "
    "every 300 s, which the steady window may or may not contain). Its steady API requests do not "
    "grow with the fleet: the leader "
    "lease (a GET and a PUT every 2 s: 1/s), the pool's target and its `/scale` (read every 10 s: "
    "0.2/s) and the informers' watch restarts (every 5 min); each watch is one long-running request.",
    "The machine has 2 cores shared by the whole control plane, the farm, both controllers and other "
    "engineers' builds and tests (see the load averages), so figures move between runs, and a "
    "process waiting for a core accrues no CPU time: the naive controller's rounds stretch, their CPU "
    "cost per round does not. The two controllers are measured one after the other, never together.",
    "The node monitor grace period is raised to 300 s for this run, so that kwok's lease renewals for "
    "2,000 nodes, late when the machine is busy, never turn nodes NotReady mid-run.",
)


async def run(plan: Plan, workdir: Path) -> str:
    started = time.monotonic()
    log("autoscaling plan, in-process")
    planning = autoscale_plan.measure()
    out = await measure(plan, workdir)
    return section_markdown(
        SECTION,
        title="Controller at scale",
        intro=INTRO,
        machine=machine(out, plan, time.monotonic() - started),
        tables=(steady_table(out, plan), faults_table(out, plan), scale_table(out, plan), planning),
        notes=NOTES,
    )


# ---------------------------------------------------------------------------------------------
# The curve: one fleet per size


CURVE_SECTION = "controller-scale-curve"
CURVE_CHURN_MINUTES = fleet_churn.GOAL_MINUTES
QUICK_CHURN_MINUTES = 2.0


@dataclass(frozen=True, slots=True)
class CurveRecord:
    """One size of the curve as it ran, as kept between runs: its figures (numbers), its row of
    the control-plane table (display text, never read back as numbers), its cache sample, when
    it ran, and its churn phase (None: not run, or the size ran before there was one). A curve run
    replaces the records of the sizes it ran and keeps the others, so one size can be run again
    (or added) without running every other."""

    point: scale_curve.Point
    control_plane: tuple[str, ...]
    cache: tuple[CacheSize, ...]
    seconds: float
    date: str
    churn: fleet_churn.Churn | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "point": asdict(self.point),
            "control_plane": list(self.control_plane),
            "cache": [asdict(c) for c in self.cache],
            "seconds": self.seconds,
            "date": self.date,
            "churn": None if self.churn is None else asdict(self.churn),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CurveRecord:
        return cls(
            point=scale_curve.Point(**doc["point"]),
            control_plane=tuple(doc["control_plane"]),
            cache=tuple(CacheSize(**c) for c in doc["cache"]),
            seconds=float(doc["seconds"]),
            date=str(doc["date"]),
            churn=fleet_churn.Churn(**doc["churn"]) if doc.get("churn") else None,
        )


def load_records(path: Path) -> dict[int, CurveRecord]:
    if not path.exists():
        return {}
    records = (CurveRecord.from_json(doc) for doc in json.loads(path.read_text()))
    return {r.point.nodes: r for r in records}


def save_records(path: Path, records: Mapping[int, CurveRecord]) -> None:
    docs = [records[n].to_json() for n in sorted(records)]
    path.write_text(json.dumps(docs, indent=1, allow_nan=True) + "\n")


def curve_point(out: Outcome, plan: Plan) -> scale_curve.Point:
    steady, restart, scale = out.steady, out.restart, out.scale
    assert steady is not None and restart is not None and scale is not None
    return scale_curve.Point(
        nodes=plan.nodes,
        cpu_cores=steady.cores,
        rss_bytes=float(out.rss[0]),
        requests_per_second=steady.requests_per_second,
        fault_to_taint=_median([f.to_taint for f in out.faults]),
        taint_to_eviction=max((f.taint_to_eviction for f in out.faults), default=math.nan),
        pending_to_request=max(scale.lags, default=math.inf),
        restart_synced=restart.synced,
        restart_decision=restart.decision,
        leader_change_decision=out.leader_change.decision if out.leader_change else math.nan,
        load=steady.load[0],
    )


CONTROL_PLANE_HEADER = (
    "nodes",
    "lease (renewals/s)",
    "nodes created, Ready",
    "pods created (per s), Running",
    "kube-apiserver cores (steady)",
    "RSS: kube-apiserver, etcd, kwok",
    "etcd db",
    "memory available",
    "restart: /metrics up, leading, signals fresh",
    "size took",
)


def control_plane_row(point: scale_curve.Point, out: Outcome, seconds: float) -> tuple[str, ...]:
    n = point.nodes
    setup, steady, restart = out.setup, out.steady, out.restart
    assert setup is not None and steady is not None and restart is not None
    lease = lease_seconds(n)
    rss = out.control_plane_rss
    return (
        f"{n:,}",
        f"{lease} s ({4 * n / lease:.0f}/s)",
        f"{setup.nodes_seconds:.0f} s, +{setup.ready_seconds:.0f} s",
        f"{setup.pods_seconds:.0f} s ({point.pods / setup.pods_seconds:.0f}/s), "
        f"+{setup.running_seconds:.0f} s",
        f"{steady.apiserver_cores:.2f}",
        ", ".join(f"{rss.get(c, 0) / MIB:,.0f}" for c in ("kube-apiserver", "etcd", "kwok")) + " MiB",
        f"{out.etcd_db_bytes / MIB:,.0f} MiB",
        f"{out.memory_available / 2**30:.1f} GiB",
        f"{seconds_text(restart.up)}, {seconds_text(restart.leading)}, {seconds_text(restart.fresh)}",
        f"{seconds:.0f} s",
    )


def control_plane_grid(records: Sequence[CurveRecord]) -> Grid:
    return Grid(
        "Controller scale curve: the control plane at each size",
        "What the test setup cost the machine at each size: the fleet's build, the API server's CPU during "
        "the controller's steady window, the control plane's memory with the fleet built, etcd's database "
        "file. Restart columns: from the controller's process started again.",
        CONTROL_PLANE_HEADER,
        tuple(r.control_plane for r in records),
    )


CURVE_INTRO = """\
The controller at several fleet sizes, each in a fresh control plane: kwok GPU nodes of 8 GPUs
with 10 pods each (8 single-GPU pods, 2 CPU pods), the signal farm as every node's exporter, the
real `gpumon controller --act`. Per size: steady CPU, RSS and API requests, fault → taint →
eviction, pending pods → scale request, a restart (SIGKILL, a fault injected while it is down,
started again) to its informers synced and to its first correct decision (that node tainted),
and, where two replicas fit, a leader change to a synced standby; then the fleet churns (pods
replaced, nodes leaving and joining) for 30 minutes under the replica holding the lease, whose
lease losses are counted (issue #29: none at 10,000 nodes). Then a least-squares line per
figure. Regenerate with
`python -m bench controller-scale --curve 1000,2000,5000,10000`: a run replaces the rows of the
sizes it ran and keeps the others, whose figures bench/controller-scale-curve.json holds (the
date row says when each ran). docs/benchmarks.md says what the lines imply for 65,000 nodes."""

CURVE_NOTES = (
    "Each size starts its own control plane and fleet, so no size inherits another's quarantined "
    "nodes, evicted pods, scaled pool or etcd history (docs/benchmarks.md argues this against growing "
    "one fleet). The naive controller is not run on the curve: a round at 2,000 nodes already took "
    "17 s and 0.9 GiB (the single-point section).",
    "The controller runs with its defaults but for acting and one pool (bench/scale_fleet.py): the direct "
    f"source, its exporters asked for a heartbeat every {HEARTBEAT_SECONDS:g} s (a third of the "
    f"{ControllerConfig().signals.stale_after_seconds:g} s staleness), a full re-evaluation every 300 s.",
    "Test-setup tuning (not the controller's): kwok's node lease is lengthened so that the fleet "
    f"renews at most {CURVE_LEASE_RENEWALS_PER_SECOND} leases a second at any size: the kubelet's "
    f"{KUBELET_LEASE_SECONDS} s up to {CURVE_LEASE_RENEWALS_PER_SECOND * KUBELET_LEASE_SECONDS // 4:,} "
    "nodes, "
    f"4 × nodes / {CURVE_LEASE_RENEWALS_PER_SECOND} s beyond (the lease column); the node monitor's grace "
    "period is twice the lease, at least 300 s; etcd's backend quota is 8 GiB. The controller watches "
    "no Lease: their rate loads the control plane, not the controller.",
    "Fault trials and the pending burst are those of the single point (3 faults, 500 pending pods); "
    "the restart's fault is a fourth node and the leader change's a fifth, within the default "
    "quarantine rate limit of 5. The restart keeps the controller's identity, as a container restart "
    "does, so the lease is its own at once. The leader change starts a second replica (another "
    "identity), waits for its caches, kills the leader (SIGKILL: the lease is not released) and "
    "injects the fault at that moment: the standby waits for the lease to lapse (15 s by default). "
    "It runs only where two replicas' exporter streams fit the farm's open-file limit (2 × nodes + "
    "1,000); '—' where they do not.",
    "The churn (bench/fleet_churn.py) runs last, under the replica that holds the lease then (the "
    "restarted controller, or after a leader change the standby; the lease-holder's gauge says "
    "which), at steady rates, spread over the fleet and sparing the nodes the trials faulted. Pods: "
    "a bench pod deleted and a replacement created on its node (another name, the same kind, GPU "
    "and CPU pods 8 to 2 as the fleet has them). Nodes: one leaves (its 10 pods deleted, then the "
    "Node) and the one that left 3 steps earlier joins again (the Node, then its 10 pods), keeping "
    "its name, so the farm and the static endpoint map serve its exporter as it joins; the fleet is "
    "3 nodes short while it churns. The defaults, 2 pods replaced a second and a node every 10 s "
    "(`--churn-pods-per-second`, `--churn-node-seconds`; `--churn-minutes 0` skips), add about "
    "6 pod writes and kwok's status patches a second to the API server beside kwok's "
    f"{CURVE_LEASE_RENEWALS_PER_SECOND} lease renewals: chosen for what the 2-core machine should "
    "sustain at 10,000 nodes beside the control plane; the churn table's lag says whether the bench "
    "kept to its schedule. "
    "The controller keeps no Pod cache, so replaced pods reach it only through the lists of one "
    "node's pods its decisions make (the pod lists column); nodes reach it through its Node "
    "informer. A replacement pod's name is not the one the farm's exporter names on that GPU, "
    "which matters only to a partial drain, and no fault is injected while the fleet churns.",
    "Times are wall-clock seconds on a machine of 2 cores that also runs the control plane, the "
    "farm and other people's work: see the load column and the control-plane table.",
)


def curve_section(records: Mapping[int, CurveRecord], stopped: str | None) -> str:
    ordered = [records[n] for n in sorted(records)]
    points = [r.point for r in ordered]
    largest = ordered[-1]
    by_date: dict[str, list[str]] = {}
    for r in ordered:
        by_date.setdefault(r.date, []).append(f"{r.point.nodes:,}")
    machine = [
        ("date", "; ".join(f"{date} ({', '.join(sizes)} nodes)" for date, sizes in sorted(by_date.items()))),
        ("sizes", ", ".join(f"{p.nodes:,} nodes" for p in points) + (f"; {stopped}" if stopped else "")),
        ("CPU", f"{cpu_model()}, nproc {os.cpu_count()}; nothing pinned"),
        ("memory", f"{_total_memory() / 2**30:.1f} GiB"),
        (
            "software",
            f"Linux {platform.release()}, Python {platform.python_version()}, Kubernetes "
            f"{KUBERNETES_VERSION}, etcd {ETCD_VERSION}, kwok {KWOK_VERSION}, aiohttp {version('aiohttp')}",
        ),
    ]
    run_out = scale_curve.first_to_run_out(points)
    churns = {r.point.nodes: r.churn for r in ordered if r.churn is not None}
    tables = [
        scale_curve.curve_grid(points, churns),
        fleet_churn.churn_grid([(r.point.nodes, r.churn) for r in ordered], LEADER_POLL_TIMEOUT),
        scale_curve.fit_grid(points),
        scale_curve.cache_grid(largest.cache, largest.point.nodes),
        control_plane_grid(ordered),
    ]
    notes = list(CURVE_NOTES)
    if run_out is not None:
        notes.append(
            f"Of the figures with a goal, the first whose fitted line reaches it: {run_out[0]}, at "
            f"{run_out[1]:,.0f} nodes."
        )
    return section_markdown(
        CURVE_SECTION,
        title="Controller scale curve",
        intro=CURVE_INTRO,
        machine=machine,
        tables=tables,
        notes=notes,
    )


async def curve(
    sizes: Sequence[int],
    base: Plan,
    workdir: Path,
    records: dict[int, CurveRecord],
    write: Callable[[dict[int, CurveRecord], str | None], None],
) -> bool:
    """Each size in turn, in its own control plane, its record replacing that size's earlier one;
    written after every size, so a size that fails (or a stop) leaves the others; the first
    failure ends the curve (False)."""
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    for nodes in sizes:
        plan = replace(base, nodes=nodes, naive=False, restart=True)
        log(f"curve: {nodes:,} nodes")
        t0 = time.monotonic()
        try:
            out = await measure(plan, workdir / f"n{nodes}")
        except Exception as e:  # the curve stops at the largest size that runs, and says why
            stopped = f"{nodes:,} nodes did not run: {type(e).__name__}: {e}"
            log(f"curve: {stopped}")
            if records:
                write(records, stopped.splitlines()[0])
            return False
        point = curve_point(out, plan)
        seconds = time.monotonic() - t0
        records[nodes] = CurveRecord(
            point, control_plane_row(point, out, seconds), tuple(out.cache), seconds, started, out.churn
        )
        write(records, None)
        # etcd data: hundreds of MiB at 10,000; the logs beside it are small and kept
        shutil.rmtree(workdir / f"n{nodes}" / "cluster", ignore_errors=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench controller-scale", description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK.nodes} nodes, short windows; print")
    parser.add_argument("--nodes", type=int, help="fleet size (default: 2,000, or 200 with --quick)")
    parser.add_argument(
        "--curve",
        type=lambda text: [int(x) for x in text.split(",")],
        help="fleet sizes, e.g. 1000,2000,5000,10000: one fresh fleet each, the curve section of RESULTS.md",
    )
    parser.add_argument("--output", type=Path, help=f"where to write (default: {RESULTS}, full runs)")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="run in DIR and leave the controller's, the farm's and kwok's logs there (default: a "
        "temporary directory, removed at the end)",
    )
    parser.add_argument(
        "--churn-minutes",
        type=float,
        help=f"with --curve: the fleet churns this long after each size's trials (default: "
        f"{CURVE_CHURN_MINUTES:g}, or {QUICK_CHURN_MINUTES:g} with --quick; 0 skips)",
    )
    parser.add_argument(
        "--churn-pods-per-second",
        type=float,
        default=fleet_churn.Rates().pods_per_second,
        help="with --curve: pods replaced a second while the fleet churns (default: %(default)g)",
    )
    parser.add_argument(
        "--churn-node-seconds",
        type=float,
        default=fleet_churn.Rates().node_seconds,
        help="with --curve: a node leaves and one joins this often (default: %(default)g s; 0: none)",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.nodes:
        plan = replace(plan, nodes=args.nodes)
    if args.curve:
        minutes = args.churn_minutes
        if minutes is None:
            minutes = QUICK_CHURN_MINUTES if args.quick else CURVE_CHURN_MINUTES
        rates = fleet_churn.Rates(args.churn_pods_per_second, args.churn_node_seconds)
        plan = replace(plan, churn_seconds=60 * minutes, churn=rates)
    elif args.churn_minutes is not None:
        parser.error("--churn-minutes is for --curve: the single point has no table for it")
    output = args.output or (None if args.quick else RESULTS)

    def write(section: str) -> None:
        if output is None:
            sys.stdout.write(section + "\n")
        else:
            output.write_text(splice(output.read_text() if output.exists() else "", section))
            print(f"bench: wrote {output}", file=sys.stderr)

    with ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            workdir = args.keep
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpumon-bench-scale-")))
        if not args.curve:
            write(asyncio.run(run(plan, workdir)))
            return 0
        # beside the section it renders: bench/controller-scale-curve.json for RESULTS.md
        records_file = None if output is None else output.parent / f"{CURVE_SECTION}.json"
        records = {} if records_file is None else load_records(records_file)

        def write_curve(records: dict[int, CurveRecord], stopped: str | None) -> None:
            if records_file is not None:
                save_records(records_file, records)
            write(curve_section(records, stopped))

        return 0 if asyncio.run(curve(args.curve, plan, workdir, records, write_curve)) else 1
