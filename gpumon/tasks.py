"""Stopping background tasks without swallowing a cancellation aimed at the caller."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


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
