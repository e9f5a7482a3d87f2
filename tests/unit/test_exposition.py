"""Exposition: snapshots built by hand, rendered, and parsed back with prometheus_client's parsers."""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Sequence
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from self_metrics_in_use import self_metrics_in_use

from gpumon.exporter.exposition import (
    CONTENT_TYPE_OPENMETRICS,
    CONTENT_TYPE_TEXT,
    VARIANTS,
    LineCache,
    Profile,
    Variant,
    prerender_variants,
    render,
    snapshot_families,
)
from gpumon.gpu.model import (
    CLOCK_EVENT_REASONS,
    HEALTHY,
    DriverInfo,
    FastFields,
    GpuIdentity,
    GpuSample,
    HealthReason,
    HealthState,
    HealthVerdict,
    MemoryInfo,
    MigInstance,
    PodGpuUsage,
    PodRef,
    RecoveryAction,
    SlowFields,
    Snapshot,
)

GiB = 1024**3
MiB = 1024**2
NODE = "gpu-node-1"


def full_fast(**changes: object) -> FastFields:
    fast = FastFields(
        memory=MemoryInfo(
            total_bytes=80 * GiB, used_bytes=30 * GiB + 5, free_bytes=49 * GiB, reserved_bytes=GiB
        ),
        utilization_ratio=0.42,
        memory_utilization_ratio=0.25,
        temperature_gpu_celsius=61.0,
        temperature_memory_celsius=70.0,
        power_watts=312.5,
        power_limit_watts=400.0,
        energy_joules=123456.789,
        sm_clock_hertz=1410e6,
        memory_clock_hertz=1593e6,
        throttle_reasons=frozenset({"sw_power_cap", "hw_thermal"}),
    )
    return replace(fast, **changes)  # type: ignore[arg-type]


def full_slow(**changes: object) -> SlowFields:
    slow = SlowFields(
        pcie_replays=3,
        ecc_corrected=7,
        ecc_uncorrected=1,
        remapped_rows_correctable=2,
        remapped_rows_uncorrectable=1,
        row_remap_pending=True,
        row_remap_failure=False,
        nvlink_data_bytes={"tx": 3 * 1024, "rx": 5 * 1024},
        nvlink_data_bytes_per_second=2_048_000 * 1024 + 512,
        nvlink_errors={(0, "replay"): 2, (0, "crc"): 0, (17, "recovery"): 1},
        recovery_action=RecoveryAction.DRAIN_AND_RESET,
    )
    return replace(slow, **changes)  # type: ignore[arg-type]


def gpu(
    index: int = 0,
    *,
    fast: FastFields | None = None,
    slow: SlowFields | None = None,
    health: HealthVerdict = HEALTHY,
    xids: dict[int, int] | None = None,
    last_xid: int | None = None,
    lost: bool = False,
) -> GpuSample:
    return GpuSample(
        identity=GpuIdentity(
            index,
            f"GPU-{index:08x}-1111-2222-3333-444444444444",
            "NVIDIA A100-SXM4-80GB",
            f"00000000:{0x10 + index:02X}:00.0",
        ),
        fast=full_fast() if fast is None else fast,
        slow=full_slow() if slow is None else slow,
        health=health,
        sampled_at=99.0,
        xid_counts=xids or {},
        lost=lost,
        last_xid=last_xid,
    )


def pod(
    name: str, gpu_index: int = 0, *, namespace: str = "team-a", container: str = "main", **fields: object
) -> PodGpuUsage:
    return PodGpuUsage(
        PodRef(namespace, name, container),
        gpu_index,
        f"GPU-{gpu_index:08x}-1111-2222-3333-444444444444",
        **fields,
    )  # type: ignore[arg-type]


DRIVER = DriverInfo("550.54.15", "12.4")
MIG_A = MigInstance(1, 0, "1g.10gb", "MIG-aaaa")


def snapshot(
    gpus: Sequence[GpuSample] = (), pods: Sequence[PodGpuUsage] = (), driver: DriverInfo | None = DRIVER
) -> Snapshot:
    return Snapshot(
        node=NODE,
        driver=driver,
        gpus=tuple(gpus) or (gpu(),),
        pods=tuple(pods),
        taken_at=1700000000.5,
        backend_up=True,
        complete=True,
    )


Series = dict[str, list[tuple[dict[str, str], float]]]


def series(text: bytes) -> Series:
    """Sample name -> [(labels, value)], from the 0.0.4 text format."""
    out: Series = {}
    for family in parse_text(text.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def families_of(snap: Snapshot, profile: Profile) -> dict[str, Metric]:
    """Family name -> parsed family (type and unit), from OpenMetrics."""
    return {f.name: f for f in parse_openmetrics(render(snap, profile=profile).openmetrics.decode())}


def value(s: Series, name: str, **labels: str) -> float:
    matches = [v for lab, v in s[name] if all(lab.get(k) == want for k, want in labels.items())]
    assert len(matches) == 1, (name, labels, s.get(name))
    return matches[0]


# --- native profile -----------------------------------------------------------------------------

NATIVE_GPU_FAMILIES = {
    # family name (as parsed) -> (type, unit)
    "gpumon_gpu_info": ("gauge", ""),
    "gpumon_gpu_memory_total_bytes": ("gauge", "bytes"),
    "gpumon_gpu_memory_used_bytes": ("gauge", "bytes"),
    "gpumon_gpu_memory_free_bytes": ("gauge", "bytes"),
    "gpumon_gpu_memory_reserved_bytes": ("gauge", "bytes"),
    "gpumon_gpu_utilization_ratio": ("gauge", "ratio"),
    "gpumon_gpu_memory_utilization_ratio": ("gauge", "ratio"),
    "gpumon_gpu_temperature_celsius": ("gauge", "celsius"),
    "gpumon_gpu_power_watts": ("gauge", "watts"),
    "gpumon_gpu_power_limit_watts": ("gauge", "watts"),
    "gpumon_gpu_energy_joules": ("counter", "joules"),
    "gpumon_gpu_clock_hertz": ("gauge", "hertz"),
    "gpumon_gpu_throttled": ("gauge", ""),
    "gpumon_gpu_pcie_replays": ("counter", ""),
    "gpumon_gpu_ecc_errors": ("counter", ""),
    "gpumon_gpu_remapped_rows": ("gauge", ""),
    "gpumon_gpu_row_remap_pending": ("gauge", ""),
    "gpumon_gpu_row_remap_failure": ("gauge", ""),
    "gpumon_gpu_xid_errors": ("counter", ""),
    "gpumon_gpu_nvlink_data_bytes": ("counter", "bytes"),
    "gpumon_gpu_nvlink_errors": ("counter", ""),
    "gpumon_gpu_recovery_action": ("gauge", ""),
    "gpumon_gpu_health": ("gauge", ""),
    "gpumon_gpu_health_info": ("gauge", ""),
}
NATIVE_POD_FAMILIES = {
    "gpumon_pod_gpu_memory_used_bytes": ("gauge", "bytes"),
    "gpumon_pod_gpu_utilization_ratio": ("gauge", "ratio"),
    "gpumon_pod_gpu_memory_allocated_bytes": ("gauge", "bytes"),
    "gpumon_pod_gpu_core_allocated_ratio": ("gauge", "ratio"),
    "gpumon_pod_gpu_allocated": ("gauge", ""),
    "gpumon_pod_gpu_unallocated_use": ("gauge", ""),
}


def test_native_families_types_and_units() -> None:
    snap = snapshot(
        [gpu(xids={13: 2})],
        [
            pod(
                "p",
                used_memory_bytes=GiB,
                utilization_ratio=0.1,
                allocated_memory_bytes=2 * GiB,
                allocated_core_ratio=0.5,
                allocated_resources=("nvidia.com/gpu",),
            ),
            pod("q", unallocated=True),
        ],
    )
    fams = families_of(snap, "native")
    assert {n: (f.type, f.unit) for n, f in fams.items()} == NATIVE_GPU_FAMILIES | NATIVE_POD_FAMILIES


def test_native_values_in_base_units() -> None:
    s = series(render(snapshot([gpu(xids={79: 1, 13: 4})]), profile="native").text)
    ids = {"node": NODE, "gpu": "0", "uuid": "GPU-00000000-1111-2222-3333-444444444444"}
    assert value(s, "gpumon_gpu_memory_total_bytes", **ids) == 80 * GiB
    assert value(s, "gpumon_gpu_memory_used_bytes", **ids) == 30 * GiB + 5
    assert value(s, "gpumon_gpu_memory_free_bytes", **ids) == 49 * GiB
    assert value(s, "gpumon_gpu_memory_reserved_bytes", **ids) == GiB
    assert value(s, "gpumon_gpu_utilization_ratio", **ids) == 0.42
    assert value(s, "gpumon_gpu_memory_utilization_ratio", **ids) == 0.25
    assert value(s, "gpumon_gpu_temperature_celsius", sensor="gpu", **ids) == 61
    assert value(s, "gpumon_gpu_temperature_celsius", sensor="memory", **ids) == 70
    assert value(s, "gpumon_gpu_power_watts", **ids) == 312.5
    assert value(s, "gpumon_gpu_power_limit_watts", **ids) == 400
    assert value(s, "gpumon_gpu_energy_joules_total", **ids) == 123456.789
    assert value(s, "gpumon_gpu_clock_hertz", clock="sm", **ids) == 1410e6
    assert value(s, "gpumon_gpu_clock_hertz", clock="memory", **ids) == 1593e6
    assert value(s, "gpumon_gpu_pcie_replays_total", **ids) == 3
    assert value(s, "gpumon_gpu_ecc_errors_total", type="corrected", **ids) == 7
    assert value(s, "gpumon_gpu_ecc_errors_total", type="uncorrected", **ids) == 1
    assert value(s, "gpumon_gpu_remapped_rows", type="correctable", **ids) == 2
    assert value(s, "gpumon_gpu_remapped_rows", type="uncorrectable", **ids) == 1
    assert value(s, "gpumon_gpu_row_remap_pending", **ids) == 1
    assert value(s, "gpumon_gpu_row_remap_failure", **ids) == 0
    assert {lab["xid"]: v for lab, v in s["gpumon_gpu_xid_errors_total"]} == {"13": 4, "79": 1}
    assert value(s, "gpumon_gpu_nvlink_data_bytes_total", direction="tx", **ids) == 3 * 1024
    assert value(s, "gpumon_gpu_nvlink_data_bytes_total", direction="rx", **ids) == 5 * 1024
    errors = {(lab["link"], lab["type"]): v for lab, v in s["gpumon_gpu_nvlink_errors_total"]}
    assert errors == {("0", "replay"): 2, ("0", "crc"): 0, ("17", "recovery"): 1}
    actions = {lab["action"]: v for lab, v in s["gpumon_gpu_recovery_action"]}
    assert actions == {a.label: float(a is RecoveryAction.DRAIN_AND_RESET) for a in RecoveryAction}, "one-hot"


def test_native_info_labels() -> None:
    s = series(render(snapshot([gpu(3)]), profile="native").text)
    assert s["gpumon_gpu_info"] == [
        (
            {
                "node": NODE,
                "gpu": "3",
                "uuid": "GPU-00000003-1111-2222-3333-444444444444",
                "model": "NVIDIA A100-SXM4-80GB",
                "pci_bus_id": "00000000:13:00.0",
                "driver_version": "550.54.15",
                "cuda_version": "12.4",
            },
            1.0,
        )
    ]
    for name, rows in s.items():
        if name.startswith("gpumon_gpu_"):
            assert all({"node", "gpu", "uuid"} <= lab.keys() for lab, _ in rows), name


def test_throttled_lists_every_known_reason_and_unknown_active_ones() -> None:
    fast = full_fast(throttle_reasons=frozenset({"hw_slowdown", "vendor_new_reason"}))
    s = series(render(snapshot([gpu(fast=fast)]), profile="native").text)
    got = {lab["reason"]: v for lab, v in s["gpumon_gpu_throttled"]}
    assert got == {**dict.fromkeys(CLOCK_EVENT_REASONS, 0.0), "hw_slowdown": 1.0, "vendor_new_reason": 1.0}


@pytest.mark.parametrize("state", list(HealthState))
def test_health_is_one_hot(state: HealthState) -> None:
    verdict = HealthVerdict(state, () if state is HealthState.HEALTHY else (HealthReason("X", "why", state),))
    s = series(render(snapshot([gpu(health=verdict)]), profile="native").text)
    assert {lab["state"]: v for lab, v in s["gpumon_gpu_health"]} == {
        st.value: (1.0 if st is state else 0.0) for st in HealthState
    }


def test_health_info_has_one_series_per_reason_and_an_empty_one_when_healthy() -> None:
    verdict = HealthVerdict(
        HealthState.UNHEALTHY,
        (
            HealthReason("XidFatal", "Xid 79", HealthState.UNHEALTHY),
            HealthReason("RowRemapPending", "row remap pending: reset the GPU", HealthState.DEGRADED),
        ),
    )
    s = series(render(snapshot([gpu(0, health=verdict), gpu(1)]), profile="native").text)
    got = {(lab["gpu"], lab["reason"], lab["detail"]) for lab, v in s["gpumon_gpu_health_info"] if v == 1}
    assert got == {
        ("0", "XidFatal", "Xid 79"),
        ("0", "RowRemapPending", "row remap pending: reset the GPU"),
        ("1", "", ""),
    }


def test_absent_fields_produce_no_series() -> None:
    bare = gpu(fast=FastFields(memory=MemoryInfo(GiB, 0, GiB)), slow=SlowFields())
    fams = families_of(snapshot([bare]), "native")
    assert set(fams) == {
        "gpumon_gpu_info",
        "gpumon_gpu_memory_total_bytes",
        "gpumon_gpu_memory_used_bytes",
        "gpumon_gpu_memory_free_bytes",
        "gpumon_gpu_health",
        "gpumon_gpu_health_info",
    }


def test_gpu_without_any_sample_keeps_identity_and_health() -> None:
    unread = replace(gpu(), fast=None, slow=None)
    assert set(families_of(snapshot([unread]), "native")) == {
        "gpumon_gpu_info",
        "gpumon_gpu_health",
        "gpumon_gpu_health_info",
    }
    assert set(families_of(snapshot([unread]), "dcgm")) == {"DCGM_FI_DEV_XID_ERRORS"}


def test_lost_gpu_keeps_identity_health_and_xids_only() -> None:
    """A lost GPU can give no readings, but its identity, its health and the Xids it raised
    (79: fallen off the bus, the event that explains the loss) stay true of it."""
    lost_verdict = HealthVerdict(HealthState.LOST, (HealthReason("GpuLost", "gone", HealthState.LOST),))
    lost = gpu(1, health=lost_verdict, lost=True, xids={79: 1, 13: 2}, last_xid=79)
    snap = snapshot([gpu(0, xids={13: 1}), lost])
    s = series(render(snap, profile="native").text)
    kept = ("gpumon_gpu_info", "gpumon_gpu_health", "gpumon_gpu_health_info", "gpumon_gpu_xid_errors_total")
    for name, rows in s.items():
        gpus = {lab.get("gpu") for lab, _ in rows}
        if name in kept:
            assert gpus == {"0", "1"}, name
        else:
            assert "1" not in gpus, name
    assert value(s, "gpumon_gpu_health", gpu="1", state="lost") == 1
    lost_xids = {lab["xid"]: v for lab, v in s["gpumon_gpu_xid_errors_total"] if lab["gpu"] == "1"}
    assert lost_xids == {"79": 1, "13": 2}
    # dcgm has no health family; the last Xid is what its users alert on.
    d = series(render(snap, profile="dcgm").text)
    assert {name for name, rows in d.items() if any(lab["gpu"] == "1" for lab, _ in rows)} == {
        "DCGM_FI_DEV_XID_ERRORS"
    }
    assert value(d, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 79


def test_mig_instances_join_the_memory_families_with_instance_labels() -> None:
    migs = (
        MigInstance(1, 0, "3g.40gb", "MIG-aaaa", MemoryInfo(40 * GiB, 10 * GiB, 30 * GiB)),
        MigInstance(2, 0, "3g.40gb", "MIG-bbbb", None),
    )
    s = series(render(snapshot([gpu(slow=full_slow(mig_instances=migs))]), profile="native").text)
    rows = [lab for lab, _ in s["gpumon_gpu_memory_used_bytes"] if "gpu_instance" in lab]
    assert rows == [
        {
            "node": NODE,
            "gpu": "0",
            "uuid": "GPU-00000000-1111-2222-3333-444444444444",
            "gpu_instance": "1",
            "compute_instance": "0",
            "mig_profile": "3g.40gb",
        }
    ]
    assert value(s, "gpumon_gpu_memory_total_bytes", gpu_instance="1") == 40 * GiB
    assert len(s["gpumon_gpu_memory_reserved_bytes"]) == 1  # the MIG instance reports none


def test_pod_series() -> None:
    pods = [
        pod(
            "trainer-0",
            0,
            used_memory_bytes=3 * GiB,
            utilization_ratio=0.3,
            allocated_resources=("nvidia.com/gpu",),
        ),
        pod(
            "shared-1",
            1,
            namespace="team-b",
            container="c",
            allocated_memory_bytes=4 * GiB,
            allocated_core_ratio=0.25,
        ),
        pod("stowaway", 1, namespace="team-b", used_memory_bytes=GiB, unallocated=True),
    ]
    s = series(render(snapshot([gpu(0), gpu(1)], pods), profile="native").text)
    trainer = {
        "node": NODE,
        "namespace": "team-a",
        "pod": "trainer-0",
        "container": "main",
        "gpu": "0",
        "uuid": "GPU-00000000-1111-2222-3333-444444444444",
    }
    assert s["gpumon_pod_gpu_memory_used_bytes"][0] == (trainer, 3 * GiB)
    assert s["gpumon_pod_gpu_utilization_ratio"] == [(trainer, 0.3)]
    assert s["gpumon_pod_gpu_allocated"] == [({**trainer, "resource": "nvidia.com/gpu"}, 1)]
    shared = {
        **trainer,
        "namespace": "team-b",
        "pod": "shared-1",
        "container": "c",
        "gpu": "1",
        "uuid": "GPU-00000001-1111-2222-3333-444444444444",
    }
    assert s["gpumon_pod_gpu_memory_allocated_bytes"] == [(shared, 4 * GiB)]
    assert s["gpumon_pod_gpu_core_allocated_ratio"] == [(shared, 0.25)]
    stowaway = {**shared, "pod": "stowaway", "container": "main"}
    assert (stowaway, GiB) in s["gpumon_pod_gpu_memory_used_bytes"]
    assert s["gpumon_pod_gpu_unallocated_use"] == [(stowaway, 1)]


ODD_NAMES = ['quote"d', "back\\slash", "new\nline", "ünïcødé-ポッド", 'all\\"\n\\n"', "trailing\\"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_odd_label_values_round_trip_in_both_formats(name: str) -> None:
    snap = snapshot([gpu()], [pod(name, namespace=name, container=name, used_memory_bytes=1)])
    out = render(snap, profile="both")
    for parse, data in ((parse_text, out.text), (parse_openmetrics, out.openmetrics)):
        fam = next(f for f in parse(data.decode()) if f.name == "gpumon_pod_gpu_memory_used_bytes")
        assert [(s.labels["pod"], s.labels["namespace"], s.labels["container"]) for s in fam.samples] == [
            (name, name, name)
        ]
        dcgm = next(f for f in parse(data.decode()) if f.name == "DCGM_FI_DEV_GPU_TEMP")
        assert dcgm.samples[0].labels["pod"] == name


# --- dcgm profile -------------------------------------------------------------------------------

DCGM_FAMILIES = {
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": "gauge",
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "gauge",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "unknown",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "unknown",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "gauge",
    "DCGM_FI_DEV_FB_TOTAL": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_RESERVED": "gauge",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "unknown",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "unknown",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "unknown",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "unknown",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "unknown",
}


def test_dcgm_families_and_types() -> None:
    fams = families_of(snapshot([gpu()]), "dcgm")
    assert {n: f.type for n, f in fams.items()} == DCGM_FAMILIES
    text_types = {f.name: f.type for f in parse_text(render(snapshot(), profile="dcgm").text.decode())}
    assert text_types == DCGM_FAMILIES  # "untyped" in the text format parses back as "unknown"


def test_dcgm_units_and_values() -> None:
    s = series(render(snapshot([gpu(xids={13: 2, 79: 1}, last_xid=79)]), profile="dcgm").text)
    v = {name: rows[0][1] for name, rows in s.items()}
    assert v["DCGM_FI_DEV_SM_CLOCK"] == pytest.approx(1410)
    assert v["DCGM_FI_DEV_MEM_CLOCK"] == pytest.approx(1593)
    assert v["DCGM_FI_DEV_GPU_TEMP"] == 61
    assert v["DCGM_FI_DEV_MEMORY_TEMP"] == 70
    assert v["DCGM_FI_DEV_POWER_USAGE"] == 312.5
    assert v["DCGM_FI_DEV_POWER_MGMT_LIMIT"] == 400
    assert v["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == pytest.approx(123456789)
    assert v["DCGM_FI_DEV_GPU_UTIL"] == pytest.approx(42)
    assert v["DCGM_FI_DEV_MEM_COPY_UTIL"] == pytest.approx(25)
    assert v["DCGM_FI_DEV_FB_TOTAL"] == 81920
    assert v["DCGM_FI_DEV_FB_USED"] == 30 * 1024  # whole MiB, as dcgm reports
    assert v["DCGM_FI_DEV_FB_FREE"] == 49 * 1024
    assert v["DCGM_FI_DEV_FB_RESERVED"] == 1024
    assert v["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == 3
    assert v["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == 7
    assert v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 1
    assert v["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 2
    assert v["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] == 1
    assert v["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 1
    assert v["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 0
    assert v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == CLOCK_EVENT_REASONS["sw_power_cap"] | 0x40
    assert v["DCGM_FI_DEV_XID_ERRORS"] == 79  # the last Xid, not a count
    assert v["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"] == 4  # NVML's number: drain and reset
    # DCGM's NVLink "bandwidth": KiB per second, TX and RX together, / 1000, truncated.
    assert v["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == 2048


def test_dcgm_xid_is_zero_before_any_xid() -> None:
    s = series(render(snapshot([gpu()]), profile="dcgm").text)
    assert s["DCGM_FI_DEV_XID_ERRORS"][0][1] == 0


def test_dcgm_labels() -> None:
    s = series(render(snapshot([gpu(2)]), profile="dcgm").text)
    expected = {
        "gpu": "2",
        "UUID": "GPU-00000002-1111-2222-3333-444444444444",
        "pci_bus_id": "00000000:12:00.0",
        "device": "nvidia2",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": NODE,
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }
    for name, rows in s.items():
        assert [lab for lab, _ in rows] == [expected], name


def test_dcgm_pod_labels_on_a_device_one_container_uses_and_none_on_a_shared_one() -> None:
    pods = [
        pod("solo", 0, used_memory_bytes=GiB),
        pod("a", 1, used_memory_bytes=GiB),
        pod("b", 1, used_memory_bytes=GiB),
    ]
    s = series(render(snapshot([gpu(0), gpu(1), gpu(2)], pods), profile="dcgm").text)
    for name, rows in s.items():
        by_gpu = {lab["gpu"]: lab for lab, _ in rows}
        assert len(rows) == 3, name  # one series per GPU, never fanned out per pod
        assert {k: by_gpu["0"][k] for k in ("pod", "namespace", "container")} == {
            "pod": "solo",
            "namespace": "team-a",
            "container": "main",
        }, name
        assert "pod" not in by_gpu["1"] and "pod" not in by_gpu["2"], name


def test_dcgm_mig_instances() -> None:
    # The pod holds MIG instance 1 of GPU 0, as the attributor reports it: the card's UUID, the
    # MIG device beside it. dcgm-exporter puts the pod on that instance's series (UUID stays the
    # card's, GPU_I_ID names the instance), not on the card's.
    migs = (
        MigInstance(1, 0, "1g.10gb", "MIG-aaaa", MemoryInfo(10 * GiB, 2 * GiB, 8 * GiB)),
        MigInstance(2, 0, "1g.10gb", "MIG-bbbb", MemoryInfo(10 * GiB, 1 * GiB, 9 * GiB)),
    )
    snap = snapshot([gpu(slow=full_slow(mig_instances=migs))], [pod("m", used_memory_bytes=GiB, mig=MIG_A)])
    s = series(render(snap, profile="dcgm").text)
    mig_rows = [(lab, v) for lab, v in s["DCGM_FI_DEV_FB_USED"] if lab.get("GPU_I_ID") == "1"]
    assert mig_rows == [
        (
            {
                "gpu": "0",
                "UUID": "GPU-00000000-1111-2222-3333-444444444444",
                "pci_bus_id": "00000000:10:00.0",
                "device": "nvidia0",
                "modelName": "NVIDIA A100-SXM4-80GB",
                "GPU_I_PROFILE": "1g.10gb",
                "GPU_I_ID": "1",
                "Hostname": NODE,
                "DCGM_FI_DRIVER_VERSION": "550.54.15",
                "pod": "m",
                "namespace": "team-a",
                "container": "main",
            },
            2048.0,
        )
    ]
    other = [lab for lab, _ in s["DCGM_FI_DEV_FB_USED"] if lab.get("GPU_I_ID") != "1"]
    assert len(other) == 2 and all("pod" not in lab for lab in other)  # the card and instance 2


def test_native_pod_series_of_a_mig_device() -> None:
    snap = snapshot(
        [gpu()], [pod("m", used_memory_bytes=GiB, allocated_resources=("nvidia.com/mig-1g.10gb",), mig=MIG_A)]
    )
    s = series(render(snap, profile="native").text)
    want = {
        "node": NODE,
        "namespace": "team-a",
        "pod": "m",
        "container": "main",
        "gpu": "0",
        "uuid": "MIG-aaaa",
        "gpu_instance": "1",
        "compute_instance": "0",
        "mig_profile": "1g.10gb",
    }
    assert s["gpumon_pod_gpu_memory_used_bytes"] == [(want, GiB)]
    assert s["gpumon_pod_gpu_allocated"] == [(want | {"resource": "nvidia.com/mig-1g.10gb"}, 1)]


def test_unknown_driver_leaves_the_version_labels_empty() -> None:
    snap = snapshot([gpu()], driver=None)
    assert series(render(snap, profile="native").text)["gpumon_gpu_info"][0][0]["driver_version"] == ""
    assert all(
        "DCGM_FI_DRIVER_VERSION" not in lab
        for rows in series(render(snap, profile="dcgm").text).values()
        for lab, _ in rows
    )


# --- both, formats, extras ----------------------------------------------------------------------


def test_both_is_native_plus_dcgm_with_each_family_declared_once() -> None:
    snap = snapshot([gpu(0), gpu(1)], [pod("p", used_memory_bytes=1)])
    out = render(snap, profile="both")
    assert series(out.text) == series(render(snap, profile="native").text) | series(
        render(snap, profile="dcgm").text
    )
    for data in (out.text, out.openmetrics):
        declared = [line.split()[2] for line in data.decode().splitlines() if line.startswith("# TYPE ")]
        assert len(declared) == len(set(declared))
    assert out.openmetrics.endswith(b"# EOF\n") and out.openmetrics.count(b"# EOF") == 1


def self_metrics() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("gpumon_exporter_errors", "Errors.", ["source", "kind"], registry=registry).labels(
        "nvml", "timeout"
    ).inc()
    Histogram("gpumon_exporter_sample_duration_seconds", "Sample time.", registry=registry).observe(0.01)
    return registry


def exporter_self_metrics() -> CollectorRegistry:
    """The real self-metrics, plus one family the writer hands to the library (a timestamp)."""
    registry = self_metrics_in_use()
    stamped = GaugeMetricFamily("gpumon_test_stamped", "With a timestamp.", labels=["a"])
    stamped.add_metric(["x"], 2.5, timestamp=1_763_900_000.5)
    registry.register(_Families([stamped]))
    return registry


class _Families:
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


SNAPSHOTS = {
    "full": snapshot(
        [gpu(i, xids={13: i + 1}, last_xid=13) for i in range(4)],
        [pod(f"p{i}", i % 4, used_memory_bytes=i * MiB, utilization_ratio=i / 64) for i in range(16)],
    ),
    "odd": snapshot([gpu()], [pod(n, namespace=n, used_memory_bytes=1) for n in ODD_NAMES]),
    "sparse": snapshot(
        [replace(gpu(0), fast=None), gpu(1, lost=True, xids={79: 1}, last_xid=79)], driver=None
    ),
}


@pytest.mark.parametrize("profile", ["native", "dcgm", "both"])
@pytest.mark.parametrize("name", SNAPSHOTS)
def test_output_is_byte_for_byte_what_prometheus_client_renders(name: str, profile: Profile) -> None:
    snap = SNAPSHOTS[name]
    extra: list[Collector] = [self_metrics(), exporter_self_metrics()]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(snapshot_families(snap, profile)))
    for collector in extra:
        registry.register(collector)
    out = render(snap, profile=profile, extra=extra)
    assert out.text == generate_latest(registry)
    assert out.openmetrics == om_exposition.generate_latest(registry)  # type: ignore[no-untyped-call]
    assert out.text_bytes == len(out.text)


def _ticks() -> list[Snapshot]:
    """Renders in a row as a node gives them: values change, pods come and go (one takes the
    place of another with new labels), odd label values, a GPU is lost, readings go missing."""
    full = SNAPSHOTS["full"]
    hotter = replace(
        full,
        gpus=tuple(
            replace(g, fast=full_fast(temperature_gpu_celsius=70.0 + g.identity.index, power_watts=-0.0))
            for g in full.gpus
        ),
    )
    churned = replace(
        hotter,
        pods=(
            *hotter.pods[1:],
            pod("p-new", 1, used_memory_bytes=3 * MiB, utilization_ratio=0.5),
        ),
    )
    swapped = replace(churned, pods=(pod("p-other", 0, used_memory_bytes=MiB), *churned.pods[1:]))
    # A fast-only tick: every fast field new, each GPU's slow reading the same object as before.
    fast_only = replace(swapped, gpus=tuple(replace(g, fast=_other_fast()) for g in swapped.gpus))
    # One GPU's slow reading is a new one; the others keep theirs.
    first, *rest = fast_only.gpus
    slow_read = replace(
        fast_only,
        gpus=(replace(first, slow=full_slow(ecc_corrected=8, nvlink_errors={(1, "crc"): 4})), *rest),
    )
    renamed = replace(slow_read, node="gpu-node-2")  # same readings, other labels
    return [
        full,
        full,
        hotter,
        churned,
        swapped,
        fast_only,
        slow_read,
        renamed,
        SNAPSHOTS["odd"],
        SNAPSHOTS["sparse"],
        full,
        hotter,
    ]


def _other_fast() -> FastFields:
    """Every fast field with another value than :func:`full_fast`'s."""
    return FastFields(
        memory=MemoryInfo(total_bytes=40 * GiB, used_bytes=GiB, free_bytes=38 * GiB, reserved_bytes=GiB + 1),
        utilization_ratio=0.5,
        memory_utilization_ratio=0.125,
        temperature_gpu_celsius=50.0,
        temperature_memory_celsius=55.0,
        power_watts=100.0,
        power_limit_watts=300.0,
        energy_joules=1.5,
        sm_clock_hertz=1e9,
        memory_clock_hertz=2e9,
        throttle_reasons=frozenset({"gpu_idle"}),
    )


@pytest.mark.parametrize("profile", ["native", "dcgm", "both"])
def test_renders_that_reuse_the_last_ones_lines_write_exactly_a_fresh_render(profile: Profile) -> None:
    lines = LineCache()
    registry = CollectorRegistry()
    duration = Histogram("gpumon_test_duration_seconds", "Changes every render.", registry=registry)
    extra: list[Collector] = [registry, self_metrics_in_use()]
    for i, snap in enumerate(_ticks()):
        duration.observe(0.2 * i)  # the self-metrics change between renders too
        reused = render(snap, profile=profile, extra=extra, lines=lines)
        fresh = render(snap, profile=profile, extra=extra)
        for variant in VARIANTS:
            assert reused.body(*variant) == fresh.body(*variant), (i, variant)
        assert reused.text_bytes == fresh.text_bytes
        families = [*snapshot_families(snap, profile), *(f for c in extra for f in c.collect())]
        assert len(lines) == len(families), "only the last render's families are kept"


@pytest.mark.parametrize("profile", ["native", "dcgm"])
def test_a_gpus_slow_samples_are_built_once_per_slow_reading(profile: Profile) -> None:
    lines = LineCache()
    nvlink = "gpumon_gpu_nvlink_errors" if profile == "native" else "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"

    def built(snap: Snapshot) -> list[Sample]:
        families = {f.name: f for f in snapshot_families(snap, profile, lines.slow)}
        lines.slow.rotate()
        return families[nvlink].samples

    first = SNAPSHOTS["full"]
    before = built(first)
    fast_only = replace(first, gpus=tuple(replace(g, fast=_other_fast()) for g in first.gpus))
    after = built(fast_only)
    assert after == before and all(a is b for a, b in zip(after, before, strict=True)), "reused"
    new_slow = replace(fast_only, gpus=tuple(replace(g, slow=full_slow()) for g in fast_only.gpus))
    again = built(new_slow)
    assert again == before and not any(a is b for a, b in zip(again, before, strict=True)), "built anew"


def test_a_family_whose_help_changes_is_written_again() -> None:
    lines = LineCache()

    def one(doc: str) -> bytes:
        family = GaugeMetricFamily("gpumon_test_gauge", doc, labels=["a"])
        family.add_metric(["x"], 1.0)
        return render(snapshot(), profile="native", extra=[_Families([family])], lines=lines).text

    assert b"# HELP gpumon_test_gauge first" in one("first")
    assert b"# HELP gpumon_test_gauge second" in one("second")


def test_extra_collectors_are_rendered_once_in_both_formats() -> None:
    out = render(snapshot(), profile="native", extra=[self_metrics()])
    for parse, data in ((parse_text, out.text), (parse_openmetrics, out.openmetrics)):
        names = [f.name for f in parse(data.decode())]
        assert names.count("gpumon_exporter_errors") == 1
        assert names.count("gpumon_exporter_sample_duration_seconds") == 1


def test_gzip_round_trip_and_timestamp() -> None:
    out = render(SNAPSHOTS["full"], profile="both")
    assert gzip.decompress(out.text_gzip) == out.text
    assert gzip.decompress(out.openmetrics_gzip) == out.openmetrics
    assert out.rendered_at == SNAPSHOTS["full"].taken_at
    again = render(SNAPSHOTS["full"], profile="both")
    for variant in VARIANTS:  # deterministic, gzip included
        assert again.body(*variant) == out.body(*variant)


def test_bodies_are_written_when_asked_for_once_each() -> None:
    out = render(SNAPSHOTS["odd"], profile="both", extra=[exporter_self_metrics()])
    assert out.written() == frozenset(), "nothing is written or compressed that nobody asked for"
    assert out.text_bytes == len(out.text)  # known before the text is written; non-ASCII values
    compressed = out.body("openmetrics", True)
    assert out.written() == {("text", False), ("openmetrics", False), ("openmetrics", True)}
    assert out.body("openmetrics", True) is compressed, "written once per payload"
    pre = render(SNAPSHOTS["odd"], profile="both", prerender=[("openmetrics", True)])
    assert pre.written() == {("openmetrics", False), ("openmetrics", True)}


def test_prerendered_variants_are_those_scraped_lately() -> None:
    asked: dict[Variant, float] = {("openmetrics", True): 1000.0, ("text", False): 600.0}
    assert prerender_variants(asked, now=1000.0, keep=300.0) == {("openmetrics", True)}
    assert prerender_variants(asked, now=900.0, keep=300.0) == {("openmetrics", True), ("text", False)}
    assert prerender_variants(asked, now=1301.0, keep=300.0) == frozenset()
    assert prerender_variants({}, now=0.0) == frozenset()


def test_content_types() -> None:
    assert CONTENT_TYPE_TEXT == "text/plain; version=0.0.4; charset=utf-8"
    assert CONTENT_TYPE_OPENMETRICS.startswith("application/openmetrics-text; version=1.0.0")
