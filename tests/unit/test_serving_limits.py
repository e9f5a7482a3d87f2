"""Slow and greedy clients against the server both commands run (gpumon.runtime.serving), over raw
sockets: issue #18 found 50 half-sent requests held open for 15 s and more, with no header
timeout and no connection cap."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from gpumon.config import ConfigError, ExporterConfig, ServerConfig, load
from gpumon.runtime.serving import GuardedSite, app_runner, bind

HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: "


@dataclass
class Served:
    port: int
    runner: web.AppRunner


async def _metrics(_request: web.Request) -> web.Response:
    return web.Response(text="up 1\n")


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    limits: ServerConfig = request.param
    app = web.Application()
    app.router.add_get("/metrics", _metrics)
    runner = app_runner(app, limits)
    await runner.setup()
    sock = bind("127.0.0.1", 0)[0]
    await GuardedSite(runner, sock, limits=limits).start()
    try:
        yield Served(sock.getsockname()[1], runner)
    finally:
        await runner.cleanup()
        sock.close()


async def _half_sent(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HALF_SENT)
    await writer.drain()
    return reader, writer


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    async with asyncio.timeout(10):
        return await reader.read() == b""


async def _scrape(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    async with asyncio.timeout(10):
        answer = await reader.read()
    writer.close()
    return answer


FAST_HEADERS = ServerConfig(header_timeout_seconds=0.2, idle_timeout_seconds=60, max_connections=64)


@pytest.mark.parametrize("served", [FAST_HEADERS], indirect=True)
async def test_half_sent_headers_are_closed_after_the_header_timeout(served: Served) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await _half_sent(served.port)
    assert await _closed_by_server(reader)
    took = loop.time() - started
    assert 0.2 <= took < 60, f"closed after {took:.2f} s: by the header timeout, not the idle one"
    writer.close()


@pytest.mark.parametrize("served", [FAST_HEADERS], indirect=True)
async def test_a_kept_alive_connection_is_not_cut_by_the_header_timeout(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    for _ in range(3):
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            await reader.readuntil(b"up 1\n")
        # Idle between requests for longer than the header timeout: only the idle timeout applies.
        await asyncio.sleep(0.3)
    writer.close()


@pytest.mark.parametrize(
    "served",
    [ServerConfig(header_timeout_seconds=60, idle_timeout_seconds=0.2, max_connections=64)],
    indirect=True,
)
async def test_an_idle_connection_is_closed_after_the_idle_timeout(served: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    assert await _closed_by_server(reader)
    writer.close()


@pytest.mark.parametrize(
    "served",
    [ServerConfig(header_timeout_seconds=60, idle_timeout_seconds=60, max_connections=4)],
    indirect=True,
)
async def test_past_the_cap_the_oldest_idle_connection_goes_and_a_scrape_gets_through(served: Served) -> None:
    flood = [await _half_sent(served.port) for _ in range(10)]
    # Each one past the cap displaced the oldest: the first six are closed, the last four open.
    for reader, _ in flood[:6]:
        assert await _closed_by_server(reader)
    assert len(served.runner.server.connections) <= 4  # type: ignore[union-attr]
    assert (await _scrape(served.port)).startswith(b"HTTP/1.1 200")
    for _, writer in flood:
        writer.close()


def test_the_limits_are_configurable(tmp_path) -> None:
    path = tmp_path / "exporter.yaml"
    path.write_text("server: {header_timeout_seconds: 3, idle_timeout_seconds: 30, max_connections: 16}\n")
    config = load(ExporterConfig, config_file=path)
    assert config.server == ServerConfig(
        header_timeout_seconds=3, idle_timeout_seconds=30, max_connections=16
    )
    assert ExporterConfig().server == ServerConfig()
    path.write_text("server: {max_connections: 0}\n")
    with pytest.raises(ConfigError, match=r"server\.max_connections"):
        load(ExporterConfig, config_file=path)
