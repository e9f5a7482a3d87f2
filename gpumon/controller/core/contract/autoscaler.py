"""What the autoscaler remembers between rounds, kept on each pool's ``/scale`` target in the
annotation ``gpumon.io/autoscaler``: which pods a scale-up was for, which quarantined nodes got a
replacement, when it last scaled, and a scale-down under way. On the target itself, so that a
restarted or new leader carries on where the last one stopped and ``gpumon status`` shows it.
Pure: no I/O."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpumon.controller.core.contract import RECORD_ANNOTATION


@dataclass(frozen=True, slots=True)
class Removal:
    """A scale-down under way: ``nodes`` are marked for deletion; replicas go ``from_replicas``
    -> ``to_replicas``. Written before the /scale patch, so a restart between the two can tell
    whether the patch happened (replicas still ``from_replicas``) and finish it."""

    nodes: tuple[str, ...]
    from_replicas: int
    to_replicas: int
    at: float


@dataclass(frozen=True, slots=True)
class Record:
    provided: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # pod uid -> when
    replaced: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # node -> when
    scaled_up_at: float | None = None
    scaled_down_at: float | None = None
    removal: Removal | None = None


EMPTY_RECORD = Record()


def _times(raw: object) -> Mapping[str, float]:
    if not isinstance(raw, dict):
        return MappingProxyType({})
    return MappingProxyType(
        {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float) and math.isfinite(v)}
    )


def _time(raw: object) -> float | None:
    return float(raw) if isinstance(raw, int | float) and math.isfinite(raw) else None


def record_from_annotation(text: str | None) -> Record:
    """Tolerant: a record someone mangled reads as empty (worst case: one duplicate decision)."""
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return EMPTY_RECORD
    if not isinstance(doc, dict):
        return EMPTY_RECORD
    removal = None
    r = doc.get("removal")
    if isinstance(r, dict):
        try:
            removal = Removal(tuple(str(n) for n in r["nodes"]), int(r["from"]), int(r["to"]), float(r["at"]))
        except (KeyError, TypeError, ValueError):
            removal = None
    return Record(
        provided=_times(doc.get("provided")),
        replaced=_times(doc.get("replaced")),
        scaled_up_at=_time(doc.get("scaledUpAt")),
        scaled_down_at=_time(doc.get("scaledDownAt")),
        removal=removal,
    )


def record_of(annotations: Mapping[str, str]) -> Record:
    """The record among a target's annotations (empty without one)."""
    return record_from_annotation(annotations.get(RECORD_ANNOTATION))


def record_to_annotation(record: Record) -> str:
    doc: dict[str, Any] = {
        "provided": {k: round(v, 3) for k, v in sorted(record.provided.items())},
        "replaced": {k: round(v, 3) for k, v in sorted(record.replaced.items())},
    }
    if record.scaled_up_at is not None:
        doc["scaledUpAt"] = round(record.scaled_up_at, 3)
    if record.scaled_down_at is not None:
        doc["scaledDownAt"] = round(record.scaled_down_at, 3)
    if record.removal is not None:
        rm = record.removal
        doc["removal"] = {
            "nodes": list(rm.nodes),
            "from": rm.from_replicas,
            "to": rm.to_replicas,
            "at": rm.at,
        }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)
