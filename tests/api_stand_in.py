"""A stand-in API server for gpumon's own client (gpumon.kube.client) in unit tests: recorded or
scripted answers over real HTTP, so the client, its timeouts and the list+watch loop run as they
do against the real API server (tests/cluster has that)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpumon.kube.client import KubeClient
from gpumon.kube.credentials import Credentials

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
StandIn = Callable[..., Awaitable[KubeClient]]


@pytest.fixture
async def api_stand_in() -> AsyncIterator[StandIn]:
    """``await api_stand_in(api, path)``: a server answering GET ``path`` (the pods by default)
    with ``api.handle``, and gpumon's client of it (token ``t0ken``)."""
    servers: list[TestServer] = []
    clients: list[KubeClient] = []

    async def start(api: Any, path: str = "/api/v1/pods") -> KubeClient:
        handle: Handler = api.handle
        app = web.Application()
        app.router.add_get(path, handle)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        clients.append(KubeClient(Credentials(str(server.make_url("")).rstrip("/"), None, token="t0ken")))
        return clients[-1]

    yield start
    for c in clients:
        await c.close()
    for s in servers:
        await s.close()


async def until(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)
