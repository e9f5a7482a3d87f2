"""Controller: what it decided and did (quarantines, evictions, time to quarantine, repairs,
scale plans) and how healthy it is itself. Metric names: gpumon/controller/shell/metrics.py.

Every replica exports the cluster-wide gauges from its own caches, so gauges are read with
``max by (...)``: the replicas agree, and a sum would count the fleet once per replica. The
panels built here for the fleet overview are shared through :func:`fleet_panels`.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as model

from dashboards.kit import (
    HALF,
    THIRD,
    Layout,
    Query,
    build_dashboard,
    sel,
    stat_panel,
    timeseries_panel,
)

UID = "gpumon-controller"
C = sel("cluster")


def _rate(counter: str, by: str) -> str:
    return f"sum by ({by}) (increase({counter}{{{C}}}[$__rate_interval]))"


def _quantile(q: float, histogram: str, window: str, by: str = "le") -> str:
    return f"histogram_quantile({q}, sum by ({by}) (increase({histogram}_bucket{{{C}}}[{window}])))"


def quarantined_nodes(layout: Layout) -> cogbuilder.Builder[model.Panel]:
    return stat_panel(
        "Quarantined nodes",
        "Nodes carrying gpumon's quarantine taint, by pool and severity.",
        "none",
        Query(
            f"max by (pool, severity) (gpumon_controller_quarantined_nodes{{{C}}})",
            "{{pool}} {{severity}}",
            instant=True,
        ),
        layout=layout,
    )


def breakers(layout: Layout) -> cogbuilder.Builder[model.Panel]:
    return stat_panel(
        "Circuit breakers",
        "Per pool: open (1) means the controller has stopped new quarantines there until a person "
        "resets the breaker.",
        "bool_on_off",
        Query(f"max by (pool) (gpumon_controller_breaker_open{{{C}}})", "{{pool}}", instant=True),
        layout=layout,
    )


def pool_sizes(layout: Layout) -> cogbuilder.Builder[model.Panel]:
    return timeseries_panel(
        "Pool sizes",
        "Replicas per GPU node pool: current, desired (the controller's plan) and the bounds.",
        "none",
        Query(f"max by (pool, kind) (gpumon_autoscaler_replicas{{{C}}})", "{{pool}} {{kind}}"),
        layout=layout,
        min_value=0,
    )


def fleet_panels() -> Sequence[cogbuilder.Builder[model.Panel]]:
    """The controller's part of the fleet overview."""
    return [quarantined_nodes(Layout(8, 8)), breakers(Layout(6, 8)), pool_sizes(Layout(10, 8))]


def build() -> model.Dashboard:
    return build_dashboard(
        UID,
        "gpumon / Controller",
        "Quarantines, evictions, time from fault to taint, repairs, scale plans, and the controller's own "
        "health.",
        ("cluster",),
        [
            (
                "State",
                [
                    quarantined_nodes(Layout(8, 6)),
                    breakers(Layout(6, 6)),
                    stat_panel(
                        "Mode",
                        "Dry-run (decisions only reported) and the pause switch, as the replicas report "
                        "them.",
                        "bool_on_off",
                        Query(f"max(gpumon_controller_dry_run{{{C}}})", "dry-run", instant=True),
                        Query(f"max(gpumon_controller_paused{{{C}}})", "paused", instant=True),
                        layout=Layout(5, 6),
                    ),
                    stat_panel(
                        "Leader",
                        "The replica holding the leader-election lease; only it acts.",
                        "none",
                        Query(f"gpumon_controller_leader{{{C}}} == 1", "{{instance}}", instant=True),
                        layout=Layout(5, 6),
                    ),
                ],
            ),
            (
                "Actions",
                [
                    timeseries_panel(
                        "Node actions",
                        "Actions decided per step, by action and result (quarantine, update, recover, "
                        "refused, skipped).",
                        "short",
                        Query(
                            _rate("gpumon_controller_actions_total", "action, result"),
                            "{{action}} {{result}}",
                        ),
                        layout=THIRD,
                        bars=True,
                        min_value=0,
                    ),
                    timeseries_panel(
                        "Evictions",
                        "Pod evictions per step by result; blocked means a PodDisruptionBudget refused.",
                        "short",
                        Query(_rate("gpumon_controller_evictions_total", "result"), "{{result}}"),
                        layout=THIRD,
                        bars=True,
                        min_value=0,
                    ),
                    timeseries_panel(
                        "Time to quarantine",
                        "From the first bad signal of a fault to the node's taint, over the last hour.",
                        "s",
                        Query(_quantile(0.5, "gpumon_controller_fault_to_taint_seconds", "1h"), "median"),
                        Query(_quantile(0.95, "gpumon_controller_fault_to_taint_seconds", "1h"), "p95"),
                        layout=THIRD,
                        min_value=0,
                    ),
                ],
            ),
            (
                "Repair",
                [
                    stat_panel(
                        "Repair ladders",
                        "Per pool: nodes with a repair ladder under way, and nodes whose ladder gave up "
                        "and wait for a person (alert GpuRepairGaveUp).",
                        "none",
                        Query(
                            f"max by (pool) (gpumon_controller_repairing_nodes{{{C}}})",
                            "{{pool}} repairing",
                            instant=True,
                        ),
                        Query(
                            f"max by (pool) (gpumon_controller_repair_gave_up_nodes{{{C}}})",
                            "{{pool}} gave up",
                            instant=True,
                        ),
                        layout=Layout(8, 8),
                    ),
                    timeseries_panel(
                        "Repair steps",
                        "Moves of the repair ladders per step, by step (reset, reboot, replace, "
                        "validate) and result (started, succeeded, failed, timed out, refused, gave up, "
                        "done).",
                        "short",
                        Query(
                            _rate("gpumon_controller_repairs_total", "step, result"), "{{step}} {{result}}"
                        ),
                        layout=Layout(16, 8),
                        bars=True,
                        min_value=0,
                    ),
                ],
            ),
            (
                "Scaling",
                [
                    pool_sizes(HALF),
                    timeseries_panel(
                        "Pending GPU pods and overdue drains",
                        "GPU pods waiting for a pool's capacity, and quarantined nodes still draining past "
                        "the drain deadline.",
                        "none",
                        Query(f"max by (pool) (gpumon_autoscaler_pending_pods{{{C}}})", "{{pool}} pending"),
                        Query(
                            f"max by (pool) (gpumon_controller_drain_overdue_nodes{{{C}}})",
                            "{{pool}} overdue",
                        ),
                        layout=HALF,
                        min_value=0,
                    ),
                ],
            ),
            (
                "Controller health",
                [
                    timeseries_panel(
                        "Reconcile duration",
                        "99th percentile of one reconcile round per replica.",
                        "s",
                        Query(
                            _quantile(
                                0.99,
                                "gpumon_controller_reconcile_duration_seconds",
                                "$__rate_interval",
                                "le, instance",
                            ),
                            "{{instance}}",
                        ),
                        layout=THIRD,
                        min_value=0,
                    ),
                    timeseries_panel(
                        "Signal freshness",
                        "Managed nodes by the freshness of their signals; the controller never acts on stale "
                        "or missing ones.",
                        "none",
                        Query(
                            f"max by (status) (gpumon_controller_nodes_by_signal_status{{{C}}})", "{{status}}"
                        ),
                        layout=THIRD,
                        min_value=0,
                    ),
                    timeseries_panel(
                        "API errors",
                        "Kubernetes API errors per step, by component and kind.",
                        "short",
                        Query(
                            _rate("gpumon_controller_api_errors_total", "component, kind"),
                            "{{component}} {{kind}}",
                        ),
                        layout=THIRD,
                        bars=True,
                        min_value=0,
                    ),
                ],
            ),
        ],
    )
