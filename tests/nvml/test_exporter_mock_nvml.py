"""``gpumon exporter --backend nvml`` as a real process on NVIDIA's mock libnvidia-ml: every
shipped GPU profile scraped family by family against its YAML; then one node with processes
in pods, MIG devices and faults injected while it runs; then no library, or a broken one.

Faults are injected the mock's run-time way: ``MOCK_NVML_OVERRIDES`` names a YAML document
deep-merged over the profile, re-read every ``MOCK_NVML_OVERRIDES_TTL``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from fake_host_proc import write_process
from kubernetes_asyncio import client, config
from nvml_mock import (
    A100_MIG,
    PROFILES,
    REASON_NAMES,
    Exporter,
    MiB,
    Series,
    child_env,
    device_configs,
    load_profile,
    mig_block,
    running,
    select,
    value,
    with_device,
    write_profile,
)
from pod_objects import RunningPod, create_namespace, pod_manifest, run_pods
from podresources_server import FakeKubelet, pod_resources, serve, short_socket_dir

from gpumon.devcluster import nodes
from gpumon.devcluster.binaries import MockNvml
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodemaker import node_ready
from gpumon.devcluster.waiting import eventually
from gpumon.devices.nvml.convert import canonical_bus_id
from gpumon.gpu.model import CLOCK_EVENT_REASONS, RecoveryAction
from gpumon.kube.client import KubeClient
from gpumon.kube.kubeconfig import from_kubeconfig
from gpumon.wire import v1 as wire

NODE = "nvml-node"  # every exporter's --node-name (nvml_mock.Exporter)


def gpu_labels(series: Series, name: str, gpu: int) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of ``name`` for GPU ``gpu`` itself (not its MIG devices)."""
    return {ls: v for ls, v in select(series, name, gpu=str(gpu)).items() if "gpu_instance" not in dict(ls)}


def nvml_errors(series: Series) -> dict[tuple[str, str], float]:
    """NVML read failures; a field a GPU does not have is no failure (see not_supported)."""
    return {
        (dict(ls)["source"], dict(ls)["kind"]): v
        for ls, v in select(series, "gpumon_exporter_errors_total").items()
        if dict(ls)["source"].startswith("nvml.") and dict(ls)["kind"] != "not_supported"
    }


def not_supported(series: Series) -> dict[str, float]:
    """By field: how many GPUs lack it (counted once per field and GPU)."""
    return {
        dict(ls)["source"]: v
        for ls, v in select(series, "gpumon_exporter_errors_total", kind="not_supported").items()
    }


# -- every shipped profile ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profile_exporters(
    mock: MockNvml, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Exporter]]:
    """One exporter per shipped profile, started together so that their start-ups overlap."""
    tmp = tmp_path_factory.mktemp("profiles")
    exporters = {
        name: Exporter(
            # No overrides file: the profile exactly as shipped.
            child_env(mock, mock.profile(name), overrides=tmp / "none.yaml", GPUMON_PODS__ENABLED="false"),
            tmp / f"{name}.log",
            "--metrics-profile",
            "both",
        )
        for name in PROFILES
    }
    with running(*exporters.values()):
        yield exporters


def complete(series: Series, gpus: int) -> bool:
    """Every GPU has both its fast and its slow fields."""
    return all(
        gpu_labels(series, "gpumon_gpu_memory_total_bytes", i)
        and gpu_labels(series, "gpumon_gpu_row_remap_failure", i)
        for i in range(gpus)
    )


@pytest.mark.parametrize("name", PROFILES)
def test_profile_scraped_family_by_family(
    name: str, mock: MockNvml, profile_exporters: dict[str, Exporter]
) -> None:
    profile = load_profile(mock, name)
    system = profile["system"]
    configs = device_configs(profile)
    s = profile_exporters[name].until(lambda s: complete(s, len(configs)), f"{name}: every GPU read")

    assert value(s, "gpumon_exporter_nvml_up") == 1
    assert nvml_errors(s) == {}  # not one field error on a healthy profile
    # Fault injection is the simulator's: an exporter reading GPUs through NVML has no such route.
    assert profile_exporters[name].get("/api/v1/faults")[0] == 404
    assert [dict(ls)["gpu"] for ls in select(s, "gpumon_gpu_info")] == [str(i) for i in range(len(configs))]
    for i, cfg in enumerate(configs):
        gpu, uuid = str(i), cfg["uuid"]
        base = {"node": NODE, "gpu": gpu, "uuid": uuid}
        info = {**base, "model": cfg["name"], "pci_bus_id": canonical_bus_id(cfg["pci"]["bus_id"]),
                "driver_version": system["driver_version"],
                "cuda_version": f"{system['cuda_version_major']}.{system['cuda_version_minor']}"}  # fmt: skip
        assert gpu_labels(s, "gpumon_gpu_info", i) == {frozenset(info.items()): 1}

        def native(family: str, gpu: str = gpu, **labels: str) -> float | None:
            return value(s, family, gpu=gpu, **labels)

        memory, power, thermal, clocks = cfg["memory"], cfg["power"], cfg["thermal"], cfg["clocks"]
        assert native("gpumon_gpu_memory_total_bytes") == memory["total_bytes"]
        assert native("gpumon_gpu_memory_used_bytes") == memory["used_bytes"]
        assert native("gpumon_gpu_memory_free_bytes") == memory["free_bytes"]
        assert native("gpumon_gpu_memory_reserved_bytes") == memory["reserved_bytes"]
        assert native("gpumon_gpu_utilization_ratio") == cfg["utilization"]["gpu"] / 100
        assert native("gpumon_gpu_memory_utilization_ratio") == cfg["utilization"]["memory"] / 100
        assert native("gpumon_gpu_temperature_celsius", sensor="gpu") == thermal["temperature_gpu_c"]
        assert native("gpumon_gpu_temperature_celsius", sensor="memory") == thermal["temperature_memory_c"]
        assert native("gpumon_gpu_power_watts") == power["current_draw_mw"] / 1000
        assert native("gpumon_gpu_power_limit_watts") == power["enforced_limit_mw"] / 1000
        assert native("gpumon_gpu_energy_joules_total") == power.get("total_energy_consumption_mj", 0) / 1000
        assert native("gpumon_gpu_clock_hertz", clock="sm") == clocks["sm_current"] * 1e6
        assert native("gpumon_gpu_clock_hertz", clock="memory") == clocks["memory_current"] * 1e6
        active = {REASON_NAMES[k] for k, on in cfg["clocks_throttle_reasons"].items() if on}
        assert {dict(ls)["reason"]: v for ls, v in gpu_labels(s, "gpumon_gpu_throttled", i).items()} == {
            reason: float(reason in active) for reason in CLOCK_EVENT_REASONS
        }
        volatile = cfg["ecc"]["errors"]["volatile"]
        assert native("gpumon_gpu_ecc_errors_total", type="corrected") == volatile["single_bit"]["total"]
        assert native("gpumon_gpu_ecc_errors_total", type="uncorrected") == volatile["double_bit"]["total"]
        rows = cfg["remapped_rows"]
        assert native("gpumon_gpu_remapped_rows", type="correctable") == rows["correctable"]
        assert native("gpumon_gpu_remapped_rows", type="uncorrectable") == rows["uncorrectable"]
        assert native("gpumon_gpu_row_remap_pending") == rows["pending"]
        assert native("gpumon_gpu_row_remap_failure") == rows["failure_occurred"]
        assert native("gpumon_gpu_pcie_replays_total") == 0  # the mock's answer, whatever the profile says
        assert native("gpumon_gpu_health", state="healthy") == 1
        assert gpu_labels(s, "gpumon_gpu_xid_errors_total", i) == {}

        # The same readings under dcgm-exporter's names and units.
        assert value(s, "DCGM_FI_DEV_FB_USED", gpu=gpu, UUID=uuid, modelName=cfg["name"]) == (
            memory["used_bytes"] // MiB
        )
        assert value(s, "DCGM_FI_DEV_GPU_TEMP", gpu=gpu) == thermal["temperature_gpu_c"]
        assert value(s, "DCGM_FI_DEV_POWER_USAGE", gpu=gpu) == power["current_draw_mw"] / 1000
        assert value(s, "DCGM_FI_DEV_SM_CLOCK", gpu=gpu) == clocks["sm_current"]
        assert value(s, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu=gpu) == sum(
            CLOCK_EVENT_REASONS[r] for r in active
        )
        assert value(s, "DCGM_FI_DEV_XID_ERRORS", gpu=gpu) == 0


# -- GPM profiling and the rest of dcgm-exporter's default counters -------------------------------

GPM_PROFILES = ("h100", "b200", "gb200")
# GPU 0 of each profile is busy; the mock derives every GPM activity from its utilization and
# scales each pipe by a fixed ratio (engine/gpm.go: SM occupancy 0.75, any tensor 0.50, FP64
# 0.05, FP32 0.25, FP16 0.35), PCIe from the full-load rate of 2048 MiB/s in each direction.
BUSY = {"gpu": 80, "memory": 40}


@pytest.fixture(scope="module")
def gpm_exporters(mock: MockNvml, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Exporter]]:
    tmp = tmp_path_factory.mktemp("gpm")
    exporters = {}
    # The shipped profile, GPU 0 made busy by the mock's run-time overrides (deep-merged).
    busy = tmp / "busy.yaml"
    busy.write_text(yaml.safe_dump({"version": 1, "devices": {"0": {"utilization": BUSY}}}))
    for name in (*GPM_PROFILES, "t4"):
        env = child_env(mock, mock.profile(name), overrides=busy, GPUMON_PODS__ENABLED="false")
        exporters[name] = Exporter(env, tmp / f"{name}.log", "--metrics-profile", "both")
    with running(*exporters.values()):
        yield exporters


@pytest.mark.parametrize("name", GPM_PROFILES)
def test_gpm_series_follow_the_profile(name: str, mock: MockNvml, gpm_exporters: dict[str, Exporter]) -> None:
    """Every GPU of a Hopper or Blackwell profile gets the GPM families, with the values the
    profile's utilization implies, in both profiles; no read fails."""
    gpus = len(device_configs(load_profile(mock, name)))
    s = gpm_exporters[name].until(
        lambda s: len(select(s, "gpumon_gpu_sm_active_ratio")) == gpus, f"{name}: GPM on every GPU"
    )
    assert nvml_errors(s) == {}
    assert "nvml.gpm" not in not_supported(s)

    def native(family: str, gpu: int = 0, **labels: str) -> float | None:
        return value(s, family, gpu=str(gpu), **labels)

    expected = {
        ("gpumon_gpu_graphics_engine_active_ratio", ()): 0.80,
        ("gpumon_gpu_sm_active_ratio", ()): 0.80,
        ("gpumon_gpu_sm_occupancy_ratio", ()): 0.60,
        ("gpumon_gpu_pipe_active_ratio", ("pipe", "tensor")): 0.40,
        ("gpumon_gpu_pipe_active_ratio", ("pipe", "fp64")): 0.04,
        ("gpumon_gpu_pipe_active_ratio", ("pipe", "fp32")): 0.20,
        ("gpumon_gpu_pipe_active_ratio", ("pipe", "fp16")): 0.28,
        ("gpumon_gpu_dram_active_ratio", ()): 0.40,
        ("gpumon_gpu_pcie_bytes_per_second", ("direction", "tx")): 0.8 * 2048 * MiB,
        ("gpumon_gpu_pcie_bytes_per_second", ("direction", "rx")): 0.8 * 2048 * MiB,
    }
    for (family, label), want in expected.items():
        labels = dict([label]) if label else {}
        assert native(family, **labels) == pytest.approx(want), family
        # An idle GPU of the same profile: the same series, at 0.
        assert native(family, gpu=1, **labels) == 0, family
    # NVLink traffic is the rate of the mock's fabric counters over the interval, both ways
    # alike; they run on links to NVSwitches, which the standalone B200 board has none of.
    tx = native("gpumon_gpu_nvlink_bytes_per_second", direction="tx")
    switched = bool(load_profile(mock, name)["nvlink"].get("switches"))
    assert tx is not None and (tx > 0) == switched, (tx, switched)
    assert native("gpumon_gpu_nvlink_bytes_per_second", direction="rx") == tx
    # The mock answers 0 for both video engines, whatever the profile says (engine/device.go).
    assert native("gpumon_gpu_video_utilization_ratio", engine="encoder") == 0
    assert native("gpumon_gpu_video_utilization_ratio", engine="decoder") == 0

    # dcgm-exporter's names and units: activity as a 0-1 ratio, traffic in bytes per second.
    dcgm = {"gpu": "0", "modelName": device_configs(load_profile(mock, name))[0]["name"]}
    assert value(s, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", **dcgm) == pytest.approx(0.40)
    assert value(s, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", **dcgm) == pytest.approx(0.80)
    assert value(s, "DCGM_FI_PROF_DRAM_ACTIVE", **dcgm) == pytest.approx(0.40)
    assert value(s, "DCGM_FI_PROF_PCIE_TX_BYTES", **dcgm) == pytest.approx(0.8 * 2048 * MiB)
    assert value(s, "DCGM_FI_PROF_NVLINK_TX_BYTES", **dcgm) is not None
    assert value(s, "DCGM_FI_DEV_ENC_UTIL", **dcgm) == 0
    assert value(s, "DCGM_FI_DEV_DEC_UTIL", **dcgm) == 0
    assert len(select(s, "DCGM_FI_PROF_SM_OCCUPANCY")) == gpus


def test_no_gpm_on_a_t4_and_no_error_for_it(mock: MockNvml, gpm_exporters: dict[str, Exporter]) -> None:
    """Turing has no GPM: no profiling series at all, not zeros; the GPM support answer is
    counted once per GPU as not_supported, not as a failure, however many ticks pass."""
    gpus = len(device_configs(load_profile(mock, "t4")))
    exporter = gpm_exporters["t4"]
    s = exporter.until(lambda s: not_supported(s).get("nvml.gpm") == gpus, "T4: GPM not supported, counted")
    # Several slow ticks later the count has not grown.
    s = after_slow_ticks(exporter, s, 3)
    assert not_supported(s)["nvml.gpm"] == gpus
    assert nvml_errors(s) == {}
    profiling = {n for (n, _) in s if n.startswith("DCGM_FI_PROF_") or n in GPM_NATIVE}
    assert profiling == set()
    # The rest is read as on any GPU.
    assert value(s, "gpumon_gpu_video_utilization_ratio", gpu="0", engine="encoder") == 0
    assert "GPM" not in exporter.log_text() and "gpm" not in exporter.log_text()


# The mock accrues each active link's THROUGHPUT_DATA counters at 5 % of the profile's
# bandwidth_per_link_mbps (MB/s) per second (engine/topology.go, DefaultNVLinkDutyCycle). Its links
# are the ones to NVSwitches: the standalone B200 board has no active link (LINK_COUNT 0).
NVLINK_DUTY_CYCLE = 0.05


@pytest.mark.parametrize("name", ["h100", "gb200"])
def test_nvlink_field_values_per_link(name: str, mock: MockNvml, gpm_exporters: dict[str, Exporter]) -> None:
    """NVLink data and error counters from nvmlDeviceGetFieldValues, one scopeId per link: both
    directions summed over the links (KiB x 1024) as counters, the three error counters per link,
    and DCGM's NVLINK_BANDWIDTH_TOTAL (TX+RX KiB per second / 1000) in the dcgm profile."""
    profile = load_profile(mock, name)
    gpus, nvlink = len(device_configs(profile)), profile["nvlink"]
    links = nvlink["links_per_gpu"]
    exporter = gpm_exporters[name]
    s = exporter.until(
        lambda s: len(select(s, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")) == gpus,
        f"{name}: NVLink rate on every GPU",
    )
    assert nvml_errors(s) == {}
    assert not any(source.startswith("nvml.nvlink") for source in not_supported(s))
    assert len(select(s, "gpumon_gpu_nvlink_data_bytes_total")) == 2 * gpus
    tx = value(s, "gpumon_gpu_nvlink_data_bytes_total", gpu="0", direction="tx")
    assert tx is not None and tx > 0 and tx % 1024 == 0
    errors = select(s, "gpumon_gpu_nvlink_errors_total")
    assert len(errors) == gpus * links * 3
    assert {dict(k)["type"] for k in errors} == {"replay", "recovery", "crc"}
    assert {dict(k)["link"] for k in errors} == {str(i) for i in range(links)}
    per_direction_kib = links * nvlink["bandwidth_per_link_mbps"] * 1e6 * NVLINK_DUTY_CYCLE
    dcgm = value(s, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="0")
    assert dcgm == pytest.approx(2 * per_direction_kib / 1000, rel=0.05), (dcgm, per_direction_kib)


@pytest.mark.parametrize("name", ["h100", "gb200"])
def test_the_snapshot_carries_gpm_and_nvlink_as_read(
    name: str, mock: MockNvml, gpm_exporters: dict[str, Exporter]
) -> None:
    """/api/v1/snapshot holds every slow field the scrape shows, as NVML answered it, within the
    wire schema's strict types and limits (once it carried 8 of SlowFields' 19 fields)."""
    profile = load_profile(mock, name)
    gpus, links = len(device_configs(profile)), profile["nvlink"]["links_per_gpu"]
    exporter = gpm_exporters[name]
    exporter.until(
        lambda s: len(select(s, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")) == gpus,
        f"{name}: NVLink rate on every GPU",
    )
    status, body = exporter.get("/api/v1/snapshot")
    assert status == 200, body
    doc = wire.parse_snapshot(body.encode())
    assert len(doc.gpus) == gpus
    for g in doc.gpus:
        slow = g.slow
        assert slow is not None and slow.profiling is not None, g.identity.index
        busy = g.identity.index == 0
        assert slow.profiling.sm_active_ratio == pytest.approx(BUSY["gpu"] / 100 if busy else 0)
        assert slow.profiling.pcie_tx_bytes_per_second == pytest.approx(0.8 * 2048 * MiB if busy else 0)
        assert {(e.link, e.kind) for e in slow.nvlink_errors} == {
            (link, kind) for link in range(links) for kind in ("replay", "recovery", "crc")
        }
        assert set(slow.nvlink_data_bytes) == {"tx", "rx"} and slow.nvlink_data_bytes["tx"] > 0
        assert slow.nvlink_data_bytes_per_second is not None and slow.nvlink_data_bytes_per_second > 0
        assert (slow.encoder_utilization_ratio, slow.decoder_utilization_ratio) == (0, 0)


@pytest.mark.parametrize("name", ["t4", "b200"])
def test_no_nvlink_no_series_and_no_error(
    name: str, mock: MockNvml, gpm_exporters: dict[str, Exporter]
) -> None:
    """A PCIe T4 has no NVLink, the mock's standalone B200 board no active link: no NVLink
    field-value series in either profile, not zeros, and the field counted not_supported once
    per GPU however many ticks pass."""
    gpus = len(device_configs(load_profile(mock, name)))
    exporter = gpm_exporters[name]
    s = exporter.until(lambda s: not_supported(s).get("nvml.nvlink") == gpus, f"{name}: NVLink not supported")
    s = after_slow_ticks(exporter, s, 2)
    assert not_supported(s)["nvml.nvlink"] == gpus
    assert nvml_errors(s) == {}
    field_values = {"gpumon_gpu_nvlink_data_bytes_total", "gpumon_gpu_nvlink_errors_total"}
    assert {n for (n, _) in s if n in field_values or n == "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"} == set()
    assert "nvlink" not in exporter.log_text().lower()


def after_slow_ticks(exporter: Exporter, now: Series, ticks: int) -> Series:
    """The first scrape after ``ticks`` more slow ticks than ``now`` shows."""

    def slow_ticks(s: Series) -> float:
        return value(s, "gpumon_exporter_sample_duration_seconds_count", cadence="slow") or 0

    start = slow_ticks(now)
    return exporter.until(lambda s: slow_ticks(s) >= start + ticks, f"{ticks} more slow ticks")


GPM_NATIVE = {
    "gpumon_gpu_graphics_engine_active_ratio",
    "gpumon_gpu_sm_active_ratio",
    "gpumon_gpu_sm_occupancy_ratio",
    "gpumon_gpu_pipe_active_ratio",
    "gpumon_gpu_dram_active_ratio",
    "gpumon_gpu_pcie_bytes_per_second",
    "gpumon_gpu_nvlink_bytes_per_second",
}


def test_fields_a_gpu_lacks_are_absent_and_counted_once(
    mock: MockNvml, gpm_exporters: dict[str, Exporter]
) -> None:
    """The H100 profile has no fans (SXM, liquid cooled): no fan series in either profile, and
    nvml.fan_speed counted not_supported once per GPU, not once per tick."""
    gpus = len(device_configs(load_profile(mock, "h100")))
    exporter = gpm_exporters["h100"]
    s = exporter.until(lambda s: not_supported(s).get("nvml.fan_speed") == gpus, "fans counted unsupported")
    s = after_slow_ticks(exporter, s, 3)
    assert not_supported(s)["nvml.fan_speed"] == gpus
    assert select(s, "gpumon_gpu_fan_speed_ratio") == {} and select(s, "DCGM_FI_DEV_FAN_SPEED") == {}
    assert all(v <= gpus for v in not_supported(s).values())
    assert value(s, "gpumon_gpu_performance_state", gpu="0") == 0  # the profile's P0
    assert len(select(s, "DCGM_FI_DEV_POWER_VIOLATION")) == gpus


# -- one node: pods, MIG, faults at run time ------------------------------------------------------

# pod -> (container, pid, GPU, MiB, SM %); trainer/main runs two processes on GPU 0.
WORKLOAD = [
    ("trainer", "main", 4101, 0, 10240, 30),
    ("trainer", "main", 4102, 0, 2048, 10),
    ("notebook", "jupyter", 4201, 4, 4096, 25),
]
HOST_PID = 4999  # on GPU 0, outside any pod
NAMESPACE = "ml"
# pod -> (its one container, that container's limits); the kubelet's allocations below match.
PODS = {
    "trainer": ("main", {"nvidia.com/gpu": "1"}),
    "notebook": ("jupyter", {"nvidia.com/gpu": "1"}),
    "idle": ("app", {"nvidia.com/gpu": "1"}),
    "mig-user": ("app", {"nvidia.com/mig-1g.5gb": "1"}),
}


@dataclass
class Node:
    exporter: Exporter
    configs: list[dict[str, Any]]
    overrides: Path
    faults: dict[str, Any] = field(default_factory=dict)

    def inject(self, gpu: int, failure: dict[str, Any]) -> None:
        """Fail GPU ``gpu`` from now on (the overrides document is replaced whole, atomically)."""
        self.faults[str(gpu)] = {"failure": failure}
        staged = self.overrides.with_suffix(".tmp")
        staged.write_text(yaml.safe_dump({"version": 1, "devices": self.faults}))
        staged.replace(self.overrides)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pods(devcluster: DevCluster) -> AsyncIterator[dict[str, RunningPod]]:
    """The node's pods in the session's API server: a kwok node named as the exporter's
    ``--node-name``, and PODS running on it with their containers' IDs in status."""
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(devcluster.kubeconfig), client_configuration=cfg)
    async with client.ApiClient(cfg) as api, KubeClient(from_kubeconfig(devcluster.kubeconfig)) as kube:
        core = client.CoreV1Api(api)
        await core.create_node(nodes.manifest(NODE, nodes.NodeTemplate(gpus=8)))
        try:
            await eventually(lambda: node_ready(kube, NODE), what=f"node {NODE} Ready")
            await create_namespace(core, NAMESPACE)
            try:
                yield await run_pods(
                    core,
                    NAMESPACE,
                    (pod_manifest(name, NODE, {c: limits}) for name, (c, limits) in PODS.items()),
                )
            finally:
                await core.delete_namespace(NAMESPACE)
        finally:
            await core.delete_node(NODE)


@pytest.fixture(scope="module")
def node(
    mock: MockNvml,
    devcluster: DevCluster,
    pods: dict[str, RunningPod],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("node")
    a100 = load_profile(mock, "a100")
    procs: dict[int, list[dict[str, Any]]] = {}
    for pod, container, pid, gpu, mib, sm in WORKLOAD:
        procs.setdefault(gpu, []).append(
            {"pid": pid, "type": "C", "name": f"{pod}-{container}", "used_memory_mib": mib, "sm_util": sm}
        )
    procs[0].append({"pid": HOST_PID, "type": "G", "name": "Xorg", "used_memory_mib": 512, "sm_util": 5})
    profile = a100
    for gpu, listed in procs.items():
        # The card's own figure is at least what its processes' samples add up to: per-pod
        # ratios are scaled down to the card's measured use (docs/pod-attribution.md).
        busy = sum(p["sm_util"] for p in listed)
        profile = with_device(
            profile,
            gpu,
            processes=listed,
            utilization={**a100["device_defaults"]["utilization"], "gpu": busy},
        )
    profile = with_device(profile, 3, mig=mig_block(a100["device_defaults"], A100_MIG))
    configs = device_configs(profile)
    uuids = [c["uuid"] for c in configs]

    # The host's /proc names the pods by the UIDs the API server gave them.
    host_proc = tmp / "proc"
    for pod, container, pid, _, _, _ in WORKLOAD:
        pods[pod].write_process(host_proc, pid, container)
    write_process(host_proc, HOST_PID, "0::/system.slice/display-manager.service\n")

    kubelet = FakeKubelet()
    kubelet.pods = [
        pod_resources(NAMESPACE, "trainer", {"main": {"nvidia.com/gpu": [uuids[0]]}}),
        pod_resources(NAMESPACE, "notebook", {"jupyter": {"nvidia.com/gpu": [uuids[4]]}}),
        pod_resources(NAMESPACE, "idle", {"app": {"nvidia.com/gpu": [uuids[5]]}}),
        pod_resources(NAMESPACE, "mig-user", {"app": {"nvidia.com/mig-1g.5gb": [A100_MIG[3]["uuid"]]}}),
    ]
    overrides = tmp / "overrides.yaml"
    with short_socket_dir() as sockets, serve(sockets / "kubelet.sock", kubelet):
        env = child_env(
            mock,
            write_profile(profile, tmp / "a100-node.yaml"),
            overrides=overrides,
            KUBECONFIG=str(devcluster.kubeconfig),
            GPUMON_PODS__HOST_PROC=str(host_proc),
            GPUMON_PODS__POD_RESOURCES_SOCKET=str(sockets / "kubelet.sock"),
        )
        with Exporter(env, tmp / "exporter.log", "--metrics-profile", "both") as exporter:
            exporter.until(lambda s: complete(s, len(configs)), "every GPU read")
            yield Node(exporter, configs, overrides)


def pod_values(series: Series, family: str, **labels: str) -> dict[tuple[str, str, str], float]:
    return {
        (dict(ls)["pod"], dict(ls)["container"], dict(ls)["gpu"]): v
        for ls, v in select(series, family, namespace=NAMESPACE, **labels).items()
    }


def test_processes_attributed_to_pods(node: Node) -> None:
    """NVML's process list (memory, per-process SM samples) through /proc cgroups to containers
    of the pods the API names; pods pod-resources gives a GPU show 0 until they use it."""
    used = {("trainer", "main", "0"): 12288 * MiB, ("notebook", "jupyter", "4"): 4096 * MiB}
    expected_used = used | {("idle", "app", "5"): 0, ("mig-user", "app", "3"): 0}
    s = node.exporter.until(
        lambda s: pod_values(s, "gpumon_pod_gpu_memory_used_bytes") == expected_used, "pods' memory"
    )
    assert pod_values(s, "gpumon_pod_gpu_utilization_ratio") == pytest.approx(
        {
            ("trainer", "main", "0"): 0.40,
            ("notebook", "jupyter", "4"): 0.25,
            ("idle", "app", "5"): 0.0,
            ("mig-user", "app", "3"): 0.0,
        }
    )
    assert pod_values(s, "gpumon_pod_gpu_allocated", resource="nvidia.com/gpu") == {
        ("trainer", "main", "0"): 1,
        ("notebook", "jupyter", "4"): 1,
        ("idle", "app", "5"): 1,
    }
    # The MIG device pod-resources names belongs to GPU 3.
    assert pod_values(s, "gpumon_pod_gpu_allocated", resource="nvidia.com/mig-1g.5gb") == {
        ("mig-user", "app", "3"): 1
    }
    for source in ("pod_resources", "api", "proc"):
        assert value(s, "gpumon_exporter_pod_source_state", source=source, state="up") == 1
    # dcgm-exporter puts the one pod using a device on that device's series.
    assert dict(next(iter(select(s, "DCGM_FI_DEV_GPU_UTIL", gpu="0")))).get("pod") == "trainer"


def test_mig_devices_in_the_scrape(node: Node) -> None:
    """GPU 3's MIG devices (the project's patch to the mock) join the memory families with
    their instance labels and the profile names NVIDIA's tools give them."""
    s = node.exporter.until(lambda s: len(select(s, "gpumon_gpu_memory_total_bytes", gpu="3")) == 5, "MIG")
    uuid = node.configs[3]["uuid"]
    for m in A100_MIG:
        labels = {"node": NODE, "gpu": "3", "uuid": uuid, "gpu_instance": str(m["gpu_instance_id"]),
                  "compute_instance": str(m["compute_instance_id"]), "mig_profile": m["profile"]}  # fmt: skip
        used = m.get("used_memory_mib", 0) * MiB
        for family, expected in (
            ("gpumon_gpu_memory_total_bytes", m["memory_mib"] * MiB),
            ("gpumon_gpu_memory_used_bytes", used),
            ("gpumon_gpu_memory_free_bytes", m["memory_mib"] * MiB - used),
        ):
            assert select(s, family, **labels) == {frozenset(labels.items()): expected}, family
        assert value(s, "DCGM_FI_DEV_FB_USED", gpu="3", GPU_I_ID=str(m["gpu_instance_id"]),
                     GPU_I_PROFILE=m["profile"]) == used // MiB  # fmt: skip
    # The pod given MIG device 1g.5gb (instance 13) has series of that device, not of the card,
    # with dcgm-exporter's labels in the dcgm profile: the card's UUID, GPU_I_ID 13.
    mig = A100_MIG[3]
    (labels,) = select(s, "gpumon_pod_gpu_allocated", pod="mig-user")
    assert dict(labels) == {"node": NODE, "namespace": NAMESPACE, "pod": "mig-user", "container": "app",
                            "gpu": "3", "uuid": mig["uuid"], "gpu_instance": "13", "compute_instance": "0",
                            "mig_profile": "1g.5gb", "resource": "nvidia.com/mig-1g.5gb"}  # fmt: skip
    holders = {
        dict(ls).get("GPU_I_ID", ""): dict(ls).get("pod") for ls in select(s, "DCGM_FI_DEV_FB_USED", gpu="3")
    }
    assert holders == {"": None, "1": None, "5": None, "13": "mig-user"}
    assert dict(next(iter(select(s, "DCGM_FI_DEV_FB_USED", GPU_I_ID="13"))))["UUID"] == uuid
    # NVML gives a MIG device no reserved figure; the GPU's own series stays.
    assert len(select(s, "gpumon_gpu_memory_reserved_bytes", gpu="3")) == 1
    assert value(s, "gpumon_gpu_health", gpu="3", state="healthy") == 1


def test_gpu_falls_off_the_bus_while_the_exporter_runs(node: Node) -> None:
    """GPU 1 is lost with Xid 79: it keeps its identity, its health (lost) and its Xid counter;
    every reading of it disappears; the other GPUs read on."""
    uuid = node.configs[1]["uuid"]
    assert value(node.exporter.scrape() or {}, "gpumon_gpu_health", gpu="1", state="healthy") == 1
    node.inject(1, {"mode": "lost", "xid": {"code": 79}})
    s = node.exporter.until(
        lambda s: (
            value(s, "gpumon_gpu_health", gpu="1", state="lost") == 1
            and value(s, "gpumon_gpu_xid_errors_total", gpu="1", xid="79") == 1
        ),
        "GPU 1 lost with Xid 79 counted",
    )
    assert value(s, "gpumon_gpu_info", gpu="1", uuid=uuid) == 1
    assert value(s, "DCGM_FI_DEV_XID_ERRORS", gpu="1", UUID=uuid) == 79
    assert "GpuLost" in {dict(ls)["reason"] for ls in select(s, "gpumon_gpu_health_info", gpu="1")}
    kept = {"gpumon_gpu_info", "gpumon_gpu_health", "gpumon_gpu_health_info", "gpumon_gpu_xid_errors_total"}
    readings = {n for (n, ls) in s if dict(ls).get("gpu") == "1" and n.startswith("gpumon_gpu_")}
    assert readings == kept
    assert {n for (n, ls) in s if dict(ls).get("gpu") == "1" and n.startswith("DCGM_")} == {
        "DCGM_FI_DEV_XID_ERRORS"
    }
    for other in (0, 4, 6, 7):
        assert value(s, "gpumon_gpu_memory_total_bytes", gpu=str(other)) is not None
    # Counted once, by whichever read (fast or slow) found it lost first.
    assert sum(select(s, "gpumon_exporter_errors_total", kind="lost").values()) == 1


def test_uncorrectable_ecc_while_the_exporter_runs(node: Node) -> None:
    """GPU 2 takes uncorrectable ECC errors with Xid 48: the double-bit counter climbs, one more
    row is remapped and the remap fails; the GPU is unhealthy but still read."""
    node.inject(2, {"mode": "ecc_uncorrectable", "xid": {"code": 48}})
    s = node.exporter.until(
        lambda s: (
            (value(s, "gpumon_gpu_ecc_errors_total", gpu="2", type="uncorrected") or 0) > 0
            and value(s, "gpumon_gpu_xid_errors_total", gpu="2", xid="48") == 1
            and value(s, "gpumon_gpu_row_remap_failure", gpu="2") == 1
        ),
        "GPU 2 with uncorrectable ECC",
    )
    rows = node.configs[2]["remapped_rows"]
    assert value(s, "gpumon_gpu_remapped_rows", gpu="2", type="uncorrectable") == rows["uncorrectable"] + 1
    assert value(s, "gpumon_gpu_health", gpu="2", state="unhealthy") == 1
    reasons = {dict(ls)["reason"] for ls in select(s, "gpumon_gpu_health_info", gpu="2")}
    assert {"EccUncorrectable", "RowRemapFailure"} <= reasons
    assert value(s, "gpumon_gpu_memory_total_bytes", gpu="2") == node.configs[2]["memory"]["total_bytes"]
    assert value(s, "DCGM_FI_DEV_XID_ERRORS", gpu="2") == 48
    assert (value(s, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="2") or 0) > 0


# -- the driver's recovery action ---------------------------------------------------------------


def test_the_recovery_action_is_exported_and_read_again_at_once_after_an_xid(
    mock: MockNvml, tmp_path: Path
) -> None:
    """H100 profile on the patched mock: GPU 0 reports action NONE, GPU 1 GPU_RESET, the others
    do not report it (absent in both profiles, counted once). Slow ticks are an hour apart, so
    when GPU 0 then takes Xid 48 with the driver asking to drain and reset it, only the read
    that follows the Xid can show the new action."""
    h100 = load_profile(mock, "h100")
    profile = with_device(with_device(h100, 0, recovery_action="none"), 1, recovery_action="gpu_reset")
    gpus = len(device_configs(profile))
    overrides = tmp_path / "overrides.yaml"
    env = child_env(mock, write_profile(profile, tmp_path / "h100.yaml"), overrides=overrides)
    env["GPUMON_PODS__ENABLED"] = "false"
    log = tmp_path / "exporter.log"
    with Exporter(env, log, "--metrics-profile", "both", "--slow-interval", "3600") as exporter:
        s = exporter.until(lambda s: complete(s, gpus), "every GPU read")

        def action(s: Series, gpu: int) -> dict[str, float]:
            return {
                dict(ls)["action"]: v
                for ls, v in select(s, "gpumon_gpu_recovery_action", gpu=str(gpu)).items()
            }

        assert action(s, 0) == {a.label: float(a is RecoveryAction.NONE) for a in RecoveryAction}
        assert action(s, 1)["gpu_reset"] == 1 and sum(action(s, 1).values()) == 1
        assert action(s, 2) == {} and value(s, "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", gpu="2") is None
        assert value(s, "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", gpu="1") == 1
        assert not_supported(s)["nvml.recovery_action"] == gpus - 2
        assert value(s, "gpumon_gpu_health", gpu="1", state="unhealthy") == 1
        assert {dict(ls)["reason"] for ls in select(s, "gpumon_gpu_health_info", gpu="1")} == {
            "RecoveryGpuReset"
        }

        staged = overrides.with_suffix(".tmp")
        fault = {
            "failure": {"mode": "ecc_uncorrectable", "xid": {"code": 48}},
            "recovery_action": "drain_and_reset",
        }
        staged.write_text(yaml.safe_dump({"version": 1, "devices": {"0": fault}}))
        staged.replace(overrides)
        s = exporter.until(
            lambda s: value(s, "gpumon_gpu_recovery_action", gpu="0", action="drain_and_reset") == 1,
            "GPU 0's new action, read after its Xid",
        )
        assert value(s, "gpumon_gpu_xid_errors_total", gpu="0", xid="48") == 1
        assert value(s, "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", gpu="0") == 4
        reasons = {dict(ls)["reason"] for ls in select(s, "gpumon_gpu_health_info", gpu="0")}
        assert "RecoveryDrainAndReset" in reasons
        # Only the one slow tick at start: the action came from the read after the Xid.
        assert value(s, "gpumon_exporter_sample_duration_seconds_count", cadence="slow") == 1
        assert not_supported(s)["nvml.recovery_action"] == gpus - 2, "still counted once"
        assert nvml_errors(s) == {}


# -- no library, or one that will not load --------------------------------------------------------


def test_no_library_or_a_broken_one_keeps_the_exporter_serving(mock: MockNvml, tmp_path: Path) -> None:
    """Without libnvidia-ml.so.1 on the loader path, and with a file of that name that is not a
    shared library: the exporter serves its own metrics with NVML down, keeps retrying, and
    says in its log which of the two it is."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "libnvidia-ml.so.1").write_text("This is not an ELF shared object. " * 8)
    env = {"GPUMON_PODS__ENABLED": "false"}
    missing = Exporter(child_env(None, None, **env), tmp_path / "missing.log")
    refused = Exporter(child_env(None, None, LD_LIBRARY_PATH=str(broken), **env), tmp_path / "refused.log")
    with running(missing, refused):
        for exporter, said in (
            (missing, "libnvidia-ml.so.1 not found (no NVIDIA driver on this machine"),
            (refused, "libnvidia-ml.so.1 is there but cannot be loaded"),
        ):
            s = exporter.until(
                lambda s: (
                    (value(s, "gpumon_exporter_errors_total", source="nvml.open", kind="unavailable") or 0)
                    >= 2
                ),
                "NVML down, open retried",
            )
            assert value(s, "gpumon_exporter_nvml_up") == 0
            assert select(s, "gpumon_gpu_info") == {}
            assert exporter.get("/readyz")[0] == 503
            assert said in exporter.log_text()
        assert "invalid ELF header" in refused.log_text()
