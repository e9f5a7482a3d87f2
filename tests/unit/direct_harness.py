"""The controller's direct signal source running against exporters on real ports, for tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping

import aiohttp
from aiohttp.test_utils import TestServer

from gpumon.controller.core.backoff import Backoff
from gpumon.controller.shell.signal_sources.direct import (
    RECONNECT_BACKOFF,
    DirectSettings,
    DirectSource,
)
from gpumon.controller.shell.signal_sources.endpoints import StaticEndpoints


def base_url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


@contextlib.asynccontextmanager
async def running_source(
    urls: Mapping[str, str],
    settings: DirectSettings,
    *,
    on_change: Callable[[Iterable[str]], None] = lambda nodes: None,
    backoff: Backoff = RECONNECT_BACKOFF,
    on_error: Callable[[str], None] = lambda kind: None,
    on_refusal: Callable[[str, str], None] = lambda node, kind: None,
) -> AsyncIterator[DirectSource]:
    """A DirectSource subscribed to ``urls`` (node -> exporter base URL), stopped on exit."""
    async with aiohttp.ClientSession() as session:
        source = DirectSource(
            settings,
            StaticEndpoints(urls),
            session,
            backoff=backoff,
            on_error=on_error,
            on_refusal=on_refusal,
        )
        task = asyncio.create_task(source.run(on_change))
        try:
            yield source
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def wait_for(predicate: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    try:
        async with asyncio.timeout(seconds):
            while not predicate():  # noqa: ASYNC110 - real servers and streams, with a deadline
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"never saw {what}") from None
