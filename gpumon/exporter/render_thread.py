"""Render snapshots in one thread of their own, so that a scrape never waits for a render.

A render of a stormed node's payload costs tens of milliseconds of Python (bench/RESULTS.md,
"Xid storm"); on the event loop every scrape that arrived meanwhile waited for all of it. Here
the loop only hands over the newest snapshot and serves the last finished bytes. At most one
render runs at a time; snapshots handed over while one runs are coalesced, so only the newest
of them is rendered next and a burst of publishes costs one more render, not one each.

The render thread still takes the GIL in turns with the loop: ``RENDER_SWITCH_INTERVAL`` is the
longest the loop waits for it (Python's default of 5 ms is more than a scrape's whole budget).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.registry import Collector

from gpumon.exporter.exposition import (
    LineCache,
    Profile,
    RenderedMetrics,
    Variant,
    prerender_variants,
    render,
)
from gpumon.gpu.model import Snapshot
from gpumon.runtime.threadnames import name_os_thread

log = logging.getLogger(__name__)

# Seconds; set for the exporter's process while it serves (gpumon/exporter/server.py).
RENDER_SWITCH_INTERVAL = 0.0005


class RenderThread:
    """The latest rendered payload, rendered off the loop. Call :meth:`submit` on the loop."""

    def __init__(
        self,
        *,
        profile: Profile,
        extra: Sequence[Collector],
        on_rendered: Callable[[Snapshot, RenderedMetrics], None],
        on_failed: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._profile: Profile = profile
        self._extra = tuple(extra)
        self._on_rendered = on_rendered
        self._on_failed = on_failed
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="gpumon-render", initializer=name_os_thread)
        self._running: asyncio.Future[tuple[Snapshot, RenderedMetrics]] | None = None
        self._next: Snapshot | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.rendered: RenderedMetrics | None = None
        # Touched only by the thread's renders, one at a time.
        self._lines = LineCache()
        self._clock = clock
        # Variant -> when a scrape last asked for it (clock time); those asked lately are
        # written by the thread before the payload is published.
        self._asked: dict[Variant, float] = {}

    def asked(self, variant: Variant) -> None:
        """A scrape asked for ``variant``; call on the loop."""
        self._asked[variant] = self._clock()

    def submit(self, snapshot: Snapshot) -> None:
        """Render ``snapshot`` when the thread is free, unless a newer one comes first."""
        self._next = snapshot
        if self._running is None:
            self._start()

    async def idle(self) -> RenderedMetrics | None:
        """The payload once every submitted snapshot is rendered (tests, shutdown)."""
        await self._idle.wait()
        return self.rendered

    def close(self) -> None:
        # A render is finite: the thread ends by itself; nothing waits for it.
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _start(self) -> None:
        snapshot, self._next = self._next, None
        if snapshot is None:
            self._idle.set()
            return
        self._idle.clear()
        loop = asyncio.get_running_loop()
        wanted = prerender_variants(self._asked, self._clock())
        self._running = loop.run_in_executor(self._executor, self._render, snapshot, wanted)
        self._running.add_done_callback(self._done)

    def _render(self, snapshot: Snapshot, wanted: frozenset[Variant]) -> tuple[Snapshot, RenderedMetrics]:
        rendered = render(
            snapshot, profile=self._profile, extra=self._extra, prerender=wanted, lines=self._lines
        )
        return snapshot, rendered

    def _done(self, future: asyncio.Future[tuple[Snapshot, RenderedMetrics]]) -> None:
        self._running = None
        if future.cancelled():
            self._idle.set()
            return
        error = future.exception()
        if error is None:
            snapshot, self.rendered = future.result()
            self._on_rendered(snapshot, self.rendered)
        else:
            self._on_failed()
            log.error("rendering the snapshot failed; serving the previous payload", exc_info=error)
        self._start()
