"""Ages of the cluster's RFC 3339 timestamps, and durations as people write them (pure)."""

from __future__ import annotations

from gpumon.controller.core.objects import from_rfc3339


def age(at: str | None, now: float) -> float | None:
    then = from_rfc3339(at) if at else None
    return None if then is None else max(0.0, now - then)


def duration(seconds: float | None) -> str:
    """``1d02h``, ``2h05m``, ``3m12s``, ``45s``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
