"""The exporter's real self-metrics and attribution metrics as an exporter has them after a while:
every kind of family in use (gauges, counters with ``_created``, histograms, collector families),
with odd label values. Shared by the exposition tests (byte-for-byte against prometheus_client)
and the promtool tests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gpumon.exporter.attribution_metrics import AttributionMetrics, SourceState
from gpumon.exporter.self_metrics import SelfMetrics


def self_metrics_in_use() -> CollectorRegistry:
    metrics = SelfMetrics(CollectorRegistry(auto_describe=True), backend="nvml")
    for cadence in ("fast", "slow"):
        metrics.sample_duration.labels(cadence).observe(0.0123)
        metrics.last_sample.labels(cadence).set(1_763_900_000.25)
    metrics.record_error("nvml", 'odd "kind"\\n\nü')
    metrics.task_restarts.labels("gpumon-sampler").inc(3)
    metrics.backend_up.set(1)
    metrics.scrape_bytes.set(65_432)
    attribution = AttributionMetrics()
    attribution.states = {"api": SourceState.UP, "proc": SourceState.UNSUPPORTED}
    attribution.error("api", "timeout")
    attribution.series = 64
    metrics.registry.register(attribution)
    return metrics.registry
