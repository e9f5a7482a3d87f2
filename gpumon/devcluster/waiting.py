"""Waiting for a real cluster to reach a state: poll a check until it holds or a deadline
passes. Deadlines are generous (other builds share the machine); polling is quick, so a test
costs what the cluster needs and no more."""

from __future__ import annotations

import asyncio
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
    seen: Callable[[], object] | None = None,
) -> T:
    """Returns the first value of ``check()`` that is not None. The deadline bounds the checks
    too: one still running then (a request nobody answers) is abandoned. ``seen`` says what the
    checks last saw, for the message (the last value is None by definition)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while True:
        try:
            async with asyncio.timeout_at(deadline) as budget:
                last = await check()
        except TimeoutError:
            if not budget.expired():
                raise  # the check's own timeout: its business
            raise NotReached(f"{what}: not reached in {timeout_seconds:.0f}s{_seen(seen, True)}") from None
        if last is not None:
            return last
        if loop.time() > deadline:
            raise NotReached(f"{what}: not reached in {timeout_seconds:.0f}s{_seen(seen, False)}")
        await asyncio.sleep(interval_seconds)


def _seen(seen: Callable[[], object] | None, hung: bool) -> str:
    parts = ["a check was still running at the deadline"] if hung else []
    if seen is not None:
        parts.append(f"last seen: {seen()!r}")
    return f" ({'; '.join(parts)})" if parts else ""
