"""Workloads: GPU use per namespace and pod against what they were allocated, and the waste of
allocations nobody uses."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as model

from dashboards.kit import (
    FULL,
    HALF,
    Layout,
    Query,
    bargauge_panel,
    build_dashboard,
    sel,
    stat_panel,
    table_panel,
    timeseries_panel,
)

UID = "gpumon-workloads"
S = sel("cluster", "node", "namespace")
POD = "{{namespace}}/{{pod}}"
POD_KEYS = "cluster, namespace, pod"


def idle_allocations() -> str:
    """Allocations (whole devices or shared slices) whose containers kept the GPU below 1 % busy
    over the whole dashboard range. A container with no process on its GPU has no utilization
    series at all, which counts as idle too. The alert GpuAllocationIdle applies the same test
    to a 5-minute window held for an hour."""
    return (
        "max by (cluster, node, namespace, pod, gpu, uuid) ("
        f"gpumon_pod_gpu_allocated{{{S}}} == 1 or gpumon_pod_gpu_memory_allocated_bytes{{{S}}} > 0"
        ") unless on (cluster, node, namespace, pod, gpu) "
        f"max_over_time(gpumon_pod_gpu_utilization_ratio{{{S}}}[$__range]) > 0.01"
    )


def build() -> model.Dashboard:
    return build_dashboard(
        UID,
        "gpumon / Workloads",
        "Per namespace and pod: GPU memory and cores used against what was allocated (shared GPUs), "
        "and allocations left idle.",
        ("cluster", "node", "namespace"),
        [
            (
                "Memory",
                [
                    timeseries_panel(
                        "GPU memory used and allocated, by pod",
                        "Memory the pod's processes use on its GPUs, and its allocation on shared GPUs.",
                        "bytes",
                        Query(
                            f"sum by ({POD_KEYS}) (gpumon_pod_gpu_memory_used_bytes{{{S}}})", POD + " used"
                        ),
                        Query(
                            f"sum by ({POD_KEYS}) (gpumon_pod_gpu_memory_allocated_bytes{{{S}}})",
                            POD + " allocated",
                        ),
                        layout=HALF,
                        min_value=0,
                    ),
                    bargauge_panel(
                        "Memory used of allocation (shared GPUs)",
                        "Memory used as a fraction of the pod's allocation; above 100 % the pod takes "
                        "memory from its neighbours.",
                        "percentunit",
                        Query(
                            f"sum by ({POD_KEYS}) (gpumon_pod_gpu_memory_used_bytes{{{S}}})"
                            f" / sum by ({POD_KEYS}) (gpumon_pod_gpu_memory_allocated_bytes{{{S}}})",
                            POD,
                            instant=True,
                        ),
                        layout=HALF,
                        max_value=1,
                    ),
                ],
            ),
            (
                "Cores",
                [
                    timeseries_panel(
                        "GPU cores used and allocated, by pod",
                        "SM busy fraction of the pod's processes; its core allocation on a shared GPU "
                        "(cGPU gpu-core.percentage, HAMi cores) as a fraction of one GPU.",
                        "percentunit",
                        Query(
                            f"sum by ({POD_KEYS}) (gpumon_pod_gpu_utilization_ratio{{{S}}})", POD + " used"
                        ),
                        Query(
                            f"sum by ({POD_KEYS}) (gpumon_pod_gpu_core_allocated_ratio{{{S}}})",
                            POD + " allocated",
                        ),
                        layout=HALF,
                        min_value=0,
                    ),
                    timeseries_panel(
                        "GPUs busy and allocated, by namespace",
                        "SM utilization summed over the namespace's containers, whole devices assigned, and "
                        "core allocations on shared GPUs, all in GPUs.",
                        "none",
                        Query(
                            f"sum by (cluster, namespace) (gpumon_pod_gpu_utilization_ratio{{{S}}})",
                            "{{namespace}} busy",
                        ),
                        Query(
                            f"sum by (cluster, namespace) (gpumon_pod_gpu_allocated{{{S}}})",
                            "{{namespace}} whole GPUs allocated",
                        ),
                        Query(
                            f"sum by (cluster, namespace) (gpumon_pod_gpu_core_allocated_ratio{{{S}}})",
                            "{{namespace}} shared cores allocated",
                        ),
                        layout=HALF,
                        min_value=0,
                    ),
                ],
            ),
            (
                "Waste",
                [
                    stat_panel(
                        "Idle allocations",
                        "GPU allocations whose containers kept the GPU below 1 % busy over the whole range.",
                        "none",
                        Query(f"count({idle_allocations()}) or vector(0)", instant=True),
                        layout=Layout(6, 7),
                    ),
                    table_panel(
                        "Idle allocations, by pod",
                        "Pods holding a GPU (whole or shared) that stayed below 1 % busy "
                        "over the whole range.",
                        "none",
                        Query(idle_allocations(), instant=True, table=True),
                        layout=Layout(18, 7),
                        hidden_columns=("Time", "__name__", "job", "instance", "Value"),
                    ),
                    bargauge_panel(
                        "Top pods by GPU memory",
                        "The pods using the most GPU memory now.",
                        "bytes",
                        Query(
                            f"topk(15, sum by ({POD_KEYS}) (gpumon_pod_gpu_memory_used_bytes{{{S}}}))",
                            POD,
                            instant=True,
                        ),
                        layout=FULL,
                    ),
                ],
            ),
        ],
    )
