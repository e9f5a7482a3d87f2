"""Node / GPU detail: everything the exporter knows about the selected cards."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as model

from dashboards.kit import (
    FULL,
    THIRD,
    Layout,
    Query,
    build_dashboard,
    sel,
    state_timeline_panel,
    table_panel,
    timeseries_panel,
)

UID = "gpumon-node"
S = sel("cluster", "node", "gpu")
CARD = "{{node}}/{{gpu}}"


def _new_xids() -> str:
    """Xids per code that arrived within the step. A code's counter series is born at its first
    event, and increase() cannot see a series' first sample: a series absent one step earlier
    counts from zero instead."""
    x = f"gpumon_gpu_xid_errors_total{{{S}}}"
    return f"({x} - ({x} offset $__rate_interval or {x} * 0)) > 0"


def _health_rank() -> str:
    """The one-hot health series folded into one number per GPU: 0 healthy ... 3 lost."""
    ranked = " or ".join(
        f"{rank} * gpumon_gpu_health{{{sel('cluster', 'node', 'gpu', state=state)}}}"
        for rank, state in ((1, "degraded"), (2, "unhealthy"), (3, "lost"))
    )
    return f"sum by (cluster, node, gpu) ({ranked})"


def build() -> model.Dashboard:
    return build_dashboard(
        UID,
        "gpumon / Node and GPU detail",
        "Per card: health, utilization, memory, temperatures, power, clocks, throttling, ECC, row "
        "remapping and Xid events.",
        ("cluster", "node", "gpu"),
        [
            (
                "Identity and health",
                [
                    table_panel(
                        "GPUs",
                        "Model, PCI bus id and driver of each selected GPU (gpumon_gpu_info).",
                        "none",
                        Query(f"gpumon_gpu_info{{{S}}}", instant=True, table=True),
                        layout=Layout(24, 6),
                        hidden_columns=("Time", "__name__", "job", "instance", "Value"),
                    ),
                    state_timeline_panel(
                        "Health",
                        "The exporter's verdict per GPU over time.",
                        "none",
                        Query(_health_rank(), CARD),
                        {
                            0: ("healthy", "green"),
                            1: ("degraded", "yellow"),
                            2: ("unhealthy", "orange"),
                            3: ("lost", "red"),
                        },
                    ),
                    table_panel(
                        "Health reasons",
                        "Why a selected GPU is not healthy, one row per reason (gpumon_gpu_health_info).",
                        "none",
                        Query(
                            f"gpumon_gpu_health_info{{{sel('cluster', 'node', 'gpu', reason='!')}}} == 1",
                            instant=True,
                            table=True,
                        ),
                        layout=Layout(24, 6),
                        hidden_columns=("Time", "__name__", "job", "instance", "Value"),
                    ),
                ],
            ),
            (
                "Utilization and memory",
                [
                    timeseries_panel(
                        "SM utilization",
                        "Fraction of the sample period the streaming multiprocessors were busy.",
                        "percentunit",
                        Query(f"gpumon_gpu_utilization_ratio{{{S}}}", CARD),
                        layout=THIRD,
                        min_value=0,
                        max_value=1,
                    ),
                    timeseries_panel(
                        "Memory controller utilization",
                        "Fraction of the sample period the memory controller was busy.",
                        "percentunit",
                        Query(f"gpumon_gpu_memory_utilization_ratio{{{S}}}", CARD),
                        layout=THIRD,
                        min_value=0,
                        max_value=1,
                    ),
                    timeseries_panel(
                        "Framebuffer memory",
                        "Used and driver-reserved framebuffer memory against the total.",
                        "bytes",
                        Query(f'gpumon_gpu_memory_used_bytes{{{S}, gpu_instance=""}}', CARD + " used"),
                        Query(
                            f'gpumon_gpu_memory_reserved_bytes{{{S}, gpu_instance=""}}', CARD + " reserved"
                        ),
                        Query(f'gpumon_gpu_memory_total_bytes{{{S}, gpu_instance=""}}', CARD + " total"),
                        layout=THIRD,
                        min_value=0,
                    ),
                ],
            ),
            (
                "Thermals, power and clocks",
                [
                    timeseries_panel(
                        "Temperature",
                        "GPU and (on HBM boards) memory temperature.",
                        "celsius",
                        Query(f"gpumon_gpu_temperature_celsius{{{S}}}", CARD + " {{sensor}}"),
                        layout=THIRD,
                    ),
                    timeseries_panel(
                        "Power",
                        "Power drawn and the power management limit.",
                        "watt",
                        Query(f"gpumon_gpu_power_watts{{{S}}}", CARD + " drawn"),
                        Query(f"gpumon_gpu_power_limit_watts{{{S}}}", CARD + " limit"),
                        layout=THIRD,
                        min_value=0,
                    ),
                    timeseries_panel(
                        "Clocks",
                        "SM and memory clock frequency.",
                        "hertz",
                        Query(f"gpumon_gpu_clock_hertz{{{S}}}", CARD + " {{clock}}"),
                        layout=THIRD,
                        min_value=0,
                    ),
                    state_timeline_panel(
                        "Throttling",
                        "Clock event reasons that slow a GPU down (idle and application-clock settings "
                        "left out); a band marks when a reason was active.",
                        "none",
                        Query(
                            f"max by (cluster, node, gpu, reason) (gpumon_gpu_throttled{{{S}, "
                            'reason!~"gpu_idle|applications_clocks_setting|display_clock_setting"}) == 1',
                            CARD + " {{reason}}",
                        ),
                        {1: ("active", "orange")},
                        layout=Layout(24, 6),
                    ),
                ],
            ),
            (
                "Errors",
                [
                    timeseries_panel(
                        "ECC errors",
                        "Volatile ECC errors per step, corrected (single-bit) and uncorrected (double-bit).",
                        "short",
                        Query(
                            f"increase(gpumon_gpu_ecc_errors_total{{{S}}}[$__rate_interval])",
                            CARD + " {{type}}",
                        ),
                        layout=THIRD,
                        min_value=0,
                    ),
                    timeseries_panel(
                        "Row remapping",
                        "Rows remapped by cause; pending waits for a GPU reset, failure means no spare rows.",
                        "short",
                        Query(f"gpumon_gpu_remapped_rows{{{S}}}", CARD + " remapped {{type}}"),
                        Query(f"gpumon_gpu_row_remap_pending{{{S}}}", CARD + " pending"),
                        Query(f"gpumon_gpu_row_remap_failure{{{S}}}", CARD + " failure"),
                        layout=THIRD,
                        min_value=0,
                    ),
                    timeseries_panel(
                        "PCIe replays",
                        "PCIe link retries per second; a steady rate points at a bad riser or slot.",
                        "cps",
                        Query(f"rate(gpumon_gpu_pcie_replays_total{{{S}}}[$__rate_interval])", CARD),
                        layout=THIRD,
                        min_value=0,
                    ),
                    timeseries_panel(
                        "Xid events",
                        "Xid errors by code as they arrive (NVIDIA's Xid catalog says what each means).",
                        "short",
                        Query(_new_xids(), CARD + " Xid {{xid}}"),
                        layout=FULL,
                        bars=True,
                        min_value=0,
                    ),
                ],
            ),
        ],
    )
