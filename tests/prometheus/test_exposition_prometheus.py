"""The exporter's metrics against the real Prometheus tools.

- ``promtool check metrics`` accepts the rendered text of both profiles: the native profile with
  no finding at all, the dcgm profile with only the findings dcgm-exporter's own names cause;
- a real Prometheus scrapes a running ``gpumon exporter --backend simulated --metrics-profile
  both``: ``up`` is 1 and every native family is queryable through the HTTP API;
- every PromQL query of NVIDIA's dcgm-exporter dashboard returns data against the dcgm profile,
  apart from the profiling-only fields docs/metrics.md lists as not provided.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from self_metrics_in_use import self_metrics_in_use

from gpumon.exporter.exposition import Profile, render
from gpumon.gpu.model import (
    DriverInfo,
    FastFields,
    GpuIdentity,
    GpuSample,
    HealthReason,
    HealthState,
    HealthVerdict,
    MemoryInfo,
    MigInstance,
    MigProfiling,
    PodGpuUsage,
    PodRef,
    Profiling,
    SlowFields,
    Snapshot,
)

if TYPE_CHECKING:
    from conftest import ExporterProcess, PrometheusProcess

REPO = Path(__file__).resolve().parents[2]
INTEROP = Path(__file__).parent / "dcgm-exporter"
METRICS_DOC = REPO / "docs" / "metrics.md"

# What promtool's linter says about dcgm-exporter's own names: the `modelName` label is camelCase
# and DCGM_FI_DEV_PCIE_REPLAY_COUNTER names its type. Renaming either would break dcgm dashboards.
DCGM_NAME_FINDINGS = {
    "label names should be written in 'snake_case' not 'camelCase'",
    "metric name should not include type 'counter'",
}


def rich_snapshot() -> Snapshot:
    """Every kind of series: all fields, MIG instances, Xids, a lost GPU, pods with odd names."""
    gib = 1024**3
    fast = FastFields(
        memory=MemoryInfo(80 * gib, 20 * gib, 59 * gib, gib),
        utilization_ratio=0.5,
        memory_utilization_ratio=0.2,
        temperature_gpu_celsius=60,
        temperature_memory_celsius=66,
        power_watts=250,
        power_limit_watts=400,
        energy_joules=1e6,
        sm_clock_hertz=1.41e9,
        memory_clock_hertz=1.593e9,
        throttle_reasons=frozenset({"sw_power_cap"}),
    )
    mig = MigInstance(1, 0, "3g.40gb", "MIG-1", MemoryInfo(40 * gib, gib, 39 * gib))
    slow = SlowFields(
        pcie_replays=1,
        ecc_corrected=2,
        ecc_uncorrected=0,
        remapped_rows_correctable=1,
        remapped_rows_uncorrectable=0,
        row_remap_pending=False,
        row_remap_failure=False,
        mig_instances=(mig,),
        profiling=Profiling(0.9, 0.8, 0.6, 0.45, 0.05, 0.2, 0.3, 0.35, 2.0e9, 1.5e9, 3.0e10, 2.5e10),
        mig_profiling=(MigProfiling(1, "3g.40gb", Profiling(sm_active_ratio=0.7, dram_active_ratio=0.2)),),
        encoder_utilization_ratio=0.1,
        decoder_utilization_ratio=0.05,
        fan_speed_ratio=0.4,
        performance_state=0,
        violation_seconds={"power": 12.5, "thermal": 0.25},
        nvlink_data_bytes={"tx": 4096, "rx": 8192},
        nvlink_data_bytes_per_second=5.0e9,
        nvlink_errors={(0, "replay"): 1, (0, "recovery"): 0, (0, "crc"): 2, (1, "crc"): 0},
        vgpu_licensed=True,
    )
    degraded = HealthVerdict(
        HealthState.DEGRADED, (HealthReason("Thermal", "temperature 90 C", HealthState.DEGRADED),)
    )
    lost = HealthVerdict(HealthState.LOST, (HealthReason("GpuLost", "GPU is lost", HealthState.LOST),))
    gpus = tuple(
        GpuSample(
            GpuIdentity(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", f"00000000:{i + 1:02X}:00.0"),
            fast,
            slow,
            degraded if i == 1 else lost if i == 2 else HealthVerdict(HealthState.HEALTHY),
            1.0,
            {13: 1, 79: 1} if i == 2 else {},
            lost=i == 2,
            last_xid=79 if i == 2 else None,
        )
        for i in range(3)
    )
    pods = (
        PodGpuUsage(
            PodRef("ml", 'we"ird\\pod\nname', "main"),
            0,
            "GPU-0",
            gib,
            0.4,
            allocated_resources=("nvidia.com/gpu",),
        ),
        PodGpuUsage(PodRef("ml", "shared-a", "c"), 1, "GPU-1", gib, 0.1, 2 * gib, 0.5),
        PodGpuUsage(PodRef("ml", "shared-b", "c"), 1, "GPU-1", gib, 0.2, 2 * gib, 0.5),
    )
    return Snapshot("node-ä", DriverInfo("550.54.15", "12.4"), gpus, pods, 1.0, True, True)


def promtool_findings(text: bytes) -> tuple[int, set[tuple[str, str]]]:
    """promtool's exit code and its findings as (metric, problem)."""
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=120)
    findings = set()
    for line in (result.stdout + result.stderr).decode().splitlines():
        metric, _, problem = line.partition(" ")
        if metric:
            findings.add((metric, problem))
    return result.returncode, findings


def assert_promtool_accepts(text: bytes) -> None:
    code, findings = promtool_findings(text)
    assert code in (0, 3), findings  # 1 would be a parse error, 3 is lint findings only
    assert {f for f in findings if not f[0].startswith("DCGM_")} == set()
    assert {problem for _, problem in findings} <= DCGM_NAME_FINDINGS, findings


@pytest.mark.parametrize("profile", ["native", "dcgm", "both"])
def test_promtool_accepts_rendered_profiles(profile: Profile) -> None:
    # With the exporter's own series, which the same writer renders (issue #19).
    text = render(rich_snapshot(), profile=profile, extra=[self_metrics_in_use()]).text
    assert "gpumon_exporter_sample_duration_seconds_bucket" in text.decode()
    assert_promtool_accepts(text)
    if profile == "native":
        assert promtool_findings(text) == (0, set())


def test_promtool_lint_does_bite() -> None:
    code, findings = promtool_findings(b"# TYPE gpumon_gpu_oops_total counter\ngpumon_gpu_oops_total 1\n")
    assert code == 3 and findings


def test_promtool_accepts_the_running_exporter(exporter: ExporterProcess) -> None:
    assert_promtool_accepts(exporter.metrics())


# --- a real Prometheus scraping the exporter -----------------------------------------------------


@pytest.fixture(scope="module")
def scraping(prometheus: PrometheusProcess, exporter: ExporterProcess) -> Iterator[PrometheusProcess]:
    prometheus.configure(prometheus.config({"gpumon": [exporter.target]}))
    prometheus.wait_for('up{job="gpumon"} == 1', timeout=120)
    # Rates need two scrapes of every series.
    prometheus.wait_for('count_over_time(up{job="gpumon"}[1m]) >= 3', timeout=120)
    yield prometheus
    prometheus.configure(prometheus.config())


def exported_families(exporter: ExporterProcess) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(exporter.metrics().decode())}


def test_up_and_native_series_are_queryable(scraping: PrometheusProcess, exporter: ExporterProcess) -> None:
    [up] = scraping.query('up{job="gpumon"}')
    assert up["value"][1] == "1" and up["metric"]["instance"] == exporter.target
    families = exported_families(exporter)
    native = {n: f for n, f in families.items() if n.startswith("gpumon_gpu_")}
    assert "gpumon_gpu_info" in native and "gpumon_gpu_health" in native
    for family in native.values():
        sample_name = family.samples[0].name
        result = scraping.query(f'{sample_name}{{job="gpumon"}}')
        assert len(result) == len(family.samples), sample_name
        assert {r["metric"]["node"] for r in result} == {"prom-test-node"}, sample_name
    gpus = len(native["gpumon_gpu_info"].samples)
    healthy = scraping.query('sum(gpumon_gpu_health{job="gpumon"})')
    assert healthy[0]["value"][1] == str(gpus)  # one-hot: exactly one state per GPU


def test_prometheus_reads_the_openmetrics_units_and_types(scraping: PrometheusProcess) -> None:
    metadata = scraping.api("metadata")
    assert {"type": "counter", "unit": "joules"} in [
        {"type": m["type"], "unit": m["unit"]} for m in metadata.get("gpumon_gpu_energy_joules", [])
    ], metadata.get("gpumon_gpu_energy_joules")
    assert metadata["gpumon_gpu_temperature_celsius"][0]["unit"] == "celsius"


def test_rates_of_counters_work(scraping: PrometheusProcess) -> None:
    scraping.wait_for('rate(gpumon_gpu_energy_joules_total{job="gpumon"}[30s]) > 0')
    scraping.wait_for('rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{job="gpumon"}[30s]) > 0')


# --- NVIDIA's dcgm-exporter dashboard against the dcgm profile ---------------------------------


def not_provided_fields() -> set[str]:
    """The dcgm fields docs/metrics.md lists under "dcgm fields gpumon does not provide"."""
    text = METRICS_DOC.read_text()
    section = text.split("## dcgm fields gpumon does not provide", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| ")]
    return {name for cell in first_cells for name in re.findall(r"`(DCGM_F[A-Z0-9_]+)`", cell)}


def dashboard_queries() -> list[str]:
    dashboard = json.loads((INTEROP / "dcgm-exporter-dashboard.json").read_text())

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    return [t["expr"] for p in panels(dashboard["panels"]) for t in p.get("targets", []) if t.get("expr")]


def dashboard_variables() -> dict[str, str]:
    dashboard = json.loads((INTEROP / "dcgm-exporter-dashboard.json").read_text())
    return {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"}


def substitute(expr: str, values: dict[str, list[str]]) -> str:
    """What Grafana sends with every variable set to "All": a regex of all its values, its
    metacharacters escaped for the regex and the backslashes again for the PromQL string."""
    for name, vals in values.items():
        regex = "(" + "|".join(re.escape(v) for v in vals) + ")"
        expr = expr.replace(f"${name}", regex.replace("\\", "\\\\"))
    for interval in ("$__rate_interval", "$__interval", "$__range"):
        expr = expr.replace(interval, "1m")
    return expr


def variable_values(prometheus: PrometheusProcess) -> dict[str, list[str]]:
    """Each dashboard variable's values, as Grafana asks Prometheus for them."""
    values: dict[str, list[str]] = {}
    for name, query in dashboard_variables().items():
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
        assert match, f"unsupported variable query {query!r}"
        metric, label = match.groups()
        values[name] = prometheus.api(f"label/{label}/values", **{"match[]": metric})
        assert values[name], f"variable ${name} has no values ({query})"
    return values


def test_every_dashboard_query_returns_data(scraping: PrometheusProcess, exporter: ExporterProcess) -> None:
    values = variable_values(scraping)
    assert exporter.target in values["instance"]

    queries = dashboard_queries()
    assert len(queries) >= 8
    empty = []
    for expr in queries:
        # The simulated GPUs are A100s, which have no GPM, as on real NVML: their profiling
        # panels are empty. test_dcgm_dashboard_mock_nvml.py fills every panel from H100s.
        if any(m.startswith("DCGM_FI_PROF_") for m in re.findall(r"DCGM_F\w+", expr)):
            continue
        if not scraping.query(substitute(expr, values)):
            empty.append(expr)
    assert empty == []


def test_every_default_dcgm_field_is_exposed_or_documented_as_not_provided() -> None:
    fields = {}
    for line in (INTEROP / "default-counters.csv").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, kind, _ = (part.strip() for part in line.split(",", 2))
            fields[name] = kind
    families = list(text_string_to_metric_families(render(rich_snapshot(), profile="dcgm").text.decode()))
    exposed = {f.name for f in families}
    labels = {k for f in families for s in f.samples for k in s.labels}
    missing = {
        name
        for name, kind in fields.items()
        if (name not in labels if kind == "label" else name not in exposed)
    }
    assert missing == not_provided_fields() & set(fields)
    assert not (exposed & not_provided_fields())  # nothing documented as absent is exposed
