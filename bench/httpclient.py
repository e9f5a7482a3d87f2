"""A minimal HTTP/1.1 client on asyncio streams, for latencies a client library would blur.

An aiohttp or httpx client spends a few hundred microseconds of Python per request, as much as
the exporter spends answering one. This one writes the request bytes and reads the response by
``Content-Length`` (or to the end, when the server closes). It keeps connections alive when
the server allows, as Prometheus does, and counts the time to connect in a request's latency
when it had to open one: a scraper waits for that too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

# What Prometheus 2.x sends on a scrape.
PROMETHEUS_HEADERS: Mapping[str, str] = {
    "Accept": (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    ),
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/2.42.0",
}
PLAIN_TEXT_HEADERS: Mapping[str, str] = {"Accept": "text/plain;version=0.0.4"}


class HttpError(Exception):
    """A response the bench cannot use (bad status line, unsupported framing)."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    keep_alive: bool
    seconds: float  # from before connecting (or reusing a connection) to the last body byte


def parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    """Status, headers (lower-case names) and whether the connection stays open."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    try:
        status = int(rest[:3])
    except ValueError:
        raise HttpError(f"bad status line {lines[0]!r}") from None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return status, headers, keep_alive


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Client:
    """Requests to one server over a pool of keep-alive connections (one per request in flight)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[_Conn] = []

    async def request(
        self, method: str, path: str, headers: Mapping[str, str] = PROMETHEUS_HEADERS, body: bytes = b""
    ) -> Response:
        started = time.perf_counter()
        conn = self._idle.pop() if self._idle else await asyncio.open_connection(self.host, self.port)
        reader, writer = conn
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            status, response_headers, keep_alive = parse_head(await reader.readuntil(b"\r\n\r\n"))
            length = response_headers.get("content-length")
            if "chunked" in response_headers.get("transfer-encoding", ""):
                data = await _chunked(reader)  # Go's net/http streams a large body so
            elif length is not None:
                data = await reader.readexactly(int(length))
            else:
                data, keep_alive = await reader.read(), False
        except BaseException:
            writer.close()
            raise
        seconds = time.perf_counter() - started
        if keep_alive:
            self._idle.append(conn)
        else:
            writer.close()
        return Response(status, data, keep_alive, seconds)

    async def get(self, path: str, headers: Mapping[str, str] = PROMETHEUS_HEADERS) -> Response:
        return await self.request("GET", path, headers)

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body (RFC 9112 7.1), trailers skipped."""
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
