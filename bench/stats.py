"""Pure helpers for the bench's figures: percentiles, latency summaries, ratios and their text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolating linearly between the closest ranks
    (numpy's default), so a p99 of a few hundred samples does not jump to the maximum."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be between 0 and 100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Latency:
    """A latency distribution in seconds."""

    count: int
    p50: float
    p99: float
    max: float


def summarize(seconds: Sequence[float]) -> Latency:
    return Latency(len(seconds), percentile(seconds, 50), percentile(seconds, 99), max(seconds))


def improvement(measured: float, baseline: float, *, lower_is_better: bool) -> float | None:
    """How many times better ``measured`` is than ``baseline`` (above 1: better); ``None`` when
    either is not a positive number, so no ratio is made up from a zero."""
    if not (measured > 0 and baseline > 0 and math.isfinite(measured) and math.isfinite(baseline)):
        return None
    return baseline / measured if lower_is_better else measured / baseline


def format_ratio(ratio: float | None) -> str:
    """``152×`` / ``3.4×`` / ``0.85×``: two significant figures at most, a dash for no ratio."""
    if ratio is None:
        return "—"
    # Thresholds sit where rounding would carry into the next digit: 9.96 reads 10×, not 10.0×.
    if ratio >= 9.95:
        return f"{ratio:.0f}×"
    if ratio >= 0.995:
        return f"{ratio:.1f}×"
    return f"{ratio:.2f}×"


def format_ms(seconds: float) -> str:
    """Milliseconds with the digits that mean something: ``0.42 ms``, ``7.9 ms``, ``1530 ms``."""
    ms = seconds * 1000
    if ms < 1:
        return f"{ms:.2f} ms"
    if ms < 10:
        return f"{ms:.1f} ms"
    return f"{ms:.0f} ms"


def meets(measured: float, target: float, *, lower_is_better: bool) -> str:
    ok = measured <= target if lower_is_better else measured >= target
    return "yes" if ok else "**no**"
