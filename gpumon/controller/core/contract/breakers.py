"""The open circuit breakers, one annotation per pool on the controller's ConfigMap. The record
is the breaker: it stays open until a person removes the annotation, so a restarted or new leader
and ``gpumon status`` read it back from the ConfigMap. Pure: no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from gpumon.controller.core.contract import BREAKER_ANNOTATION_PREFIX
from gpumon.controller.core.objects import from_rfc3339, to_rfc3339


@dataclass(frozen=True, slots=True)
class BreakerTrip:
    pool: str
    opened_at: float
    reason: str


def breaker_key(pool: str) -> str:
    return BREAKER_ANNOTATION_PREFIX + pool


def breaker_to_annotation(trip: BreakerTrip) -> tuple[str, str]:
    value = json.dumps({"openedAt": to_rfc3339(trip.opened_at), "reason": trip.reason}, separators=(",", ":"))
    return breaker_key(trip.pool), value


def breakers_from_annotations(annotations: Mapping[str, str]) -> dict[str, BreakerTrip]:
    """Open breakers recorded on the ConfigMap; an unreadable value still counts as open."""
    out: dict[str, BreakerTrip] = {}
    for key, value in annotations.items():
        if not key.startswith(BREAKER_ANNOTATION_PREFIX):
            continue
        pool = key.removeprefix(BREAKER_ANNOTATION_PREFIX)
        try:
            doc = json.loads(value)
            opened = from_rfc3339(str(doc["openedAt"])) or 0.0
            reason = str(doc.get("reason", ""))
        except (ValueError, KeyError, TypeError):
            opened, reason = 0.0, f"recorded as {value!r}"
        out[pool] = BreakerTrip(pool, opened, reason)
    return out
