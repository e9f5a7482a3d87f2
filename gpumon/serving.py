"""Serve an aiohttp app until SIGTERM or SIGINT: the shell both long-running commands share."""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)


def metrics_url(addresses: list[Any], *, tls: bool = False) -> str:
    """Where the runner's first socket serves /metrics, as a person on the node would type it."""
    host, port = addresses[0][0], addresses[0][1]
    # Bound to every interface: show the loopback address, which works from the node itself.
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}/metrics"


async def serve_until_signalled(
    app: web.Application,
    address: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    on_listening: Callable[[str], None],
) -> int:
    """Run ``app`` on ``address:port``; 0 after a clean stop, 1 when the port cannot be bound.

    ``on_listening`` gets the /metrics URL once the socket is open (port 0 picks a free one)."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, address, port, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as e:
            log.error("cannot listen on %s:%s: %s", address, port, e.strerror or e)
            return 1
        on_listening(metrics_url(runner.addresses, tls=ssl_context is not None))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping")
        return 0
    finally:
        await runner.cleanup()
