"""The NVML backend against NVIDIA's mock libnvidia-ml, through the real nvidia-ml-py.

The library comes from ``github.com/NVIDIA/k8s-test-infra`` (``pkg/gpu/mocknvml``), built with
the project's patches by ``hack/build-tools.sh mocknvml`` into the tools cache. Every scenario
runs tests/nvml/mock_probe.py in a child process (NVML is one library per process and the mock
reads ``MOCK_NVML_CONFIG`` once) and checks what the backend saw against the GPU profile's own
YAML. The exporter end to end on the same library: test_exporter_mock_nvml.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from nvml_mock import (
    A100_MIG,
    REASON_NAMES,
    MiB,
    child_env,
    device_configs,
    load_profile,
    mig_block,
    with_device,
    write_profile,
)

from gpumon.devcluster.binaries import MockNvml
from gpumon.devices.nvml.convert import canonical_bus_id
from gpumon.gpu.model import NVLINK_ERROR_KINDS, VIOLATION_POLICIES, XID_OTHER

PROBE = Path(__file__).with_name("mock_probe.py")


def probe(
    mock: MockNvml,
    scenario: str,
    profile: dict[str, Any],
    tmp_path: Path,
    *,
    preload: bool = False,
    overrides: Path | None = None,
    options: Sequence[str] = (),
) -> dict[str, Any]:
    config = write_profile(profile, tmp_path / f"{scenario}.yaml")
    env = child_env(None if preload else mock, config, overrides=overrides)
    args = [sys.executable, str(PROBE), scenario, *options]
    if preload:
        args += ["--library", str(mock.library)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"probe {scenario} failed:\n{done.stdout}\n{done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stderr  # the backend's log lines (no handler set: WARNING and up)
    return result


def processes(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The backend's process samples for a GPU's configured processes: memory in bytes, the
    mock's per-process SM and memory utilization as ratios, one sample per pid."""
    return [
        {
            "pid": p["pid"],
            "used_memory_bytes": p.get("used_memory_mib", 0) * MiB,
            "sm_utilization_ratio": p.get("sm_util", 0) / 100,
            "memory_utilization_ratio": p.get("mem_util", 0) / 100,
            "name": None,
            # Read only on a GPU in MIG mode (the mock's processes carry no instance of their own).
            "gpu_instance": None,
            "compute_instance": None,
        }
        for p in sorted(cfg.get("processes") or (), key=lambda p: p["pid"])
    ]


def check_nvlink(profile: dict[str, Any], slow: dict[str, Any]) -> None:
    """NVLink counters, per link, on a profile with an NVLink fabric (every link has all three
    error counters and both directions are summed); none on one without. One read: no rate."""
    links = (profile.get("nvlink") or {}).get("links_per_gpu", 0)
    data, errors = slow.pop("nvlink_data_bytes"), slow.pop("nvlink_errors")
    assert slow.pop("nvlink_data_bytes_per_second") is None
    if not links:
        assert data == {} and errors == {}
        return
    assert set(data) == {"tx", "rx"} and all(v > 0 and v % 1024 == 0 for v in data.values())
    expected = {str((link, kind)) for link in range(links) for kind in NVLINK_ERROR_KINDS}
    assert set(errors) == expected and all(v >= 0 for v in errors.values())


def check_inventory(profile: dict[str, Any], seen: dict[str, Any]) -> None:
    system = profile["system"]
    configs = device_configs(profile)
    memory_v2 = system["driver_version"] >= "510"  # nvmlDeviceGetMemoryInfo_v2 came with R510

    assert seen["driver"] == {
        "driver_version": system["driver_version"],
        "cuda_version": f"{system['cuda_version_major']}.{system['cuda_version_minor']}",
        "nvml_version": system["nvml_version"],
    }
    assert [g["index"] for g in seen["devices"]] == list(range(len(configs)))
    for gpu, cfg, fast, slow in zip(seen["devices"], configs, seen["fast"], seen["slow"], strict=True):
        assert gpu == {
            "index": gpu["index"],
            "uuid": cfg["uuid"],
            "model": cfg["name"],
            "pci_bus_id": canonical_bus_id(cfg["pci"]["bus_id"]),
            "serial": str(cfg["serial"]),
            "mig_mode": cfg["mig"]["mode_current"] == "enabled",
        }
        memory = cfg["memory"]
        power, clocks = cfg["power"], cfg["clocks"]
        thermal = cfg.get("thermal") or {}  # none: the GPU reports no temperature at all
        reasons = cfg["clocks_throttle_reasons"]
        assert fast == {
            "memory": {
                "total_bytes": memory["total_bytes"],
                "used_bytes": memory["used_bytes"],
                "free_bytes": memory["free_bytes"],
                # Memory info v1 has no reserved figure.
                "reserved_bytes": memory["reserved_bytes"] if memory_v2 else None,
            },
            "utilization_ratio": cfg["utilization"]["gpu"] / 100,
            "memory_utilization_ratio": cfg["utilization"]["memory"] / 100,
            "temperature_gpu_celsius": thermal.get("temperature_gpu_c"),
            "temperature_memory_celsius": thermal.get("temperature_memory_c") or None,
            "power_watts": power["current_draw_mw"] / 1000,
            "power_limit_watts": power["enforced_limit_mw"] / 1000,
            "energy_joules": power.get("total_energy_consumption_mj", 0) / 1000,
            "sm_clock_hertz": clocks["sm_current"] * 1e6,
            "memory_clock_hertz": clocks["memory_current"] * 1e6,
            "throttle_reasons": sorted(REASON_NAMES[k] for k, on in reasons.items() if on),
            # The _v3 process lists came with R510; gpumon reads no older ones.
            "processes": processes(cfg) if memory_v2 else [],
        }
        volatile = cfg["ecc"]["errors"]["volatile"]
        rows = cfg["remapped_rows"]
        fan = cfg.get("fan") or {}
        # The mock accrues violation time while a clock event reason is on: when read, it is
        # some figure, for every policy it models.
        violations = slow.pop("violation_seconds")
        assert set(violations) == set(VIOLATION_POLICIES) and all(v >= 0 for v in violations.values())
        check_nvlink(profile, slow)
        assert slow == {
            # The mock answers 0 whatever the profile's pcie.replay_counter says.
            "pcie_replays": 0,
            "ecc_corrected": volatile["single_bit"]["total"],
            "ecc_uncorrected": volatile["double_bit"]["total"],
            "remapped_rows_correctable": rows["correctable"],
            "remapped_rows_uncorrectable": rows["uncorrectable"],
            "row_remap_pending": rows["pending"],
            "row_remap_failure": rows["failure_occurred"],
            "mig_instances": [],
            # One slow read: GPM has no interval to measure yet, on any profile.
            "profiling": None,
            "mig_profiling": [],
            # Bare metal (the profiles' virtualization mode "none"): no vGPU licence to read.
            "vgpu_licensed": None,
            # The mock answers 0 for the video engines whatever the profile says.
            "encoder_utilization_ratio": 0.0,
            "decoder_utilization_ratio": 0.0,
            # A board without fans (count 0) answers NOT_SUPPORTED.
            "fan_speed_ratio": fan["speed_percent"] / 100 if fan.get("count") else None,
            "performance_state": int(cfg["performance_state"].removeprefix("P")),
            # The shipped profiles declare no recovery action: NOT_SUPPORTED, as on a driver from
            # before the field (the recovery action test sets one).
            "recovery_action": None,
        }

    assert seen["xids"] == []
    assert seen["errors"] == []  # a healthy profile reads without a single field error

    # close() then open(): same NVML, same cards at the same indices.
    assert seen["reopened_driver"] == seen["driver"]
    assert seen["reopened_devices"] == seen["devices"]
    assert [f["memory"] for f in seen["reopened_fast"]] == [f["memory"] for f in seen["fast"]]


def test_h100_reads_as_configured(mock: MockNvml, tmp_path: Path) -> None:
    profile = load_profile(mock, "h100")
    check_inventory(profile, probe(mock, "inventory", profile, tmp_path))


def test_library_path_alone_finds_the_library(mock: MockNvml, tmp_path: Path) -> None:
    """No LD_LIBRARY_PATH: ``NvmlBackend(library_path=...)`` alone makes pynvml find it."""
    profile = load_profile(mock, "a100")
    check_inventory(profile, probe(mock, "inventory", profile, tmp_path, preload=True))


def test_every_clock_event_reason_a_long_process_list_and_no_sensor(mock: MockNvml, tmp_path: Path) -> None:
    """Every clock event reason NVML sets comes out under its own name; a process list longer
    than gpumon's first buffer (32) is read whole, compute and graphics alike; a GPU whose
    temperatures are NOT_SUPPORTED (as in some vGPU guests) has none, and that is no error."""
    a100 = load_profile(mock, "a100")
    # Thermal off the defaults, back on every GPU but 6 (a device entry replaces it whole).
    thermal = a100["device_defaults"].pop("thermal")
    for entry in a100["devices"]:
        if entry["index"] != 6:
            entry["thermal"] = thermal
    every_reason = dict.fromkeys(REASON_NAMES, True)
    many = [
        {"pid": 5000 + i, "type": "C", "name": f"worker-{i}", "used_memory_mib": 100 + i, "sm_util": i % 7,
         "mem_util": i % 3}
        for i in range(40)
    ]  # fmt: skip
    many.append({"pid": 6000, "type": "G", "name": "Xorg", "used_memory_mib": 64, "sm_util": 1})
    profile = with_device(a100, 1, clocks_throttle_reasons=every_reason)
    profile = with_device(profile, 5, processes=many)
    seen = probe(mock, "inventory", profile, tmp_path)
    check_inventory(profile, seen)
    assert set(seen["fast"][1]["throttle_reasons"]) == set(REASON_NAMES.values())
    assert len(seen["fast"][5]["processes"]) == 41
    assert seen["fast"][6]["temperature_gpu_celsius"] is seen["fast"][6]["temperature_memory_celsius"] is None


def test_an_older_driver_without_the_newer_calls(mock: MockNvml, tmp_path: Path) -> None:
    """R470: no nvmlDeviceGetMemoryInfo_v2 (FUNCTION_NOT_FOUND), so memory comes from v1 with
    no reserved figure; clock event reasons from nvmlDeviceGetCurrentClocksThrottleReasons (the
    newer call came with R535: the project's second patch to the mock); and no _v3 process
    lists. None of it is an error."""
    profile = load_profile(mock, "a100")
    profile["system"] |= {"driver_version": "470.256.02", "nvml_version": "11.470.256.02"}
    profile["system"] |= {"cuda_version": "11.4", "cuda_version_major": 11, "cuda_version_minor": 4}
    processes = [{"pid": 4242, "type": "C", "name": "train", "used_memory_mib": 1024, "sm_util": 60}]
    profile = with_device(profile, 0, processes=processes)
    profile = with_device(profile, 1, clocks_throttle_reasons=dict.fromkeys(REASON_NAMES, True))
    check_inventory(profile, probe(mock, "inventory", profile, tmp_path))


# -- failure injection ------------------------------------------------------------------------------


def test_lost_gpu_fails_alone(mock: MockNvml, tmp_path: Path) -> None:
    profile = with_device(load_profile(mock, "a100"), 1, failure={"mode": "lost"})
    seen = probe(mock, "lost", profile, tmp_path)
    configs = device_configs(profile)

    # Still listed: the mock trips the failure at the first guarded read, not at enumeration.
    assert [g["uuid"] for g in seen["devices"]] == [c["uuid"] for c in configs]
    for attempts in (seen["fast"], seen["slow"], seen["fast_again"]):
        for gpu, outcome in zip(seen["devices"], attempts, strict=True):
            if gpu["index"] == 1:
                assert outcome["error"] == "GpuLostError" and outcome["index"] == 1
            else:
                assert "value" in outcome, outcome
    # No Xid configured, none delivered; the wait is not failed by the lost GPU.
    assert seen["xids"] == {"value": []}
    assert seen["errors"] == []


def test_uncorrectable_ecc_with_an_xid_processes_and_mig(mock: MockNvml, tmp_path: Path) -> None:
    a100 = load_profile(mock, "a100")
    procs = [
        {"pid": 4242, "type": "C", "name": "train", "used_memory_mib": 1024, "sm_util": 60, "mem_util": 20},
        {"pid": 4343, "type": "G", "name": "viz", "used_memory_mib": 256, "sm_util": 5, "mem_util": 1},
    ]
    rows = {"correctable": 2, "uncorrectable": 1, "pending": True, "failure_occurred": False}
    profile = with_device(a100, 0, processes=procs)
    profile = with_device(profile, 2, failure={"mode": "ecc_uncorrectable", "xid": {"code": 48}})
    profile["devices"][2]["remapped_rows"] = rows  # ignored by the mock: only defaults set rows
    profile = with_device(profile, 3, mig=mig_block(a100["device_defaults"], A100_MIG))
    seen = probe(mock, "ecc_xid", profile, tmp_path)
    gpu2 = seen["devices"][2]

    # Exactly one Xid 48 from GPU 2, stamped while the wait ran; then nothing: NVML reports
    # each critical Xid once.
    (event,) = seen["first_wait"]
    assert (event["uuid"], event["index"], event["xid"]) == (gpu2["uuid"], 2, 48)
    assert seen["wait_started"] <= event["timestamp"] <= seen["wait_finished"]
    assert seen["second_wait"] == []

    # ecc_uncorrectable: the double-bit count grows with every guarded call since the fault,
    # and one more row is remapped for an uncorrectable error, failing.
    for i, slow in enumerate(seen["slow"]):
        if i == 2:
            assert slow["ecc_uncorrected"] > 0
            assert slow["remapped_rows_uncorrectable"] == 1
            assert slow["row_remap_failure"] is True
        else:
            assert slow["ecc_uncorrected"] == 0 and slow["row_remap_failure"] is False
    verdicts = seen["verdicts"]
    assert verdicts[2]["state"] == "unhealthy"
    # Xid 48 is NVIDIA's double-bit ECC Xid: one more EccUncorrectable reason.
    assert verdicts[2]["reasons"].count("EccUncorrectable") == 2
    assert "RowRemapFailure" in verdicts[2]["reasons"]
    assert all(v["state"] == "healthy" for i, v in enumerate(verdicts) if i != 2)

    # Compute and graphics processes with their memory and per-process utilization.
    assert seen["fast"][0]["processes"] == processes({"processes": procs})
    assert all(f["processes"] == [] for f in seen["fast"][1:])

    # MIG (the project's patch): GPU 3's own mig block enables it and its devices are read with
    # their instance ids, memory and the profile names NVIDIA's tools give them.
    assert seen["devices"][3]["mig_mode"] is True
    assert seen["slow"][3]["mig_instances"] == [
        {
            "gpu_instance": m["gpu_instance_id"],
            "compute_instance": m["compute_instance_id"],
            "profile": m["profile"],
            "uuid": m["uuid"],
            "gpu_instance_profile": {1: "3g.20gb", 5: "2g.10gb", 13: "1g.5gb"}[m["gpu_instance_id"]],
            "memory": {
                "total_bytes": m["memory_mib"] * MiB,
                "used_bytes": m.get("used_memory_mib", 0) * MiB,
                "free_bytes": (m["memory_mib"] - m.get("used_memory_mib", 0)) * MiB,
                "reserved_bytes": None,
            },
        }
        for m in A100_MIG
    ]
    assert all(s["mig_instances"] == [] for i, s in enumerate(seen["slow"]) if i != 3)
    assert seen["errors"] == []


def test_nvml_initialised_again_after_a_fault(mock: MockNvml, tmp_path: Path) -> None:
    """GPU 1 falls off the bus (Xid 79); NVML is shut down and initialised again, as the sampler
    does when NVML goes away. The cards keep their indices and GPU 1 is found lost again.

    A real driver would not hand out a lost GPU's handle, nor report its Xid a second time. The
    mock rebuilds its devices on nvmlInit: GPU 1 enumerates, is lost at its first read, and its
    Xid is delivered once per initialisation."""
    profile = with_device(load_profile(mock, "a100"), 1, failure={"mode": "lost", "xid": {"code": 79}})
    seen = probe(mock, "reinit", profile, tmp_path)
    before, after = seen["before"], seen["after"]
    gpu1 = before["devices"][1]

    assert after["devices"] == before["devices"]
    for run in (before, after):
        for i, (fast, slow) in enumerate(zip(run["fast"], run["slow"], strict=True)):
            if i == 1:
                assert fast["error"] == slow["error"] == "GpuLostError"
            else:
                assert "value" in fast and "value" in slow
        (event,) = run["xids"]["value"]
        assert (event["uuid"], event["index"], event["xid"]) == (gpu1["uuid"], 1, 79)
    assert seen["errors"] == []


def test_an_xid_on_every_gpu_at_once_comes_out_of_one_wait_and_folds_per_gpu(
    mock: MockNvml, tmp_path: Path
) -> None:
    """The real event path under a burst (issue #18): every GPU's Xid queued at once comes out
    of one ``wait_xids`` (the first event, then the drain of what is already queued), each GPU
    is counted once per delivery and folded into one verdict reason per class. The mock delivers
    an Xid once per nvmlInit, so a burst is all it can send: a storm of thousands a second is
    the simulator's (bench/xid_storm.py, tests/unit/test_sampler.py)."""
    a100 = load_profile(mock, "a100")
    codes = {0: 79, 1: 48, 2: 13, 3: 300, 4: 74, 5: 94, 6: 119, 7: 63}
    profile = a100
    for index, code in codes.items():
        profile = with_device(profile, index, failure={"mode": "ecc_uncorrectable", "xid": {"code": code}})
    seen = probe(mock, "xid_burst", profile, tmp_path)
    devices = len(a100["devices"])
    for wait in seen["waits"]:
        assert sorted((e["index"], e["xid"]) for e in wait["events"]) == sorted(codes.items())[:devices]
        assert wait["after"] == [], "each Xid is delivered once per initialisation"
    reinits = len(seen["waits"])
    uuid = {e["index"]: e["uuid"] for e in seen["waits"][0]["events"]}
    assert seen["counts"][uuid[0]] == {"79": reinits}
    assert seen["counts"][uuid[3]] == {str(XID_OTHER): reinits}, "300 is outside the catalog: other"
    assert seen["reasons"][uuid[2]] == [], "Xid 13 is informational"
    assert seen["reasons"][uuid[0]] == [["XidFatal", "Xid 79"]]


# H100 80GB MIG devices: GPU instance 1 (3g.40gb) split into two compute instances, GPU instance
# 5 (2g.20gb) whole.
H100_MIG = [
    {"uuid": "MIG-5b2d1f8a-6c2e-5e7f-8b54-4d2c7b3e0001", "profile": "1c.3g.40gb", "gpu_instance_id": 1,
     "compute_instance_id": 0, "gpu_instance_slices": 3, "compute_instance_slices": 1,
     "multiprocessor_count": 16, "memory_mib": 40192},
    {"uuid": "MIG-5b2d1f8a-6c2e-5e7f-8b54-4d2c7b3e0002", "profile": "2c.3g.40gb", "gpu_instance_id": 1,
     "compute_instance_id": 1, "gpu_instance_slices": 3, "compute_instance_slices": 2,
     "multiprocessor_count": 32, "memory_mib": 40192},
    {"uuid": "MIG-5b2d1f8a-6c2e-5e7f-8b54-4d2c7b3e0003", "profile": "2g.20gb", "gpu_instance_id": 5,
     "compute_instance_id": 0, "gpu_instance_slices": 2, "compute_instance_slices": 2,
     "multiprocessor_count": 32, "memory_mib": 20096},
]  # fmt: skip


def test_gpm_per_mig_instance_and_the_vgpu_licence_up_to_what_the_mock_answers(
    mock: MockNvml, tmp_path: Path
) -> None:
    """H100 profile, GPU 3 in MIG mode with two GPU instances, GPU 1 a vGPU guest's device (the
    mock's run-time overrides: virtualization mode VGPU), three slow ticks.

    The boundary: the mock stubs ``nvmlGpmMigSampleGet`` and
    ``nvmlDeviceGetGridLicensableFeatures_v4`` (``bridge/stubs_generated.go``: NOT_SUPPORTED).
    So each is asked through the real bindings where it applies and not elsewhere, its answer
    leaves the field absent, is counted once per GPU over the three ticks, and is never logged;
    the whole GPU's GPM goes on beside MIG. What a driver that answers them gives is decoded
    and rendered in the unit tier (test_nvml_conversions.py, test_sampler.py)."""
    h100 = load_profile(mock, "h100")
    profile = with_device(h100, 3, mig=mig_block(h100["device_defaults"], H100_MIG))
    overrides = tmp_path / "vgpu.yaml"
    overrides.write_text(
        yaml.safe_dump({"version": 1, "devices": {"1": {"virtualization": {"mode": "vgpu"}}}})
    )
    seen = probe(mock, "slow_ticks", profile, tmp_path, overrides=overrides)
    first, *_, last = seen["ticks"]

    assert seen["devices"][3]["mig_mode"] is True
    # Each MIG device knows its GPU instance's profile apart from its own.
    assert [
        (m["gpu_instance"], m["profile"], m["gpu_instance_profile"]) for m in last[3]["mig_instances"]
    ] == [
        (1, "1c.3g.40gb", "3g.40gb"),
        (1, "2c.3g.40gb", "3g.40gb"),
        (5, "2g.20gb", "2g.20gb"),
    ]
    # Per-instance GPM asked of GPU 3 only, answered NOT_SUPPORTED: none, counted once.
    assert all(slow["mig_profiling"] == [] for tick in seen["ticks"] for slow in tick)
    assert seen["not_supported"].get("nvml.gpm_mig") == 1
    # The whole GPU's GPM is unaffected: an interval from the second tick on, MIG or not.
    assert first[3]["profiling"] is None
    assert all(slow["profiling"] is not None for slow in last)

    # The vGPU licence is asked of GPU 1 only (the others are bare metal: not asked, not
    # counted) and absent everywhere, counted once.
    assert all(slow["vgpu_licensed"] is None for tick in seen["ticks"] for slow in tick)
    assert seen["not_supported"].get("nvml.vgpu_license") == 1
    assert "nvml.virtualization_mode" not in seen["not_supported"]

    assert seen["errors"] == []
    assert seen["log"] == ""


def test_gpm_per_mig_instance_held_between_ticks_with_the_mig_call_answered(
    mock: MockNvml, tmp_path: Path
) -> None:
    """The per-instance path past the mock's stub: the probe answers ``nvmlGpmMigSampleGet``
    with the whole GPU's ``nvmlGpmSampleGet`` (the one substitution; buffers, samples and
    ``nvmlGpmMetricsGet`` are the mock's, through pynvml). GPU 3, in MIG mode, is 80 % busy:
    each GPU instance gets its own interval from the second tick, with engine, pipe and DRAM
    activity and no PCIe or NVLink traffic (asked of whole GPUs only), under its GPU
    instance's profile; nothing is counted unsupported."""
    h100 = load_profile(mock, "h100")
    profile = with_device(h100, 3, mig=mig_block(h100["device_defaults"], H100_MIG))
    overrides = tmp_path / "busy.yaml"
    overrides.write_text(
        yaml.safe_dump({"version": 1, "devices": {"3": {"utilization": {"gpu": 80, "memory": 40}}}})
    )
    seen = probe(
        mock, "slow_ticks", profile, tmp_path, overrides=overrides, options=["--mig-sample-from-gpu"]
    )
    first, second, third = seen["ticks"]
    assert first[3]["mig_profiling"] == []  # no interval yet
    for tick in (second, third):
        instances = tick[3]["mig_profiling"]
        assert [(m["gpu_instance"], m["profile"]) for m in instances] == [(1, "3g.40gb"), (5, "2g.20gb")]
        for m in instances:
            got = m["profiling"]
            assert got["sm_active_ratio"] == pytest.approx(0.8)
            assert got["tensor_active_ratio"] == pytest.approx(0.4)
            assert got["dram_active_ratio"] == pytest.approx(0.4)
            assert got["pcie_tx_bytes_per_second"] is None and got["nvlink_rx_bytes_per_second"] is None
    assert all(slow["mig_profiling"] == [] for tick in seen["ticks"] for slow in tick[:3])
    assert "nvml.gpm_mig" not in seen["not_supported"]
    assert seen["errors"] == [] and seen["log"] == ""


def test_the_recovery_action_per_gpu_from_the_profile_and_changed_at_run_time(
    mock: MockNvml, tmp_path: Path
) -> None:
    """Field 230 (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) through the real bindings on the patched
    mock (hack/tools/mocknvml/patches/0003-gpu-recovery-action.patch): per GPU from the H100
    profile, GPUs that do not declare it answer NOT_SUPPORTED as an older driver does (absent,
    counted once per GPU), and the run-time overrides file changes it, seen by the next call."""
    h100 = load_profile(mock, "h100")
    profile = with_device(h100, 0, recovery_action="none")
    profile = with_device(profile, 1, recovery_action="gpu_reset")
    profile = with_device(profile, 2, recovery_action="system_reboot")
    overrides = tmp_path / "overrides.yaml"
    then = {
        "version": 1,
        "devices": {"0": {"recovery_action": "drain_and_reset"}, "1": {"recovery_action": "none"}},
    }
    seen = probe(
        mock, "recovery_action", profile, tmp_path, overrides=overrides, options=["--then", json.dumps(then)]
    )

    gpus = len(seen["devices"])
    # RecoveryAction's values as NVML's numbers: what plain() leaves of the enum.
    assert seen["before"]["slow"] == [0, 1, 7] + [None] * (gpus - 3)
    assert seen["before"]["alone"] == seen["before"]["slow"], "read alone (after an Xid) the same"
    assert {i: a["action"] for i, a in seen["after"].items()} == {"0": "DRAIN_AND_RESET", "1": "NONE"}
    # Not supported on the GPUs without it: counted once each, however often asked.
    assert seen["not_supported"].get("nvml.recovery_action") == gpus - 3
    assert seen["errors"] == [] and seen["log"] == ""
