"""A network namespace of the test's own, joined to the root namespace by one veth pair on a
private /30, and a TCP relay from the root side of that pair to loopback services.

Why: the API server refuses loopback addresses in Endpoints, so an aggregated API server
(prometheus-adapter) registered through a Service must listen on some other address. The
adapter runs inside the namespace (``ip netns exec``) on its end of the pair; the API server
reaches it over the veth. The adapter in turn needs the API server and Prometheus, which listen
on 127.0.0.1 only: :class:`TcpRelay` listens on the root end of the pair and forwards to them,
so neither the shared control plane nor Prometheus has to listen beyond loopback.

The namespace has no default route: its only peer is the root end of the /30, so nothing it
sends can leave the machine. Needs root (``ip netns``, ``ip link``)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import subprocess
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gpumon.devcluster.state import alive

PREFIX = "gpumon-e2e-"
# /30s are taken from here; the first one not already on an interface is used.
RANGE = ipaddress.ip_network("10.213.0.0/24")


class NetnsError(RuntimeError):
    """The namespace or its link could not be made; the message carries the `ip` output."""


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def remove_orphans() -> list[str]:
    """Delete namespaces (and their veth pairs) left by test processes that died without
    cleaning up: ours are named after the pid that made them."""
    removed = []
    for line in _ip("netns", "list").splitlines():
        m = re.match(rf"^({re.escape(PREFIX)}(\d+))\b", line)
        if m and not alive(int(m.group(2))):
            _ip("link", "del", _host_link(int(m.group(2))), check=False)
            _ip("netns", "del", m.group(1), check=False)
            removed.append(m.group(1))
    return removed


def _host_link(pid: int) -> str:
    return f"gme{pid}h"[:15]  # interface names hold at most 15 bytes


def _free_subnet() -> ipaddress.IPv4Network:
    used = {
        ipaddress.ip_interface(m.group(1)).network
        for m in re.finditer(r"inet (\S+)", _ip("-4", "-o", "addr", "show"))
    }
    for subnet in RANGE.subnets(new_prefix=30):
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise NetnsError(f"no free /30 left in {RANGE}")


@dataclass(frozen=True)
class Netns:
    name: str
    host_link: str
    host_address: str  # the root namespace's end of the pair
    address: str  # the namespace's end

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]


@contextlib.contextmanager
def network_namespace() -> Iterator[Netns]:
    """A fresh namespace with a veth pair to the root namespace; both gone on exit, whatever
    happened in between."""
    remove_orphans()
    pid = os.getpid()
    name, host_link, peer = f"{PREFIX}{pid}", _host_link(pid), f"gme{pid}n"[:15]
    subnet = _free_subnet()
    host, inside = (str(a) for a in list(subnet.hosts())[:2])
    try:
        _ip("netns", "add", name)
        _ip("link", "add", host_link, "type", "veth", "peer", "name", peer, "netns", name)
        _ip("addr", "add", f"{host}/30", "dev", host_link)
        _ip("link", "set", host_link, "up")
        _ip("-n", name, "addr", "add", f"{inside}/30", "dev", peer)
        _ip("-n", name, "link", "set", peer, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield Netns(name, host_link, host, inside)
    finally:
        _ip("link", "del", host_link, check=False)  # takes the peer with it
        _ip("netns", "del", name, check=False)


class TcpRelay:
    """Accepts on ``listen`` and pipes each connection to ``target``, byte for byte (TLS passes
    through untouched), on a thread of its own so that tests blocking their event loop (a
    synchronous wait on Prometheus, kubectl) never stall the relayed traffic."""

    def __init__(self, listen_host: str, target: tuple[str, int]) -> None:
        self._listen_host = listen_host
        self._target = target
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, name=f"relay-{target[1]}", daemon=True)

    def __enter__(self) -> TcpRelay:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None or not self.port:
            raise NetnsError(f"relay to {self._target} did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # reported by __enter__ when it happens while starting
            self._error = e
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        connections: set[asyncio.Task[None]] = set()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            connections.add(task)
            try:
                await self._pipe_both(reader, writer)
            finally:
                connections.discard(task)

        server = await asyncio.start_server(accept, self._listen_host, 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for task in list(connections):
                task.cancel()
            await asyncio.gather(*connections, return_exceptions=True)

    async def _pipe_both(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()
