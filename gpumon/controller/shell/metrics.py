"""The controller's own metrics, in a registry passed in (never the global one).

Counters and histograms are updated where things happen; gauges that describe the cluster
(quarantined nodes, open breakers, signal freshness) are computed at scrape time from the
caches by a collector, so they can never drift from what the controller sees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.actions = Counter(
            "gpumon_controller_actions",
            "Node actions decided, by action (quarantine, update, recover, refused, skipped, "
            "device_taint) and result.",
            ["action", "result"],
            registry=registry,
        )
        self.evictions = Counter(
            "gpumon_controller_evictions",
            "Pod evictions by result (evicted, blocked, gone, deleted, error, dry_run).",
            ["result"],
            registry=registry,
        )
        self.fault_to_taint = Histogram(
            "gpumon_controller_fault_to_taint_seconds",
            "Time from the first bad signal of a fault to the node's quarantine taint being written.",
            buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=registry,
        )
        self.reconcile = Histogram(
            "gpumon_controller_reconcile_duration_seconds",
            "Duration of one reconcile round (evaluation, planning and writes).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.signal_age = Histogram(
            "gpumon_controller_signal_age_seconds",
            "Age of a node's signals when evaluated.",
            buckets=(0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 900),
            registry=registry,
        )
        self.signal_rounds = Counter(
            "gpumon_controller_signal_rounds",
            "Signal source rounds (Prometheus queries) by result.",
            ["result"],
            registry=registry,
        )
        self.signal_errors = Counter(
            "gpumon_controller_signal_errors",
            "Signal input refused or lost, by source and kind (direct: oversize, schema, invalid, "
            "flood, connection, internal; the exporters' targets file: targets_file_missing, "
            "targets_file_unreadable, targets_file_invalid); per node in "
            "gpumon_controller_exporter_refusals_total.",
            ["source", "kind"],
            registry=registry,
        )
        # Per node, only for what a node sent that the wire refuses (oversize, schema, invalid,
        # flood): healthy nodes never get a series, so the cardinality is the misbehaving ones.
        self.exporter_refusals = Counter(
            "gpumon_controller_exporter_refusals",
            "Exporter input refused at the edge, by node and kind (oversize, schema, invalid, flood); "
            "the node's reading is withdrawn until its next good state line.",
            ["node", "kind"],
            registry=registry,
        )
        self.task_restarts = Counter(
            "gpumon_controller_task_restarts",
            "Background tasks that died (raised or returned) and were restarted, by task.",
            ["task"],
            registry=registry,
        )
        self.pod_lists = Counter(
            "gpumon_controller_pod_lists",
            "Lists of one node's pods (there is no cache of the fleet's), by reader (drain, repair, "
            "scale_down) and result (ok, or the error's type).",
            ["reader", "result"],
            registry=registry,
        )
        self.api_errors = Counter(
            "gpumon_controller_api_errors",
            "Kubernetes API errors by component and kind.",
            ["component", "kind"],
            registry=registry,
        )
        self.events = Counter(
            "gpumon_controller_events",
            "Events recorded, by result (created, failed).",
            ["result"],
            registry=registry,
        )
        self.leader = Gauge(
            "gpumon_controller_leader", "1 while this replica holds the lease.", registry=registry
        )
        # The gauge misses a lease lost and won back between two scrapes; a count does not.
        self.leadership_changes = Counter(
            "gpumon_controller_leadership_changes",
            "Times this replica gained or lost the lease, by direction (gained, lost).",
            ["to"],
            registry=registry,
        )
        for to in ("gained", "lost"):
            self.leadership_changes.labels(to)
        self.dry_run = Gauge(
            "gpumon_controller_dry_run", "1 when decisions are only reported.", registry=registry
        )
        self.device_taints = Gauge(
            "gpumon_controller_device_taints",
            "DRA device taints for unhealthy GPUs (DeviceTaintRules): 1 for their state, one of "
            "active, disabled (config), unserved (the API server does not serve them), unknown "
            "(not asked yet).",
            ["state"],
            registry=registry,
        )

    def leading(self, leading: bool) -> None:
        """Told by the elector when this replica gains or loses the lease."""
        self.leader.set(1 if leading else 0)
        self.leadership_changes.labels("gained" if leading else "lost").inc()

    def device_taints_state(self, state: str) -> None:
        for s in ("active", "disabled", "unserved", "unknown"):
            self.device_taints.labels(s).set(1 if s == state else 0)

    def forget_refusals(self, node: str, kinds: frozenset[str]) -> None:
        """Drop a node's refusal series once its exporter is gone from the endpoints."""
        for kind in kinds:
            self.exporter_refusals.remove(node, kind)


class ClusterGauges(Collector):
    """Scrape-time gauges from a function returning the current picture."""

    def __init__(
        self,
        quarantined: Callable[[], Mapping[tuple[str, str], int]],
        breakers: Callable[[], Iterable[str]],
        pools: Callable[[], Iterable[str]],
        signal_status: Callable[[], Mapping[str, int]],
        synced: Callable[[], Mapping[str, bool]],
        paused: Callable[[], bool],
        overdue_drains: Callable[[], Mapping[str, int]],
    ) -> None:
        self._quarantined = quarantined
        self._breakers = breakers
        self._pools = pools
        self._signal_status = signal_status
        self._synced = synced
        self._paused = paused
        self._overdue_drains = overdue_drains

    def collect(self) -> Iterable[GaugeMetricFamily]:
        q = GaugeMetricFamily(
            "gpumon_controller_quarantined_nodes",
            "Nodes carrying gpumon's quarantine, by pool and severity.",
            labels=["pool", "severity"],
        )
        for (pool, severity), n in sorted(self._quarantined().items()):
            q.add_metric([pool, severity], n)
        yield q
        b = GaugeMetricFamily(
            "gpumon_controller_breaker_open", "1 while a pool's circuit breaker is open.", labels=["pool"]
        )
        open_pools = set(self._breakers())
        for pool in sorted(set(self._pools()) | open_pools):
            b.add_metric([pool], 1 if pool in open_pools else 0)
        yield b
        d = GaugeMetricFamily(
            "gpumon_controller_drain_overdue_nodes",
            "Quarantined nodes still draining past the drain deadline, by pool.",
            labels=["pool"],
        )
        for pool, n in sorted(self._overdue_drains().items()):
            d.add_metric([pool], n)
        yield d
        s = GaugeMetricFamily(
            "gpumon_controller_nodes_by_signal_status",
            "Managed nodes by the freshness of their signals (fresh, stale, missing).",
            labels=["status"],
        )
        for status, n in sorted(self._signal_status().items()):
            s.add_metric([status], n)
        yield s
        i = GaugeMetricFamily(
            "gpumon_controller_informer_synced", "1 once a cache has been filled.", labels=["resource"]
        )
        for resource, ok in sorted(self._synced().items()):
            i.add_metric([resource], 1 if ok else 0)
        yield i
        yield GaugeMetricFamily(
            "gpumon_controller_paused", "1 while the pause switch is on.", value=int(self._paused())
        )
