"""The exporter's own series (docs/exporter.md, "Self-metrics"), in a registry the caller
passes in: each test and each exporter builds its own, never the global one."""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpumon import __version__
from gpumon.runtime import build


class SelfMetrics:
    """The exporter's own series, in a registry of its own (never the global one)."""

    def __init__(self, registry: CollectorRegistry, *, backend: str) -> None:
        self.registry = registry
        Gauge(
            "gpumon_exporter_build_info",
            "gpumon exporter build (package version, image git revision), Python version and device backend.",
            ["version", "revision", "python_version", "backend"],
            registry=registry,
        ).labels(__version__, build.current().revision, platform.python_version(), backend).set(1)
        self.sample_duration = Histogram(
            "gpumon_exporter_sample_duration_seconds",
            "Time taken by one sampling tick, by cadence.",
            ["cadence"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )
        self.last_sample = Gauge(
            "gpumon_exporter_last_sample_timestamp_seconds",
            "Unix time of the last tick that read the devices, by cadence.",
            ["cadence"],
            registry=registry,
        )
        self.errors = Counter(
            "gpumon_exporter_errors",
            "Failed reads and other errors, by source and kind.",
            ["source", "kind"],
            registry=registry,
        )
        self.backend_up = Gauge(
            "gpumon_exporter_nvml_up",
            "1 when the device backend (NVML or simulated) is open and answering.",
            registry=registry,
        )
        self.scrape_bytes = Gauge(
            "gpumon_exporter_scrape_bytes",
            "Size of the previous rendered Prometheus text payload, uncompressed.",
            registry=registry,
        )
        self.skipped = Counter(
            "gpumon_exporter_skipped_reads",
            "Device reads not attempted because the GPU's previous call was still hung.",
            registry=registry,
        )

        self.task_restarts = Counter(
            "gpumon_exporter_task_restarts",
            "Background tasks that died (raised or returned) and were restarted, by task.",
            ["task"],
            registry=registry,
        )

    def record_error(self, source: str, kind: str) -> None:
        """An :data:`~gpumon.devices.backend.ErrorSink`; safe from any thread."""
        self.errors.labels(source, kind).inc()
