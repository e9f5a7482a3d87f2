"""The repair ladder's gate (pure): which new disruptive steps of a round may start, through
the quarantine's own breaker, rate limit and pause switch
(:func:`gpumon.controller.core.breaker.admit`), never a second such machinery."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpumon.controller.core.breaker import Admission, Candidate, PoolView, SafetyPolicy, admit
from gpumon.controller.core.contract.breakers import BreakerTrip
from gpumon.controller.core.objects import to_rfc3339


def continuing_refusal(
    pool: str, open_breakers: Mapping[str, BreakerTrip], policy: SafetyPolicy
) -> str | None:
    """Why the next step of a ladder already under way may not start: the pause switch or an
    open breaker. It is not counted again toward the breaker or the rate limit: its node was,
    when its ladder began."""
    if policy.paused:
        return "paused"
    trip = open_breakers.get(pool) if policy.breaker_enabled else None
    if trip is None:
        return None
    return f"circuit breaker open for pool {pool!r} since {to_rfc3339(trip.opened_at)} ({trip.reason})"


def admit_repairs(
    wanted: Sequence[tuple[str, str, float]],
    pools: Mapping[str, PoolView],
    open_breakers: Mapping[str, BreakerTrip],
    *,
    now: float,
    policy: SafetyPolicy,
) -> Admission:
    """Which of this round's new ladders (node, pool, when its fault began) may take their
    first step, through :func:`gpumon.controller.core.breaker.admit`: ``pools`` count the
    ladders begun in each pool (their first steps' start times) where the quarantine counts
    quarantines, so a wave of repairs trips the breaker as a wave of faults does, and an open
    breaker refuses both."""
    return admit([Candidate(n, p, t) for n, p, t in wanted], pools, open_breakers, now=now, policy=policy)
