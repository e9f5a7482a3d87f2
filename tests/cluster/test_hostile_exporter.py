"""Issue #18 on the real control plane: one node of three has a hostile exporter (oversized,
malformed and flooding answers, on the watch stream and then on the snapshot endpoint). The
other two are quarantined and recovered as without it; the hostile node is never quarantined
and none of its pods is evicted."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.test_utils import TestServer
from controller_harness import (  # noqa: F401 - fixtures
    Scene,
    events,
    exporters,
    fresh_signals,
    node_obj,
    our_taint,
    running,
    running_pods,
    sa_kubeconfig_for_fixture,
    scene_fixture,
    tainted,
    wait_for_event,
)

from gpumon.devcluster.waiting import eventually
from gpumon.wire import v1 as wire

_GPU = {"gpu": 0, "uuid": "GPU-hostile-0", "health": {"state": "healthy", "reasons": []}}


def _line(doc: object) -> bytes:
    return json.dumps(doc).encode() + b"\n"


def _hostile_lines(node: str, connection: int) -> list[bytes]:
    """What each watch connection gets: each ends in something the wire refuses, some after a
    good state line (which makes the node fresh until the refusal withdraws it)."""
    head = {"schema": 1, "node": node, "time": 1.0}
    state = {**head, "type": "state", "backend_up": True, "gpus": [_GPU]}
    scripts = [
        [b"x" * (wire.MAX_LINE_BYTES + 1)],  # oversized, and no newline
        [_line(state), b"[]\n"],  # not an object
        [
            _line(state),
            _line({**head, "type": "health", "previous": "healthy", "gpu": {**_GPU, "gpu": "BIG"}}).replace(
                b'"BIG"', b"1e999"
            ),
        ],
        [
            _line(state),
            *(_line({**head, "type": "heartbeat"}) for _ in range(5000)),
        ],  # a flood
        [_line({**state, "gpus": [_GPU] * (wire.MAX_GPUS + 1)})],  # too many GPUs
    ]
    return scripts[connection]


@contextlib.asynccontextmanager
async def hostile_exporter(node: str) -> AsyncIterator[tuple[str, list[str]]]:
    """Serves the scripts above, one per watch connection, then answers 404 (so it is polled)
    and serves an oversized, then a malformed, snapshot in turn. Yields its URL and what it
    served."""
    served: list[str] = []

    async def watch(request: web.Request) -> web.StreamResponse:
        n = sum(1 for s in served if s.startswith("watch"))
        if n >= 5:
            served.append("watch 404")
            raise web.HTTPNotFound()
        served.append(f"watch {n}")
        resp = web.StreamResponse()
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for line in _hostile_lines(node, n):
                await resp.write(line)
            await asyncio.Event().wait()  # the controller hangs up
        return resp

    async def snapshot(request: web.Request) -> web.StreamResponse:
        n = sum(1 for s in served if s.startswith("snapshot"))
        served.append(f"snapshot {n}")
        if n % 2:
            return web.Response(
                body=b'{"gpus":[{"identity":{"index":"abc"}}]}', content_type="application/json"
            )
        resp = web.StreamResponse()
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            chunk = b" " * (1 << 20)
            for _ in range((wire.MAX_DOCUMENT_BYTES >> 20) + 4):
                await resp.write(chunk)
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/watch", watch)
    app.router.add_get("/api/v1/snapshot", snapshot)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), served
    finally:
        await server.close()


async def test_a_hostile_exporter_harms_no_other_node_and_is_never_quarantined(scene: Scene) -> None:
    core, namespace = scene.core, scene.namespace
    (hostile,) = await scene.nodes(1)
    pods = await scene.deployment("bystander", 2)  # made before the other nodes exist: all on it
    assert {p.spec.node_name for p in pods} == {hostile}
    good = await scene.nodes(2)
    rules = [{"name": "thermal-unhealthy", "for": 0, "recoverAfter": 2}]
    async with exporters(good) as ex, hostile_exporter(hostile) as (url, served):
        endpoints = {**{n: e.url for n, e in ex.items()}, hostile: url}
        config = scene.config(ex, policy={"rules": rules}, signals={"direct": {"endpoints": endpoints}})
        async with running(config) as ctl:
            await eventually(lambda: fresh_signals(ctl, 2), what="fresh signals from the two good exporters")
            for n in good:
                ex[n].fault(gpu=0, fault="overheat", celsius=98)
            for n in good:
                await eventually(lambda n=n: tainted(core, n), what=f"{n} quarantined")
            for n in good:
                ex[n].fault(gpu=0, fault="clear")

            async def both_recovered() -> bool | None:
                found = [await node_obj(core, n) for n in good]
                return True if all(our_taint(n) is None for n in found) else None

            await eventually(both_recovered, what="both good nodes recovered")
            for n in good:
                await wait_for_event(core, "default", n, "GpuRecovered")

            # The hostile exporter went through all its scripts and was polled, refused each time.
            def refused_everything() -> bool | None:
                kinds = {k for (node, k) in _refusals(ctl) if node == hostile}
                polled = sum(1 for s in served if s.startswith("snapshot"))
                return True if kinds >= {"oversize", "invalid", "flood"} and polled >= 2 else None

            async def refused() -> bool | None:
                return refused_everything()

            await eventually(refused, what="every hostile answer refused", timeout_seconds=90)
            assert {node for (node, _) in _refusals(ctl)} == {hostile}
            assert "internal" not in ctl.controller.source.errors  # type: ignore[attr-defined]
            assert ctl.controller.supervisor.restarting() == []
            assert hostile not in ctl.controller.source.current().nodes
            assert ctl.controller.reconciler.signal_counts()["fresh"] == 2

        # Never quarantined, nothing of it evicted.
        node = await node_obj(core, hostile)
        assert our_taint(node) is None and "gpumon.io/unhealthy-gpus" not in node["metadata"].get(
            "annotations", {}
        )
        # Its signals being unknown is worth telling (GpuSignalsLost, "no action"); nothing else.
        ours = {e.reason for e in await events(core, "default", hostile) if e.reason.startswith("Gpu")}
        assert ours <= {"GpuSignalsLost"}
        still = {p.metadata.uid for p in await running_pods(core, namespace, "bystander")}
        assert still == {p.metadata.uid for p in pods}
        for p in pods:
            assert not await events(core, namespace, p.metadata.name, "GpuPodEvicted")


def _refusals(ctl: object) -> dict[tuple[str, str], float]:
    """gpumon_controller_exporter_refusals_total by (node, kind), as scraped."""
    family = ctl.controller.metrics.exporter_refusals  # type: ignore[attr-defined]
    return {
        (s.labels["node"], s.labels["kind"]): s.value
        for metric in family.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }
