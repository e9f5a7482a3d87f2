"""A signal farm: the exporter API of many simulated GPU nodes, served by one process.

``python -m bench.signal_farm --nodes 2000 --port 8000`` serves, for every node of
:mod:`bench.scale_fleet`, what ``gpumon exporter`` serves the controller on that node:
``/nodes/<node>/api/v1/watch`` and ``/nodes/<node>/api/v1/snapshot``. The controller's static
endpoint map points each node at its prefix (``http://127.0.0.1:8000/nodes/<node>``).

The documents are the exporter's own: :class:`~gpumon.gpu.model.Snapshot` values built from
simulated GPUs (identities, fast and slow fields, the exporter's health judgement, the node's
pods on its GPUs), serialised through the wire schema (:mod:`gpumon.wire.v1`), streamed by its
``watch_stream`` (the handler of ``/api/v1/watch``), health transitions found by the sampler's
``watch_events`` and queued per subscriber by its ``Watcher``. What the farm leaves out is the
sampling: a node's GPUs keep the values they had at start, so nothing changes until a fault is
injected, and the timestamps a snapshot carries are brought up to date once a second, as an
exporter's 1 s sampling would.

Bench routes: ``POST /farm/faults`` ``{"node", "gpu", "xid"}`` gives that GPU the Xid now and
answers the time the transition was pushed; ``GET /farm/stats`` counts watchers and requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from aiohttp import web

from bench.scale_fleet import NAMESPACE, gpu_pod_name, node_names
from gpumon.devices.simulated import SimulatedBackend
from gpumon.exporter.sampler import Watcher, watch_events
from gpumon.exporter.server import watch_stream
from gpumon.gpu.health import HealthPolicy, judge
from gpumon.gpu.model import GpuSample, PodGpuUsage, PodRef, Snapshot, XidEvent
from gpumon.wire import v1 as wire

log = logging.getLogger(__name__)

POLICY = HealthPolicy()
REFRESH_SECONDS = 1.0  # the exporter's default fast sampling interval


def node_snapshot(node: str, seed: int, gpus: int, now: float) -> Snapshot:
    """The node's simulated GPUs as an exporter would sample them, its pods one per GPU."""
    backend = SimulatedBackend(gpus, seed=seed, clock=lambda: now)
    driver = backend.open()
    samples = []
    for identity in backend.devices():
        fast, slow = backend.read_fast(identity.index), backend.read_slow(identity.index)
        health = judge(fast=fast, slow=slow, recent_xids=(), lost=False, now=now, policy=POLICY)
        samples.append(GpuSample(identity, fast, slow, health, now))
    backend.close()
    pods = tuple(
        PodGpuUsage(
            PodRef(NAMESPACE, gpu_pod_name(node, g.identity.index), "cuda"),
            g.identity.index,
            g.identity.uuid,
            allocated_resources=("nvidia.com/gpu",),
        )
        for g in samples
    )
    return Snapshot(node, driver, tuple(samples), pods, now, backend_up=True, complete=True)


def with_xid(snapshot: Snapshot, gpu: int, code: int, now: float) -> Snapshot:
    """``snapshot`` after GPU ``gpu`` reported Xid ``code`` at ``now``, judged as the exporter
    judges it."""
    out = []
    for g in snapshot.gpus:
        if g.identity.index == gpu:
            event = XidEvent(g.identity.uuid, code, now, gpu)
            health = judge(fast=g.fast, slow=g.slow, recent_xids=(event,), lost=False, now=now, policy=POLICY)
            counts = MappingProxyType({**g.xid_counts, code: g.xid_counts.get(code, 0) + 1})
            g = replace(
                g,
                health=health,
                xid_counts=counts,
                last_xid=code,
                xids=tuple(sorted((*(e for e in g.xids if e.xid != code), event), key=lambda e: e.xid)),
                sampled_at=now,
            )
        out.append(g)
    if not any(g.identity.index == gpu for g in out):
        raise KeyError(f"{snapshot.node} has no GPU {gpu}")
    return replace(snapshot, gpus=tuple(out), taken_at=now)


@dataclass
class FarmNode:
    snapshot: Snapshot
    watchers: set[Watcher] = field(default_factory=set)
    # The snapshot's wire document as JSON values, and the bytes served with their timestamps
    # set at ``served_at``.
    doc: dict[str, Any] | None = None
    body: bytes = b""
    served_at: float = float("-inf")

    def snapshot_body(self, now: float) -> bytes:
        if self.doc is None:
            self.doc = wire.snapshot_document(self.snapshot).model_dump(mode="json")
        if now - self.served_at >= REFRESH_SECONDS:
            self.doc["taken_at"] = now
            for g in self.doc["gpus"]:
                g["sampled_at"] = now
            self.body = json.dumps(self.doc, separators=(",", ":")).encode()
            self.served_at = now
        return self.body

    def update(self, snapshot: Snapshot) -> None:
        events = watch_events(self.snapshot, snapshot, hot_celsius=POLICY.temperature_degraded_celsius)
        self.snapshot, self.doc, self.served_at = snapshot, None, float("-inf")
        for w in self.watchers:
            w.push(events)


@dataclass
class Stats:
    watch_connects: int = 0
    snapshots: int = 0


@dataclass
class Farm:
    nodes: dict[str, FarmNode]
    wall_clock: Callable[[], float] = time.time
    stats: Stats = field(default_factory=Stats)
    streams: set[asyncio.Task[Any]] = field(default_factory=set)

    @classmethod
    def build(cls, count: int, gpus: int, wall_clock: Callable[[], float] = time.time) -> Farm:
        now = wall_clock()
        nodes = {
            name: FarmNode(node_snapshot(name, i, gpus, now)) for i, name in enumerate(node_names(count))
        }
        return cls(nodes, wall_clock)


FARM = web.AppKey("farm", Farm)


def _node(request: web.Request) -> tuple[str, FarmNode]:
    name = request.match_info["node"]
    node = request.app[FARM].nodes.get(name)
    if node is None:
        raise web.HTTPNotFound(text=f"no node {name}\n")
    return name, node


async def _snapshot(request: web.Request) -> web.Response:
    farm = request.app[FARM]
    _, node = _node(request)
    farm.stats.snapshots += 1
    return web.Response(body=node.snapshot_body(farm.wall_clock()), content_type="application/json")


async def _watch(request: web.Request) -> web.StreamResponse:
    farm = request.app[FARM]
    name, node = _node(request)

    def subscribe() -> Watcher:
        farm.stats.watch_connects += 1
        watcher = Watcher()
        node.watchers.add(watcher)
        return watcher

    return await watch_stream(
        request,
        node=name,
        subscribe=subscribe,
        unsubscribe=node.watchers.discard,
        current=lambda: node.snapshot,
        wall_clock=farm.wall_clock,
        streams=farm.streams,
    )


async def _fault(request: web.Request) -> web.Response:
    farm = request.app[FARM]
    try:
        body = await request.json()
        node = farm.nodes[str(body["node"])]
        now = farm.wall_clock()
        node.update(with_xid(node.snapshot, int(body["gpu"]), int(body["xid"]), now))
    except (ValueError, KeyError, TypeError) as e:
        return web.json_response({"error": f"bad fault: {e!r}"}, status=400)
    return web.json_response({"at": now, "watchers": len(node.watchers)})


async def _stats(request: web.Request) -> web.Response:
    farm = request.app[FARM]
    s = farm.stats
    return web.json_response(
        {
            "nodes": len(farm.nodes),
            "watchers": sum(len(n.watchers) for n in farm.nodes.values()),
            "watch_connects": s.watch_connects,
            "snapshots": s.snapshots,
        }
    )


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _end_streams(app: web.Application) -> None:
    for task in list(app[FARM].streams):
        task.cancel()


def make_app(farm: Farm) -> web.Application:
    app = web.Application()
    app[FARM] = farm
    app.on_shutdown.append(_end_streams)
    app.router.add_get("/nodes/{node}/api/v1/watch", _watch)
    app.router.add_get("/nodes/{node}/api/v1/snapshot", _snapshot)
    app.router.add_post("/farm/faults", _fault)
    app.router.add_get("/farm/stats", _stats)
    app.router.add_get("/healthz", _healthz)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.signal_farm", description=__doc__)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    farm = Farm.build(args.nodes, args.gpus)
    print(f"signal farm: {args.nodes} nodes on 127.0.0.1:{args.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        # The controller opens one watch per node at once: a deep accept queue spares it retries.
        web.run_app(
            make_app(farm),
            host="127.0.0.1",
            port=args.port,
            access_log=None,
            backlog=4096,
            print=None,
            shutdown_timeout=2,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
