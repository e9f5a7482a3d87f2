"""Pod attribution's own health, as a prometheus_client collector the exporter renders with the rest.

- ``gpumon_exporter_pod_source_errors_total{source,kind}``: failures by source
  (``pod_resources``, ``api``, ``proc``, ``annotations``) and short kind.
- ``gpumon_exporter_pod_source_state{source,state}``: one-hot, ``up`` | ``down`` (failing; the
  last good view is used) | ``disabled`` (by config) | ``unsupported`` (e.g. no /proc on Windows).
- ``gpumon_exporter_pod_series``: per-pod GPU series published by the last tick.
- ``gpumon_exporter_pod_series_dropped_total``: series left out by the ``pods.max_series`` cap,
  each counted once when it starts being left out.
- ``gpumon_exporter_dra_unresolved_devices``: DRA claim devices of this node's containers that no
  ResourceSlice names (yet); each is also counted once in ``…_errors_total{source="dra",
  kind="unknown_device"}`` when it becomes unresolved.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric


class SourceState(enum.StrEnum):
    UP = "up"
    DOWN = "down"
    DISABLED = "disabled"
    UNSUPPORTED = "unsupported"


class AttributionMetrics:
    def __init__(self) -> None:
        # Set by the attributor after each refresh: which sources feed attribution now.
        self.states: dict[str, SourceState] = {}
        self._lock = threading.Lock()
        self._errors: dict[tuple[str, str], int] = {}
        self.series = 0
        self.dropped_total = 0
        self.dra_unresolved = 0

    def error(self, source: str, kind: str) -> None:
        """An :data:`~gpumon.devices.backend.ErrorSink`; safe from any thread."""
        with self._lock:
            self._errors[(source, kind)] = self._errors.get((source, kind), 0) + 1

    def errors(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._errors)

    def collect(self) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "gpumon_exporter_pod_source_errors",
            "Failures of the per-pod attribution sources, by source and kind.",
            labels=["source", "kind"],
        )
        for (source, kind), n in sorted(self.errors().items()):
            errors.add_metric([source, kind], n)
        yield errors
        state = GaugeMetricFamily(
            "gpumon_exporter_pod_source_state",
            "State of each per-pod attribution source (one-hot).",
            labels=["source", "state"],
        )
        for source, current in sorted(self.states.items()):
            for s in SourceState:
                state.add_metric([source, s.value], 1.0 if s is current else 0.0)
        yield state
        yield GaugeMetricFamily(
            "gpumon_exporter_pod_series",
            "Per-pod GPU series published by the last sample.",
            value=self.series,
        )
        yield CounterMetricFamily(
            "gpumon_exporter_pod_series_dropped",
            "Per-pod GPU series left out because of the pods.max_series limit.",
            value=self.dropped_total,
        )
        yield GaugeMetricFamily(
            "gpumon_exporter_dra_unresolved_devices",
            "DRA claim devices of this node's containers that no ResourceSlice names (yet).",
            value=self.dra_unresolved,
        )
