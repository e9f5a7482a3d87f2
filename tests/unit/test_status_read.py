"""``gpumon status node NAME`` reading the node's exporter snapshot: through the API server's
proxy (a recording fake API) or from a configured endpoint (a real HTTP server), parsed with
the wire schema, and refused with a reason, not a traceback, when the schema refuses it."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web
from controller_fakes import FakeKube
from status_builders import RESOURCES, node, snapshot_doc

from gpumon.status.read import Sources, read_cluster
from gpumon.status.state import ClusterState
from gpumon.wire import v1 as wire

NAME = "gpu-a-1"
NS = "gpumon-system"
PROXY = f"/api/v1/namespaces/{NS}/pods/exporter-x:9842/proxy/api/v1/snapshot"


def kube(snapshot: dict[str, Any]) -> FakeKube:
    api = FakeKube()
    api.add(f"/api/v1/nodes/{NAME}", node(NAME))
    running = {"metadata": {"name": "exporter-x"}, "status": {"phase": "Running"}}
    api.add(f"/api/v1/namespaces/{NS}/pods", {"items": [running]})
    api.add(PROXY, snapshot)
    return api


async def read(api: FakeKube, **sources: Any) -> ClusterState:
    src = Sources(namespace=NS, state_configmap="gpumon-state", resources=RESOURCES, **sources)
    async with aiohttp.ClientSession() as session:
        return await read_cluster(api, src, node=NAME, session=session)


def document() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(wire.encode(snapshot_doc(NAME)))
    return doc


async def test_through_the_proxy_the_snapshot_is_the_exporters_document() -> None:
    got = await read(kube(document()))
    assert (got.snapshot, got.snapshot_source, got.snapshot_error) == (snapshot_doc(NAME), PROXY, None)


async def test_a_snapshot_the_schema_refuses_is_a_reason_not_a_traceback() -> None:
    doc = document()
    doc["gpus"][0]["fast"]["temperature_gpu_celsius"] = "41"  # a number as text
    got = await read(kube(doc))
    assert got.snapshot is None and got.snapshot_source == PROXY
    assert got.snapshot_error is not None
    assert got.snapshot_error.startswith("the exporter sent a snapshot that wire schema 1 refuses (invalid: ")
    assert "gpus.0.fast.temperature_gpu_celsius" in got.snapshot_error
    other = await read(kube({**document(), "schema": 2}))
    assert other.snapshot_error is not None and "(schema: " in other.snapshot_error


async def test_from_a_configured_endpoint(aiohttp_server: Any) -> None:
    bodies = [wire.encode(snapshot_doc(NAME)), b'{"schema": 1, "gpus": "none"}']

    async def snapshot(_: web.Request) -> web.Response:
        return web.Response(body=bodies.pop(0), content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/snapshot", snapshot)
    server = await aiohttp_server(app)
    endpoints = {NAME: str(server.make_url("/"))}
    good = await read(kube(document()), exporter_endpoints=endpoints)
    assert good.snapshot == snapshot_doc(NAME) and good.snapshot_error is None
    bad = await read(kube(document()), exporter_endpoints=endpoints)
    assert bad.snapshot is None and bad.snapshot_source == str(server.make_url("/api/v1/snapshot"))
    assert bad.snapshot_error is not None and "wire schema 1 refuses (invalid: " in bad.snapshot_error
