"""For tests that force a cancellation to race a wake-up (Python 3.11's asyncio.wait_for lost
such cancellations, CPython gh-86296)."""

from __future__ import annotations

import asyncio
from typing import Any


async def assert_ends_cancelled(task: asyncio.Task[Any], lost: str) -> None:
    """``task`` was just cancelled: it must end cancelled, not run on (``lost`` says what then)."""
    try:
        done, _ = await asyncio.wait([task], timeout=10)
        assert done and task.cancelled(), lost
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
