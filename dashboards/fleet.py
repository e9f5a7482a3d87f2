"""Fleet overview: how many GPUs are healthy, how busy the fleet is, who holds the memory,
and what the controller is doing about it."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as model

from dashboards import controller
from dashboards.kit import (
    FULL,
    HEALTH_COLORS,
    QUARTER_STAT,
    Layout,
    Query,
    bargauge_panel,
    build_dashboard,
    heatmap_panel,
    sel,
    stat_panel,
    table_panel,
    timeseries_panel,
)

UID = "gpumon-fleet"
CN = sel("cluster", "node")


def build() -> model.Dashboard:
    return build_dashboard(
        UID,
        "gpumon / Fleet overview",
        "GPU health, utilization and memory across the fleet; quarantines, circuit breakers and pool sizes.",
        ("cluster", "node"),
        [
            (
                "Health",
                [
                    stat_panel(
                        "GPUs by health state",
                        "The exporter's verdict per GPU (gpumon_gpu_health).",
                        "none",
                        Query(f"sum by (state) (gpumon_gpu_health{{{CN}}})", "{{state}}", instant=True),
                        layout=Layout(8, 5),
                        colors=HEALTH_COLORS,
                    ),
                    stat_panel(
                        "GPU nodes",
                        "Nodes whose exporter reports at least one GPU.",
                        "none",
                        Query(f"count(count by (cluster, node) (gpumon_gpu_info{{{CN}}}))", instant=True),
                        layout=Layout(4, 5),
                    ),
                    stat_panel(
                        "Nodes with unhealthy or lost GPUs",
                        "Nodes where the exporter judges at least one GPU unhealthy or lost.",
                        "none",
                        Query(
                            "count(count by (cluster, node) (gpumon_gpu_health{"
                            + sel("cluster", "node", state="~unhealthy|lost")
                            + "} == 1)) or vector(0)",
                            instant=True,
                        ),
                        layout=Layout(6, 5),
                    ),
                    table_panel(
                        "GPUs that are not healthy",
                        "Each reason the exporter gives for a GPU that is not healthy "
                        "(gpumon_gpu_health_info).",
                        "none",
                        Query(
                            f"gpumon_gpu_health_info{{{sel('cluster', 'node', reason='!')}}} == 1",
                            instant=True,
                            table=True,
                        ),
                        layout=Layout(24, 7),
                        hidden_columns=("Time", "__name__", "job", "instance", "Value"),
                    ),
                ],
            ),
            (
                "Utilization and memory",
                [
                    heatmap_panel(
                        "GPU utilization (all GPUs)",
                        "How SM utilization spreads across GPUs over time: "
                        "each column counts GPUs per bucket.",
                        "percentunit",
                        Query(f"gpumon_gpu_utilization_ratio{{{CN}}}", "{{node}}/{{gpu}}"),
                    ),
                    heatmap_panel(
                        "GPU memory used (all GPUs)",
                        "Framebuffer used as a fraction of total, spread across GPUs over time.",
                        "percentunit",
                        Query(
                            f"gpumon_gpu_memory_used_bytes{{{CN}}} / gpumon_gpu_memory_total_bytes{{{CN}}}",
                            "{{node}}/{{gpu}}",
                        ),
                    ),
                    timeseries_panel(
                        "Fleet utilization",
                        "Mean and 90th percentile SM utilization over all selected GPUs.",
                        "percentunit",
                        Query(f"avg(gpumon_gpu_utilization_ratio{{{CN}}})", "mean"),
                        Query(f"quantile(0.9, gpumon_gpu_utilization_ratio{{{CN}}})", "p90"),
                        layout=Layout(8, 8),
                        min_value=0,
                        max_value=1,
                    ),
                    timeseries_panel(
                        "Fleet memory",
                        "Framebuffer memory used and total over all selected GPUs.",
                        "bytes",
                        Query(f"sum(gpumon_gpu_memory_used_bytes{{{CN}}})", "used"),
                        Query(f"sum(gpumon_gpu_memory_total_bytes{{{CN}}})", "total"),
                        layout=Layout(8, 8),
                        min_value=0,
                    ),
                    timeseries_panel(
                        "Fleet power",
                        "Power drawn and power limit summed over all selected GPUs.",
                        "watt",
                        Query(f"sum(gpumon_gpu_power_watts{{{CN}}})", "drawn"),
                        Query(f"sum(gpumon_gpu_power_limit_watts{{{CN}}})", "limit"),
                        layout=Layout(8, 8),
                        min_value=0,
                    ),
                    bargauge_panel(
                        "Top pods by GPU memory",
                        "The ten pods using the most GPU memory, summed over their containers and GPUs.",
                        "bytes",
                        Query(
                            f"topk(10, sum by (namespace, pod) (gpumon_pod_gpu_memory_used_bytes{{{CN}}}))",
                            "{{namespace}}/{{pod}}",
                            instant=True,
                        ),
                        layout=FULL,
                    ),
                ],
            ),
            ("Controller", controller.fleet_panels()),
            (
                "Exporters",
                [
                    stat_panel(
                        "Exporters up",
                        "gpumon exporters Prometheus scraped successfully, of those it tried.",
                        "none",
                        Query(f"sum(up{{{sel('cluster', job='~.*gpumon-exporter.*')}}})", "up", instant=True),
                        Query(
                            f"count(up{{{sel('cluster', job='~.*gpumon-exporter.*')}}})",
                            "targets",
                            instant=True,
                        ),
                        layout=QUARTER_STAT,
                    ),
                    timeseries_panel(
                        "Sample age",
                        "Seconds since each exporter completed its last sample, per cadence; above a few "
                        "seconds the sampler is stuck or NVML calls are timing out. Self-metrics carry no "
                        "node label: the instance names the exporter.",
                        "s",
                        Query(
                            f"time() - gpumon_exporter_last_sample_timestamp_seconds{{{sel('cluster')}}}",
                            "{{instance}} {{cadence}}",
                        ),
                        layout=Layout(18, 5),
                        min_value=0,
                    ),
                ],
            ),
        ],
    )
