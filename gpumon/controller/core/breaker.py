"""May a node be newly quarantined now? Pause switch, circuit breaker and rate limit (pure).

Counts come from the cluster (each quarantined node's ``gpumon.io/quarantined-at``), so a
restarted or new leader decides exactly as the old one would. A breaker trips when a pool
would exceed max(``min_nodes``, ``max_fraction`` * pool size) quarantines within the window;
it then stays open, recorded as an annotation on the controller's ConfigMap, until a person
removes that annotation (or disables the breaker in config). Only *new* quarantines are ever
refused: updates and recovery of quarantined nodes always proceed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpumon.controller.core.contract.breakers import BreakerTrip
from gpumon.controller.core.objects import to_rfc3339


@dataclass(frozen=True, slots=True)
class SafetyPolicy:
    paused: bool = False
    breaker_enabled: bool = True
    breaker_min_nodes: int = 2
    breaker_max_fraction: float = 0.2
    breaker_window_seconds: float = 3600.0
    rate_limit_max: int = 5
    rate_limit_window_seconds: float = 600.0


@dataclass(frozen=True, slots=True)
class Candidate:
    node: str
    pool: str
    first_bad_at: float


@dataclass(frozen=True, slots=True)
class PoolView:
    size: int
    # quarantined-at of the pool's currently quarantined nodes
    quarantined_at: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: frozenset[str]
    refused: Mapping[str, str]
    tripped: tuple[BreakerTrip, ...] = ()
    # When a rate-limited candidate may be tried again.
    retry_at: float | None = None


def breaker_limit(pool_size: int, policy: SafetyPolicy) -> int:
    return max(policy.breaker_min_nodes, math.floor(policy.breaker_max_fraction * pool_size))


def admit(
    candidates: Sequence[Candidate],
    pools: Mapping[str, PoolView],
    open_breakers: Mapping[str, BreakerTrip],
    *,
    now: float,
    policy: SafetyPolicy,
) -> Admission:
    """Decide, oldest fault first, which candidates are quarantined now and why others wait."""
    admitted: list[str] = []
    refused: dict[str, str] = {}
    tripped: dict[str, BreakerTrip] = {}
    per_pool: dict[str, int] = {}
    rate_times = sorted(
        t for p in pools.values() for t in p.quarantined_at if now - t < policy.rate_limit_window_seconds
    )
    retry_at: float | None = None
    for cand in sorted(candidates, key=lambda c: (c.first_bad_at, c.node)):
        if policy.paused:
            refused[cand.node] = "paused"
            continue
        pool = pools.get(cand.pool, PoolView(size=1))
        trip = tripped.get(cand.pool) or (open_breakers.get(cand.pool) if policy.breaker_enabled else None)
        if trip is not None:
            since = to_rfc3339(trip.opened_at)
            refused[cand.node] = f"circuit breaker open for pool {cand.pool!r} since {since} ({trip.reason})"
            continue
        if policy.breaker_enabled:
            recent = sum(1 for t in pool.quarantined_at if now - t < policy.breaker_window_seconds)
            count = recent + per_pool.get(cand.pool, 0) + 1
            limit = breaker_limit(pool.size, policy)
            if count > limit:
                reason = (
                    f"{count} of {pool.size} nodes in pool {cand.pool!r} would be quarantined within "
                    f"{policy.breaker_window_seconds:g}s, over the limit of {limit}"
                )
                tripped[cand.pool] = BreakerTrip(cand.pool, now, reason)
                refused[cand.node] = f"circuit breaker tripped: {reason}"
                continue
        if len(rate_times) + len(admitted) >= policy.rate_limit_max:
            refused[cand.node] = (
                f"rate limit: at most {policy.rate_limit_max} new quarantines per "
                f"{policy.rate_limit_window_seconds:g}s"
            )
            if rate_times:
                wake = rate_times[0] + policy.rate_limit_window_seconds
                retry_at = wake if retry_at is None else min(retry_at, wake)
            continue
        admitted.append(cand.node)
        per_pool[cand.pool] = per_pool.get(cand.pool, 0) + 1
    return Admission(frozenset(admitted), refused, tuple(tripped.values()), retry_at)
