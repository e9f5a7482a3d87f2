"""The repair ladder's counters, shared by the ladder's loop and its replacement step."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class RepairMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.repairs = Counter(
            "gpumon_controller_repairs",
            "Repair ladder moves by step and result (started, succeeded, failed, timed_out, "
            "refused, gave_up, done).",
            ["step", "result"],
            registry=registry,
        )
        self.errors = Counter(
            "gpumon_controller_repair_errors",
            "Repair writes and reads the API refused or could not take, by what.",
            ["what", "error"],
            registry=registry,
        )
