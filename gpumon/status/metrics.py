"""What the controller's /metrics says about it (pure): leader, dry-run, pause, breakers,
signal freshness, evictions. Without /metrics, dry-run is read from its latest Events."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from gpumon.status.model import ControllerStatus
from gpumon.status.state import EventInfo

# Events the controller prefixes with "[dry-run] " when it only reports.
_ACTION_REASONS = frozenset(
    {"GpuQuarantined", "GpuQuarantineUpdated", "GpuRecovered", "GpuPodEvicted", "GpuBreakerOpen"}
)


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _flag(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> bool | None:
    values = samples.get(name)
    return None if not values else values[0][1] >= 1


def controller_status(
    text: str | None, source: str, error: str | None, events: Sequence[EventInfo]
) -> ControllerStatus:
    if text is None:
        dry_run = dry_run_from_events(events)
        return ControllerStatus(
            reachable=False,
            source=source,
            error=error,
            dry_run=dry_run,
            dry_run_from="" if dry_run is None else "events",
        )
    try:
        samples = _samples(text)
    except ValueError as e:
        return ControllerStatus(False, source, f"not Prometheus text: {e}")
    by_label = {
        name: {labels.get(key, ""): value for labels, value in samples.get(name, ())}
        for name, key in (
            ("gpumon_controller_nodes_by_signal_status", "status"),
            ("gpumon_controller_evictions_total", "result"),
            ("gpumon_controller_breaker_open", "pool"),
        )
    }
    dry_run = _flag(samples, "gpumon_controller_dry_run")
    return ControllerStatus(
        reachable=True,
        source=source,
        leader=_flag(samples, "gpumon_controller_leader"),
        dry_run=dry_run,
        dry_run_from="metrics" if dry_run is not None else "",
        paused=_flag(samples, "gpumon_controller_paused"),
        breakers_open=tuple(
            sorted(p for p, v in by_label["gpumon_controller_breaker_open"].items() if v >= 1)
        ),
        signals=by_label["gpumon_controller_nodes_by_signal_status"],
        evictions=by_label["gpumon_controller_evictions_total"],
    )


def dry_run_from_events(events: Sequence[EventInfo]) -> bool | None:
    """Whether the latest action Event was only reported; None when there is none."""
    actions = [e for e in events if e.reason in _ACTION_REASONS]
    return actions[-1].dry_run if actions else None
