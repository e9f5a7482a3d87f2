"""Lease renewal on a thread, event loop and API connection of its own (client-go renews from its
own goroutine).

The main loop lists and watches the cluster, reads every exporter's stream and plans; saturated
(an initial list of 100,000 pods, 10,000 streams) it may not run a coroutine for longer than the
renew deadline. Were the elector one of its tasks, that alone would cost the lease, and a standby
would take over from a replica that was only busy. Here the elector's loop runs in a daemon thread
with its own client (an aiohttp session belongs to the loop that made it), so it renews whatever
the main loop does. Writes stay fenced on the main loop by :meth:`LeaseThread.is_leader` at the
moment of writing: the thread renewing does not make a write safe, a renewal younger than the
renew deadline does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, suppress

from gpumon.controller.shell.leader import LeaderElector
from gpumon.kube.client import KubeApi

log = logging.getLogger(__name__)

# The elector for the thread's client, told leadership changes through the given callback.
ElectorFactory = Callable[[KubeApi, Callable[[bool], None]], LeaderElector]
# The thread's own client, opened and closed on the thread's loop.
ClientFactory = Callable[[], AbstractAsyncContextManager[KubeApi]]


class LeaseThread:
    """Runs a :class:`LeaderElector` in a daemon thread; its other methods are the main loop's.

    :meth:`run` is the thread's lifetime as a task of the main loop (supervised: it raises when
    the thread dies, and the next run starts another); cancelled, it stops the thread without
    handing the lease over, as a crash would. :meth:`release` is the clean stop: the thread hands
    the lease over and ends. ``leader_changed`` is set on the main loop at each change.
    """

    def __init__(
        self,
        elector: ElectorFactory,
        client: ClientFactory,
        *,
        on_change: Callable[[bool], None] | None = None,
        stop_seconds: float = 10.0,
    ) -> None:
        self._make = elector
        self._client = client
        self._on_change = on_change  # called on the lease thread
        self._stop_seconds = stop_seconds
        self.leader_changed = asyncio.Event()
        self._elector: LeaderElector | None = None
        self._lock = threading.Lock()  # the stop request against the thread's start
        self._stopping = False
        self._hand_over = False
        self._task: asyncio.Task[None] | None = None  # the thread's main task, on its loop
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ended = asyncio.Event()

    def is_leader(self) -> bool:
        """Whether to write now; called on the main loop before each write. No lock: the thread
        replaces the elector reference and the deadline (a float) whole, and each read of them
        is one step under the GIL, so the answer is at worst one renewal old and never holds
        past the renew deadline of the last renewal."""
        elector = self._elector
        return elector is not None and not self._stopping and elector.is_leader()

    async def run(self) -> None:
        main_loop = asyncio.get_running_loop()
        with self._lock:
            self._stopping = self._hand_over = False
            self._task = self._thread_loop = None
        self._ended = ended = asyncio.Event()
        thread = threading.Thread(
            target=self._main, args=(main_loop, ended), name="gpumon-lease", daemon=True
        )
        self._thread = thread
        thread.start()
        try:
            await ended.wait()
        except asyncio.CancelledError:
            await self._stop(thread, ended, hand_over=False)
            raise
        if self._stopping:  # released: nothing to do until the app cancels this task
            await asyncio.Event().wait()
        raise RuntimeError("the lease renewal thread stopped (its log says why)")

    async def release(self) -> None:
        """Stop acting at once, hand the lease over on the thread's loop so a standby takes over
        without waiting a lease duration, and end the thread, within ``stop_seconds``. Nothing
        when no thread runs: a replica stopped dead leaves its lease to expire."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            await self._stop(thread, self._ended, hand_over=True)

    async def _stop(self, thread: threading.Thread, ended: asyncio.Event, *, hand_over: bool) -> None:
        with self._lock:
            self._stopping = True
            self._hand_over = hand_over
            task, loop = self._task, self._thread_loop
        if task is not None and loop is not None:
            with suppress(RuntimeError):  # its loop has closed: the thread is ending anyway
                loop.call_soon_threadsafe(task.cancel)
        try:
            async with asyncio.timeout(self._stop_seconds):
                await ended.wait()
        except TimeoutError:
            log.warning(
                "the lease thread did not stop in time; it ends with the process",
                extra={"seconds": self._stop_seconds},
            )
            return
        thread.join(timeout=1.0)  # it set `ended` as its last step: this returns at once

    def _main(self, main_loop: asyncio.AbstractEventLoop, ended: asyncio.Event) -> None:
        try:
            asyncio.run(self._serve(main_loop))
        except asyncio.CancelledError:
            pass  # stopped on purpose
        except BaseException:
            log.exception("the lease renewal thread died")
        finally:
            self._elector = None  # is_leader() is False from here on
            with suppress(RuntimeError):  # the main loop has closed: nobody waits any more
                main_loop.call_soon_threadsafe(ended.set)

    async def _serve(self, main_loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self._stopping:
                return
            self._task = asyncio.current_task()
            self._thread_loop = asyncio.get_running_loop()

        def changed(leading: bool) -> None:
            if self._on_change is not None:
                self._on_change(leading)
            with suppress(RuntimeError):
                main_loop.call_soon_threadsafe(self.leader_changed.set)

        async with self._client() as api:
            elector = self._make(api, changed)
            self._elector = elector
            try:
                await elector.run()
            finally:
                if self._hand_over:
                    await elector.release()
