"""Serve an aiohttp app until SIGTERM or SIGINT: the shell both long-running commands share.

Portable to Windows (the HostProcess exporter): no loop signal handlers there, and no
SO_REUSEADDR.

Clients are held to the ``server`` section's limits (:class:`gpumon.config.ServerConfig`): a
request's headers must arrive within ``header_timeout_seconds`` of its first byte, a connection
idle between requests is closed after ``idle_timeout_seconds``, and past ``max_connections`` the
oldest connection that is not serving a request is closed. aiohttp has only the idle timeout
(which it also applies before the first request), so the others are :class:`GuardedHandler`'s."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gpumon.config import ServerConfig
from gpumon.config.files import field_error

log = logging.getLogger(__name__)


def metrics_url(addresses: list[Any], *, tls: bool = False) -> str:
    """Where the runner's first socket serves /metrics, as a person on the node would type it."""
    host, port = addresses[0][0], addresses[0][1]
    # Bound to every interface: show the loopback address, which works from the node itself.
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}/metrics"


def bind(address: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address ``address`` resolves to, as asyncio would open them.

    An address that does not resolve or cannot be bound, or a port in use, is the user's
    setting: a :class:`ConfigError` naming ``listen_address`` or ``port`` and the value."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError, ValueError) as e:  # UnicodeError: a label IDNA cannot encode
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise field_error("listen_address", f"cannot resolve {address!r}: {reason}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, sockaddr in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # a family this kernel lacks (IPv6 off): asyncio skips it too
                continue
            sockets.append(sock)
            if sys.platform != "win32":
                # As asyncio does on Unix only: a restart rebinds a port whose old connections
                # are in TIME_WAIT. On Windows the option lets another socket take a port in
                # use, so the "port in use" error below would never come.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(sockaddr)
            sock.listen(128)
            sock.setblocking(False)
    except OSError as e:
        for sock in sockets:
            sock.close()
        # In use, or below 1024 without the privilege: the port's fault; anything else (an
        # address not on this host, a family the kernel lacks) is the address's.
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            raise field_error("port", f"cannot listen on port {port} of {address}: {e.strerror}") from None
        raise field_error(
            "listen_address", f"cannot listen on {address} (port {port}): {e.strerror}"
        ) from None
    if not sockets:
        raise field_error("listen_address", f"cannot listen on {address}: no usable address family")
    return sockets


# SIGBREAK: Ctrl+Break, the signal Windows can send to a console process group (a HostProcess
# container's exporter) besides Ctrl+C; Unix has no such signal.
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGBREAK") if hasattr(signal, name)
)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[asyncio.Event]:
    """An event SIGTERM or SIGINT (SIGBREAK on Windows) sets, on the running loop, while the
    block runs; the signals' previous handlers are back afterwards.

    Long-running commands stop by checking it rather than by the cancellation asyncio.run sends
    on SIGINT: a cancellation that a library turns into a timeout (and that code then handles
    as one) is lost, and the command would run on for ever."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def from_handler(_signum: int, _frame: object) -> None:
        loop.call_soon_threadsafe(stop.set)

    on_loop: list[signal.Signals] = []
    replaced: dict[signal.Signals, Any] = {}
    try:
        for sig in STOP_SIGNALS:
            try:
                loop.add_signal_handler(sig, stop.set)
                on_loop.append(sig)
            except NotImplementedError:
                # Windows' event loops have no signal handlers. Python's own handler runs in
                # the main thread (the loop's) between bytecodes, and the proactor loop wakes
                # for it through signal.set_wakeup_fd, so the event is set promptly.
                replaced[sig] = signal.signal(sig, from_handler)
        yield stop
    finally:
        for sig in on_loop:
            loop.remove_signal_handler(sig)
        for sig, previous in replaced.items():
            signal.signal(sig, previous)


class GuardedHandler(RequestHandler):
    """aiohttp's connection handler with the two limits it lacks: a header-read timeout, and a
    connection cap that makes room by closing the oldest connection not serving a request.

    Closing the oldest idle one rather than refusing the newest is what lets a scrape through a
    flood of half-open connections: the flood only ever displaces itself, and a scraper, which
    sends its request as soon as it connects, is serving by the time the next one arrives."""

    def __init__(self, manager: web.Server, *, limits: ServerConfig, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        manager = self._manager
        assert manager is not None
        connections = manager.connections
        if len(connections) > self._limits.max_connections:
            idle = (h for h in connections if not h._request_in_progress)
            next(idle, self).force_close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._messages or self._request_in_progress:  # a whole request head has arrived
            self._stop_header_timer()
        elif self._header_timer is None and not self._force_close:
            self._header_timer = self._loop.call_later(
                self._limits.header_timeout_seconds, self._header_timed_out
            )

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not (self._messages or self._request_in_progress):
            self.force_close()

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None


class GuardedSite(web.SockSite):
    """A :class:`web.SockSite` whose connections are :class:`GuardedHandler`'s."""

    def __init__(
        self, runner: web.AppRunner, sock: socket.socket, *, limits: ServerConfig, **kwargs: Any
    ) -> None:
        super().__init__(runner, sock, **kwargs)
        self._limits = limits

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()

        def handler() -> GuardedHandler:
            return GuardedHandler(server, loop=loop, limits=self._limits, **server._kwargs)

        self._server = await loop.create_server(
            handler,
            sock=self._sock,
            ssl=self._ssl_context,
            backlog=self._backlog,
            # A TLS client that stalls its handshake is a slow client too.
            ssl_handshake_timeout=self._limits.header_timeout_seconds if self._ssl_context else None,
        )


def app_runner(app: web.Application, limits: ServerConfig) -> web.AppRunner:
    """The runner both commands serve with: no access log, ``limits``' idle timeout."""
    return web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=5,
        keepalive_timeout=limits.idle_timeout_seconds,
    )


async def serve_until_signalled(
    build_app: Callable[[], web.Application],
    address: str,
    port: int,
    *,
    limits: ServerConfig,
    ssl_context: ssl.SSLContext | None = None,
    on_listening: Callable[[str], None],
) -> int:
    """Run the app ``build_app`` makes on ``address:port`` until SIGTERM or SIGINT, then 0.

    The sockets are bound before the app is built, so a bad address or a port in use is
    reported (:func:`bind`) before a session is opened or a sampler, an informer or a leader
    election has begun. ``on_listening`` gets the /metrics URL once the socket is open (port 0
    picks a free one)."""
    sockets = bind(address, port)
    try:
        runner = app_runner(build_app(), limits)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    # Handlers from before the app starts until it is cleaned up: a signal during start-up
    # stops it as soon as it serves, and one during the cleanup is absorbed.
    with stop_on_signals() as stop:
        try:
            await runner.setup()
            for sock in sockets:
                await GuardedSite(runner, sock, limits=limits, ssl_context=ssl_context).start()
            on_listening(metrics_url(runner.addresses, tls=ssl_context is not None))
            await stop.wait()
            log.info("stopping")
            return 0
        finally:
            await runner.cleanup()
            for sock in sockets:  # those no site took over (closing twice is harmless)
                sock.close()
