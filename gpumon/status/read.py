"""The one I/O module of ``gpumon status``: one round of reads from the API server (and the
controller's /metrics, and for ``status node`` the node's exporter), into a ClusterState.

Every read is independent: one that fails (RBAC, a missing CRD, an unreachable controller) is
named in ``problems`` and the rest of the picture is still shown. Only an unreachable API
server ends the round, since nothing is left to show.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gpumon.controller.core.contract.node import is_quarantined
from gpumon.controller.core.objects import GpuResources, pdb_from_json
from gpumon.controller.core.pools import Pool
from gpumon.controller.read import read_scale
from gpumon.kube.client import KubeApi, KubeError, NotFound, Unreachable
from gpumon.status.allocation import is_gpu_node
from gpumon.status.state import (
    ClusterState,
    NodeInfo,
    PodInfo,
    PoolTarget,
    discovered_target,
    event_info,
    node_info,
    pod_info,
    pool_target,
)
from gpumon.wire import v1 as wire

EVENT_SOURCE = "gpumon-controller"
# Cluster API kinds with a /scale subresource: the node pools gpumon may size.
SCALE_KINDS = (
    ("cluster.x-k8s.io", "v1beta2", "machinedeployments"),
    ("cluster.x-k8s.io", "v1beta2", "machinesets"),
    ("cluster.x-k8s.io", "v1beta2", "machinepools"),
)
_PAGE = 500


class NodeNotFound(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Sources:
    """Where to look; from the controller's configuration (``--config``) and flags."""

    namespace: str  # the controller's
    state_configmap: str
    resources: GpuResources
    node_selector: str = ""
    controller_service: str = "gpumon-controller"
    controller_port: str = "metrics"  # port name (or number) of that Service
    controller_url: str | None = None  # direct, instead of through the API server's proxy
    # Exporters, as the controller's direct signals find them.
    exporter_namespace: str = "gpumon-system"
    exporter_selector: str = "app.kubernetes.io/name=gpumon-exporter"
    exporter_port: int = 9842
    exporter_scheme: str = "http"
    exporter_endpoints: Mapping[str, str] = field(default_factory=dict)
    pools: tuple[Pool, ...] = ()  # the controller's autoscaled pools
    timeout_seconds: float = 10.0


async def list_all(api: KubeApi, path: str, params: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    query = {**(params or {}), "limit": str(_PAGE)}
    while True:
        body = await api.get(path, query)
        items.extend(body.get("items") or ())
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return items
        query["continue"] = token


async def read_cluster(
    api: KubeApi,
    src: Sources,
    *,
    node: str | None = None,
    session: aiohttp.ClientSession,
    wall_clock: Callable[[], float] = time.time,
) -> ClusterState:
    """The fleet (``node`` None) or one node's picture. Raises :class:`Unreachable` when the API
    server does not answer and :class:`NodeNotFound` for an unknown ``node``."""
    problems: list[str] = []

    async def attempt(what: str, read: Awaitable[Any], default: Any) -> Any:
        try:
            return await read
        except Unreachable:
            raise
        except KubeError as e:
            problems.append(f"{what}: {e}")
            return default

    nodes = await _nodes(api, src, node)
    watched = [n for n in nodes if is_quarantined(n.view)] if node is None else nodes
    reads: list[Awaitable[Any]] = [
        attempt("pods", _pods(api, src, watched, pending=node is None), ()),
        attempt("PodDisruptionBudgets", list_all(api, "/apis/policy/v1/poddisruptionbudgets"), []),
        attempt("Events", _events(api), ()),
        attempt(
            "the controller's ConfigMap",
            api.get(f"/api/v1/namespaces/{src.namespace}/configmaps/{src.state_configmap}"),
            None,
        ),
        _pools(api, src, problems) if node is None else _none(),
        _metrics(api, src, session),
        _snapshot(api, src, node, session) if node is not None else _none(),
    ]
    pods, pdbs, events, configmap, scale, (metrics, metrics_from, metrics_error), snap = await asyncio.gather(
        *reads
    )
    snapshot, snapshot_from, snapshot_error = snap or (None, "", None)
    return ClusterState(
        now=wall_clock(),
        nodes=tuple(nodes),
        pods=tuple(pods),
        pdbs=tuple(pdb_from_json(p) for p in pdbs),
        events=tuple(sorted(events, key=lambda e: (e.at or "", e.sequence))),
        state_annotations=None
        if configmap is None
        else dict((configmap.get("metadata") or {}).get("annotations") or {}),
        pools=tuple(scale or ()),
        metrics=metrics,
        metrics_source=metrics_from,
        metrics_error=metrics_error,
        snapshot=snapshot,
        snapshot_source=snapshot_from,
        snapshot_error=snapshot_error,
        problems=tuple(problems),
    )


async def _none() -> None:
    return None


async def _nodes(api: KubeApi, src: Sources, name: str | None) -> list[NodeInfo]:
    if name is not None:
        try:
            return [node_info(await api.get(f"/api/v1/nodes/{name}"), src.resources)]
        except NotFound:
            raise NodeNotFound(name) from None
    params = {"labelSelector": src.node_selector} if src.node_selector else None
    found = [node_info(obj, src.resources) for obj in await list_all(api, "/api/v1/nodes", params)]
    return sorted(found, key=lambda n: n.view.name)


async def _pods(api: KubeApi, src: Sources, nodes: list[NodeInfo], *, pending: bool) -> tuple[PodInfo, ...]:
    """GPU pods on ``nodes`` (one query each: only quarantined nodes), and pending GPU pods."""
    queries = [{"fieldSelector": f"spec.nodeName={n.view.name}"} for n in nodes]
    if pending:
        queries.append({"fieldSelector": "status.phase=Pending"})
    lists = await asyncio.gather(*(list_all(api, "/api/v1/pods", q) for q in queries))
    seen: dict[str, PodInfo] = {}
    for obj in (o for items in lists for o in items):
        pod = pod_info(obj, src.resources)
        if pod.view.uses_gpu:
            seen[pod.view.uid] = pod
    return tuple(seen.values())


async def _events(api: KubeApi) -> tuple[Any, ...]:
    params = {"fieldSelector": f"reportingComponent={EVENT_SOURCE}"}
    try:
        items = await list_all(api, "/api/v1/events", params)
    except KubeError as e:
        if e.status != 403:
            raise
        # Allowed to read only Node events (they live in `default`).
        items = await list_all(api, "/api/v1/namespaces/default/events", params)
    return tuple(event_info(o) for o in items)


async def _pools(api: KubeApi, src: Sources, problems: list[str]) -> list[PoolTarget]:
    """The configured pools' /scale targets; without any, the Cluster API objects there are."""
    if src.pools:
        return list(await asyncio.gather(*(_pool(api, p) for p in src.pools)))
    out = []
    for group, version, plural in SCALE_KINDS:
        try:
            items = await list_all(api, f"/apis/{group}/{version}/{plural}")
        except NotFound:
            continue  # the CRD is not installed
        except KubeError as e:
            if e.status == 0:
                raise
            problems.append(f"{plural}.{group}: {e}")
            continue
        out += [discovered_target(o) for o in items]
    return out


async def _pool(api: KubeApi, pool: Pool) -> PoolTarget:
    try:
        return pool_target(pool, await read_scale(api, pool.target))
    except Unreachable:
        raise
    except KubeError as e:
        return pool_target(pool, None, str(e))


async def _metrics(
    api: KubeApi, src: Sources, session: aiohttp.ClientSession
) -> tuple[str | None, str, str | None]:
    """(text, where from, why not)."""
    if src.controller_url is not None:
        url = src.controller_url.rstrip("/") + "/metrics"
        try:
            return (await _fetch(session, url, src.timeout_seconds)).decode(errors="replace"), url, None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            return None, url, str(e) or type(e).__name__
    path = (
        f"/api/v1/namespaces/{src.namespace}/services/"
        f"{src.controller_service}:{src.controller_port}/proxy/metrics"
    )
    try:
        lines = [line.decode(errors="replace") async for line in api.lines(path, {})]
    except KubeError as e:
        return None, path, str(e)
    return "".join(lines), path, None


async def _fetch(session: aiohttp.ClientSession, url: str, timeout_seconds: float) -> bytes:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_seconds)) as resp:
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status}")
        return await resp.read()


def _refused(e: wire.WireError) -> str:
    return f"the exporter sent a snapshot that wire schema {wire.SCHEMA_VERSION} refuses ({e})"


async def _snapshot(
    api: KubeApi, src: Sources, node: str, session: aiohttp.ClientSession
) -> tuple[wire.SnapshotDoc | None, str, str | None]:
    """The node's exporter snapshot: from a configured endpoint, else through the API server's
    proxy to the exporter pod on that node."""
    base = src.exporter_endpoints.get(node)
    if base is not None:
        url = base.rstrip("/") + "/api/v1/snapshot"
        try:
            return wire.parse_snapshot(await _fetch(session, url, src.timeout_seconds)), url, None
        except wire.WireError as e:
            return None, url, _refused(e)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            return None, url, str(e) or type(e).__name__
    ns = src.exporter_namespace
    params = {"labelSelector": src.exporter_selector, "fieldSelector": f"spec.nodeName={node}"}
    try:
        pods = await list_all(api, f"/api/v1/namespaces/{ns}/pods", params)
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        if not running:
            return None, f"{ns}/{src.exporter_selector}", "no running exporter pod on the node"
        name = running[0]["metadata"]["name"]
        scheme = "https:" if src.exporter_scheme == "https" else ""
        path = f"/api/v1/namespaces/{ns}/pods/{scheme}{name}:{src.exporter_port}/proxy/api/v1/snapshot"
        body = await api.get(path)
    except KubeError as e:
        return None, f"exporter pod on {node}", str(e)
    try:
        # The API client hands back decoded JSON, and the schema is strict about JSON text (a
        # Python list is not a JSON array to it), so the body is read as the text it was.
        return wire.parse_snapshot(json.dumps(body).encode()), path, None
    except wire.WireError as e:
        return None, path, _refused(e)


@dataclass(frozen=True, slots=True)
class AllocationReads:
    """What ``status allocation`` read: raw Nodes and Pods, and each GPU node's exporter snapshot
    (None, where from, why not) when usage was asked for."""

    nodes: tuple[Mapping[str, Any], ...]
    pods: tuple[Mapping[str, Any], ...]
    snapshots: Mapping[str, tuple[wire.SnapshotDoc | None, str, str | None]]
    problems: tuple[str, ...]


# Exporter snapshots read at once: a fleet's worth through the API server's proxy, bounded.
_SNAPSHOT_CONCURRENCY = 8


async def read_allocation(
    api: KubeApi, src: Sources, *, node: str | None, session: aiohttp.ClientSession, usage: bool
) -> AllocationReads:
    """The GPU nodes (or ``node``), the pods bound to them, and with ``usage`` their exporters'
    snapshots. Raises :class:`Unreachable` and, for an unknown ``node``, :class:`NodeNotFound`."""
    problems: list[str] = []
    if node is not None:
        try:
            nodes = [await api.get(f"/api/v1/nodes/{node}")]
        except NotFound:
            raise NodeNotFound(node) from None
        query = {"fieldSelector": f"spec.nodeName={node}"}
    else:
        params = {"labelSelector": src.node_selector} if src.node_selector else None
        nodes = await list_all(api, "/api/v1/nodes", params)
        query = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}
    gpu_nodes = [n for n in nodes if is_gpu_node(n)]
    try:
        pods = await list_all(api, "/api/v1/pods", query)
    except Unreachable:
        raise
    except KubeError as e:
        problems.append(f"pods: {e}")
        pods = []
    snapshots: dict[str, tuple[wire.SnapshotDoc | None, str, str | None]] = {}
    if usage:
        gate = asyncio.Semaphore(_SNAPSHOT_CONCURRENCY)

        async def one(name: str) -> None:
            async with gate:
                snapshots[name] = await _snapshot(api, src, name, session)

        await asyncio.gather(*(one(str((n.get("metadata") or {}).get("name", ""))) for n in gpu_nodes))
    return AllocationReads(tuple(gpu_nodes), tuple(pods), snapshots, tuple(problems))
