"""Background tasks of both programs: supervised while they run, stopped without swallowing a
cancellation aimed at the caller."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has finished.

    Their own ``CancelledError`` is expected and dropped; if the task running this is itself
    being cancelled meanwhile, that cancellation is raised again rather than lost (a plain
    ``suppress(CancelledError)`` around the await would eat it and hang the caller's shutdown).
    """
    pending = list(tasks)
    for task in pending:
        task.cancel()
    for task in pending:
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise


@dataclass(frozen=True, slots=True)
class TaskTrouble:
    """A supervised task that has died: how often in a row, when last, and why."""

    name: str
    deaths: int
    last_death_at: float
    error: str


class Supervisor:
    """Runs long-lived tasks and restarts each one that dies, with backoff (docs/decisions.md, "Habits").

    A task that raises, or returns (a long-lived task returning has stopped doing its job), is
    logged with its traceback, reported through ``on_restart`` (a metric) and started again after
    ``delay(deaths in a row)``. A run that lasted ``stable_seconds`` resets the count. What it
    knows feeds the probes: :meth:`restarting` (died within ``stable_seconds``: not ready) and
    :meth:`crashlooping` (``crashloop_after`` deaths in a row, the last recent: not live, so the
    kubelet restarts the process). Cancellation is never caught: :meth:`stop` ends them all.
    """

    def __init__(
        self,
        *,
        delay: Callable[[int], float],
        on_restart: Callable[[str], None] = lambda name: None,
        stable_seconds: float = 60.0,
        crashloop_after: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._delay = delay
        self._on_restart = on_restart
        self._stable = stable_seconds
        self._crashloop_after = crashloop_after
        self._clock = clock
        self.tasks: list[asyncio.Task[None]] = []
        self._trouble: dict[str, TaskTrouble] = {}

    def start(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None]:
        """Supervise ``run()`` (called again for each restart) as task ``name``."""
        task = asyncio.create_task(self._supervise(name, run), name=name)
        self.tasks.append(task)
        return task

    async def _supervise(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        while True:
            started = self._clock()
            try:
                await run()
                error = "returned"
                log.error("background task returned; restarting it", extra={"task": name})
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                log.exception("background task died; restarting it", extra={"task": name})
            now = self._clock()
            before = self._trouble.get(name)
            deaths = 1 if before is None or now - started >= self._stable else before.deaths + 1
            self._trouble[name] = TaskTrouble(name, deaths, now, error)
            self._on_restart(name)
            await asyncio.sleep(self._delay(deaths))

    def restarting(self) -> list[TaskTrouble]:
        """Tasks that died within the last ``stable_seconds``."""
        now = self._clock()
        return [t for t in self._trouble.values() if now - t.last_death_at < self._stable]

    def crashlooping(self) -> list[TaskTrouble]:
        """Tasks that keep dying: ``crashloop_after`` deaths in a row, the last one recent."""
        return [t for t in self.restarting() if t.deaths >= self._crashloop_after]

    async def stop(self) -> None:
        """Cancel every supervised task (last started first) and wait for each."""
        await cancel_and_wait(reversed(self.tasks))
        self.tasks.clear()
