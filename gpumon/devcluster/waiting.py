"""Waiting for a real cluster to reach a state: poll a check until it holds or a deadline
passes. Deadlines are generous (other builds share the machine); polling is quick, so a test
costs what the cluster needs and no more."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class NotReached(AssertionError):
    """The state was not reached in time; the message carries the last thing seen."""


async def eventually(
    check: Callable[[], Awaitable[T | None]],
    *,
    what: str,
    timeout_seconds: float = 60.0,
    interval_seconds: float = 0.2,
) -> T:
    """Returns the first value of ``check()`` that is not None."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        last = await check()
        if last is not None:
            return last
        if time.monotonic() > deadline:
            raise NotReached(f"{what}: not reached in {timeout_seconds:.0f}s (last: {last!r})")
        await asyncio.sleep(interval_seconds)
