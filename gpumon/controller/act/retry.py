"""What a failed write means, and when to try again: the controller's one retry policy.

Every actuator and both write loops ask here instead of deciding for themselves:

- **409 Conflict**: the object changed since the cache saw it. Re-read it, plan again against
  what is there now, and write that (:func:`write_replanned`), a few times at most; the next
  round plans again after that.
- **404 Not Found**: the object is gone; there is nothing left to write.
- **429 Too Many Requests**: a PodDisruptionBudget (or the API server's rate limit) says not
  now: try again after a capped, jittered backoff that grows per object.
- **Anything else** (5xx, transport): try again after the same backoff.

Reading and watching (informers, signal sources) reconnect on their own backoffs: they retry a
stream, not a write.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from gpumon.controller.core.backoff import Backoff
from gpumon.kube.client import Conflict, KubeError

log = logging.getLogger(__name__)

T = TypeVar("T")
W = TypeVar("W")


class Outcome(enum.StrEnum):
    REPLAN = "replan"  # 409: plan again against the object as it is now
    GONE = "gone"  # 404: nothing left to write
    BLOCKED = "blocked"  # 429: refused for now (PDB, rate limit)
    LATER = "later"  # any other failure


_BY_STATUS = {409: Outcome.REPLAN, 404: Outcome.GONE, 429: Outcome.BLOCKED}


def outcome(error: KubeError) -> Outcome:
    return _BY_STATUS.get(error.status, Outcome.LATER)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    # Per object: the n-th failed write in a row waits backoff.delay(n) before the next.
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_seconds=1.0, max_seconds=60.0))
    # Re-plans on 409 within one write before it is left to the next round.
    conflict_attempts: int = 3
    # A whole round that failed (not one write in it) is tried again after this.
    round_retry_seconds: float = 2.0

    def delay(self, failures: int, salt: int = 0) -> float:
        return self.backoff.delay(failures, salt)


DEFAULT_RETRY = RetryPolicy()


async def write_replanned(
    write: W,
    apply: Callable[[W], Awaitable[T]],
    reread_and_replan: Callable[[], Awaitable[W | None]],
    *,
    policy: RetryPolicy = DEFAULT_RETRY,
    what: str = "",
) -> T | None:
    """``apply(write)``; on 409 re-read, re-plan and apply again, at most
    ``policy.conflict_attempts`` times in all. Returns what the last apply returned, or None
    when the re-plan found nothing left to write. Any other error propagates to the caller,
    which asks :func:`outcome` what it means."""
    current: W | None = write
    attempt = 1
    while current is not None:
        try:
            return await apply(current)
        except Conflict:
            if attempt >= policy.conflict_attempts:
                raise
            log.info("object changed while writing; re-planning", extra={"object": what})
            attempt += 1
            current = await reread_and_replan()
    return None
