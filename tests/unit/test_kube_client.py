"""gpumon's one API client against a stand-in server over real HTTP: errors typed by status,
transport failures as Unreachable, the patch types, and watch lines of any length (tests/cluster
runs it against the real API server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpumon.kube.client import (
    Conflict,
    Gone,
    KubeClient,
    KubeError,
    NotFound,
    TooManyRequests,
    Unreachable,
    error_kind,
)
from gpumon.kube.credentials import Credentials

BIG = "x" * (300 * 1024)  # one object larger than any read buffer


class Seen:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str, str, Any]] = []


SEEN = web.AppKey("seen", Seen)


async def _answer(request: web.Request) -> web.StreamResponse:
    seen = request.app[SEEN]
    body = await request.json() if request.can_read_body else None
    seen.requests.append(
        (
            request.method,
            request.path,
            request.headers.get("Content-Type", ""),
            request.headers["Authorization"],
            body,
        )
    )
    code = int(request.query.get("status", "200"))
    if request.query.get("watch"):
        resp = web.StreamResponse()
        await resp.prepare(request)
        for obj in ({"name": "a"}, {"name": BIG}):
            data = json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n"
            for i in range(0, len(data), 5000):  # chunked, as the API server streams
                await resp.write(data[i : i + 5000])
        return resp
    if request.query.get("slow"):
        await asyncio.sleep(5)
    if code >= 400:
        return web.json_response({"kind": "Status", "reason": "Why", "message": f"said {code}"}, status=code)
    if request.query.get("list"):
        return web.json_response([1, 2])
    return web.json_response({"ok": True, "method": request.method})


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[KubeClient, Seen, Path]]:
    app = web.Application()
    app[SEEN] = seen = Seen()
    app.router.add_route("*", "/{tail:.*}", _answer)
    server = TestServer(app)
    await server.start_server()
    token = tmp_path / "token"
    token.write_text("one\n")
    creds = Credentials(str(server.make_url("")).rstrip("/"), None, token_file=token)
    async with KubeClient(creds, request_timeout=0.5) as client:
        yield client, seen, token
    await server.close()


@pytest.mark.parametrize(
    ("status", "cls", "kind"),
    [
        (404, NotFound, "not_found"),
        (409, Conflict, "conflict"),
        (410, Gone, "expired"),
        (429, TooManyRequests, "too_many"),
        (403, KubeError, "forbidden"),
        (500, KubeError, "http_500"),
    ],
)
async def test_errors_are_typed_by_status(
    api: tuple[KubeClient, Seen, Path], status: int, cls: type[KubeError], kind: str
) -> None:
    client, _, _ = api
    with pytest.raises(cls) as raised:
        await client.get("/api/v1/nodes/n", {"status": str(status)})
    assert type(raised.value) is cls
    assert (raised.value.status, raised.value.reason, raised.value.message) == (
        status,
        "Why",
        f"said {status}",
    )
    assert str(raised.value) == f"{status} Why: said {status}"
    if kind not in ("conflict", "too_many"):
        assert error_kind(raised.value) == kind


async def test_writes_send_json_with_their_content_types_and_the_token_read_each_time(
    api: tuple[KubeClient, Seen, Path],
) -> None:
    client, seen, token = api
    assert await client.post("/p", {"a": 1}) == {"ok": True, "method": "POST"}
    await client.put("/p", {"a": 2})
    token.write_text("two\n")  # rotated in place
    await client.patch("/p", {"a": 3})
    await client.patch("/p", {"a": 4}, strategic=True)
    await client.delete("/p")
    assert seen.requests == [
        ("POST", "/p", "application/json", "Bearer one", {"a": 1}),
        ("PUT", "/p", "application/json", "Bearer one", {"a": 2}),
        ("PATCH", "/p", "application/merge-patch+json", "Bearer two", {"a": 3}),
        ("PATCH", "/p", "application/strategic-merge-patch+json", "Bearer two", {"a": 4}),
        ("DELETE", "/p", "", "Bearer two", None),
    ]


async def test_an_answer_that_is_no_object_is_malformed(api: tuple[KubeClient, Seen, Path]) -> None:
    client, _, _ = api
    with pytest.raises(ValueError, match="no JSON object") as raised:
        await client.get("/x", {"list": "1"})
    assert error_kind(raised.value) == "malformed_response"


async def test_watch_lines_of_any_length_newlines_kept(api: tuple[KubeClient, Seen, Path]) -> None:
    client, _, _ = api
    opened: list[bool] = []
    raw = [line async for line in client.lines("/w", {"watch": "1"}, opened=lambda: opened.append(True))]
    assert [json.loads(line)["object"]["name"] for line in raw] == ["a", BIG]
    # The stream joins back as it came (gpumon status reads /metrics through the proxy so).
    assert all(line.endswith(b"\n") for line in raw) and opened == [True]


async def test_refused_and_slow_servers_are_unreachable(api: tuple[KubeClient, Seen, Path]) -> None:
    client, _, _ = api
    with pytest.raises(Unreachable) as slow:
        await client.get("/x", {"slow": "1"})
    assert slow.value.timed_out and error_kind(slow.value) == "timeout"
    async with KubeClient(Credentials("http://127.0.0.1:9", None)) as refused:
        with pytest.raises(Unreachable) as down:
            await refused.get("/x")
        with pytest.raises(Unreachable):
            async for _ in refused.lines("/x", {"watch": "1"}):
                pass
    assert not down.value.timed_out and error_kind(down.value) == "unreachable"
