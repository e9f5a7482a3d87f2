"""The NVML backend end to end against NVIDIA's mock libnvidia-ml, through the real nvidia-ml-py.

The library comes from ``github.com/NVIDIA/k8s-test-infra`` (``pkg/gpu/mocknvml/bridge``), built
by ``hack/build-tools.sh mocknvml`` into the tools cache. Every scenario runs
tests/nvml/mock_probe.py in a child process (NVML is one library per process and the mock reads
``MOCK_NVML_CONFIG`` once), and checks what the backend saw against the GPU profile's own YAML.

Until the Go module proxy serves that module this whole file is skipped with the proxy's answer.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpumon.devcluster.binaries import cache_dir
from gpumon.devices.nvml import canonical_bus_id

# Keep in step with MOCKNVML_VERSION in hack/build-tools.sh.
MOCKNVML_VERSION = "v0.3.1-0.20260821154203-3b2b865d91b1"
MOCK = cache_dir() / f"mocknvml-{MOCKNVML_VERSION}"
LIBRARY = MOCK / "lib" / "libnvidia-ml.so.1"
PROFILES = {name: MOCK / "configs" / f"mock-nvml-config-{name}.yaml" for name in ("a100", "h100")}

BLOCKED = (
    f"NVIDIA's mock NVML is not in the tools cache ({MOCK}): the Go module proxy refuses it. "
    "`go get github.com/NVIDIA/k8s-test-infra@v0.3.1-0.20260821154203-3b2b865d91b1` -> "
    "reading https://proxy.golang.org/github.com/%21n%21v%21i%21d%21i%21a/k8s-test-infra/@v/"
    "v0.3.1-0.20260821154203-3b2b865d91b1.info: 403 Forbidden server response: "
    "This module version is not available. (Same for @v/list, v0.3.0 and github.com/NVIDIA/go-nvml.) "
    "Run `bash hack/build-tools.sh mocknvml` once the proxy serves it."
)

if not (MOCK / ".done").is_file() or not LIBRARY.exists():
    pytest.skip(BLOCKED, allow_module_level=True)

PROBE = Path(__file__).with_name("mock_probe.py")
GiB = 2**30
MiB = 2**20

# The profile's clocks_throttle_reasons keys, as the backend names them.
REASON_NAMES = {
    "gpu_idle": {"idle"},
    "applications_clocks_setting": {"applications_clocks"},
    "sw_power_cap": {"power"},
    "hw_slowdown": {"hw_slowdown"},
    "sync_boost": {"sync_boost"},
    "sw_thermal_slowdown": {"thermal"},
    "hw_thermal_slowdown": {"thermal", "hw_thermal"},
    "hw_power_brake_slowdown": {"hw_power_brake"},
    "display_clocks_setting": {"display_clocks"},
}


# -- the profile's own word ---------------------------------------------------------------------


def load_profile(name: str) -> dict[str, Any]:
    with PROFILES[name].open() as f:
        profile: dict[str, Any] = yaml.safe_load(f)
    return profile


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = (
            merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def device_configs(profile: dict[str, Any]) -> list[dict[str, Any]]:
    """Each GPU's configuration: the defaults with its own entry laid over them."""
    count = profile.get("system", {}).get("num_devices") or len(profile["devices"])
    by_index = {d["index"]: d for d in profile["devices"]}
    return [merged(profile["device_defaults"], by_index.get(i, {})) for i in range(min(count, 8))]


def with_device(profile: dict[str, Any], index: int, **fields: Any) -> dict[str, Any]:
    """A copy of the profile whose GPU ``index`` also carries ``fields`` (whole blocks, so the
    result does not depend on how deep the mock merges a device over its defaults)."""
    out = copy.deepcopy(profile)
    entry = next(d for d in out["devices"] if d["index"] == index)
    entry.update(copy.deepcopy(fields))
    return out


def dynamic(cfg: dict[str, Any], section: str) -> bool:
    return section in (cfg.get("dynamic_metrics") or {})


# -- running a scenario ---------------------------------------------------------------------------


def probe(scenario: str, profile: dict[str, Any], tmp_path: Path, *, preload: bool = False) -> dict[str, Any]:
    config = tmp_path / f"{scenario}.yaml"
    config.write_text(yaml.safe_dump(profile))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_NVML_")}
    env["MOCK_NVML_CONFIG"] = str(config)
    args = [sys.executable, str(PROBE), scenario]
    if preload:
        env.pop("LD_LIBRARY_PATH", None)
        args += ["--library", str(LIBRARY)]
    else:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(LIBRARY.parent), env.get("LD_LIBRARY_PATH")) if p
        )
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"probe {scenario} failed:\n{done.stdout}\n{done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- healthy profiles -----------------------------------------------------------------------------


def check_inventory(profile: dict[str, Any], seen: dict[str, Any]) -> None:
    system = profile["system"]
    configs = device_configs(profile)

    assert seen["driver"]["driver_version"] == system["driver_version"]
    assert seen["driver"]["cuda_version"] == f"{system['cuda_version_major']}.{system['cuda_version_minor']}"
    if "nvml_version" in system:
        assert seen["driver"]["nvml_version"] == system["nvml_version"]

    assert [g["index"] for g in seen["devices"]] == list(range(len(configs)))
    for gpu, cfg, fast, slow in zip(seen["devices"], configs, seen["fast"], seen["slow"], strict=True):
        assert gpu["uuid"] == cfg["uuid"]
        assert gpu["model"] == cfg["name"]
        assert gpu["pci_bus_id"] == canonical_bus_id(cfg["pci"]["bus_id"])
        assert gpu["serial"] == str(cfg["serial"])
        assert gpu["mig_mode"] is (cfg["mig"]["mode_current"] == "enabled")

        memory = cfg["memory"]
        assert fast["memory"] == {
            "total_bytes": memory["total_bytes"],
            "used_bytes": memory["used_bytes"],
            "free_bytes": memory["free_bytes"],
            "reserved_bytes": memory["reserved_bytes"],
        }
        power = cfg["power"]
        assert fast["power_limit_watts"] == power["enforced_limit_mw"] / 1000
        assert fast["energy_joules"] == power.get("total_energy_consumption_mj", 0) / 1000
        if not dynamic(cfg, "power"):
            assert fast["power_watts"] == power["current_draw_mw"] / 1000
        if not dynamic(cfg, "temperature"):
            assert fast["temperature_gpu_celsius"] == cfg["thermal"]["temperature_gpu_c"]
        # Memory temperature comes through field values, which a mock version may not answer.
        assert fast["temperature_memory_celsius"] in (None, cfg["thermal"].get("temperature_memory_c"))
        if not dynamic(cfg, "utilization"):
            assert fast["utilization_ratio"] == pytest.approx(cfg["utilization"]["gpu"] / 100)
            assert fast["memory_utilization_ratio"] == pytest.approx(cfg["utilization"]["memory"] / 100)
        assert fast["sm_clock_hertz"] == cfg["clocks"]["sm_current"] * 1e6
        assert fast["memory_clock_hertz"] == cfg["clocks"]["memory_current"] * 1e6
        expected_reasons = set().union(
            *(REASON_NAMES[k] for k, on in cfg["clocks_throttle_reasons"].items() if on)
        )
        assert set(fast["throttle_reasons"]) == expected_reasons
        assert fast["processes"] == []

        rows = cfg["remapped_rows"]
        assert slow == {
            "pcie_replays": cfg.get("pcie", {}).get("replay_counter", 0),
            "ecc_corrected": 0,
            "ecc_uncorrected": 0,
            "remapped_rows_correctable": rows["correctable"],
            "remapped_rows_uncorrectable": rows["uncorrectable"],
            "row_remap_pending": rows["pending"],
            "row_remap_failure": rows["failure_occurred"],
            "mig_instances": [],
        }

    assert seen["xids"] == []
    assert seen["errors"] == []  # a healthy profile reads without a single field error

    # close() then open(): same NVML, same cards at the same indices.
    assert seen["reopened_driver"] == seen["driver"]
    assert seen["reopened_devices"] == seen["devices"]
    assert [f["memory"] for f in seen["reopened_fast"]] == [f["memory"] for f in seen["fast"]]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_reads_as_configured(name: str, tmp_path: Path) -> None:
    profile = load_profile(name)
    check_inventory(profile, probe("inventory", profile, tmp_path))


def test_library_path_preloads_the_library(tmp_path: Path) -> None:
    """No LD_LIBRARY_PATH: ``NvmlBackend(library_path=...)`` alone makes pynvml find it."""
    profile = load_profile("a100")
    check_inventory(profile, probe("inventory", profile, tmp_path, preload=True))


# -- failure injection ------------------------------------------------------------------------------


def test_lost_gpu_fails_alone(tmp_path: Path) -> None:
    profile = with_device(load_profile("a100"), 1, failure={"mode": "lost"})
    seen = probe("lost", profile, tmp_path)
    configs = device_configs(profile)

    # Still listed (as lost), whether the mock fails its handle at open or its first read.
    assert [g["index"] for g in seen["devices"]] == list(range(len(configs)))
    for attempts in (seen["fast"], seen["slow"], seen["fast_again"]):
        for gpu, outcome in zip(seen["devices"], attempts, strict=True):
            if gpu["index"] == 1:
                assert outcome["error"] == "GpuLostError" and outcome["index"] == 1
            else:
                assert "value" in outcome, outcome
    healthy = [g for g in seen["devices"] if g["index"] != 1]
    assert [g["uuid"] for g in healthy] == [c["uuid"] for i, c in enumerate(configs) if i != 1]
    # A lost GPU may fail the event wait as a whole; that is reported, never raised.
    assert seen["xids"] == {"value": []}
    assert set(map(tuple, seen["errors"])) <= {("nvml.xid", "gpu_is_lost")}


def test_uncorrectable_ecc_with_an_xid(tmp_path: Path) -> None:
    a100 = load_profile("a100")
    mig = {**a100["device_defaults"]["mig"], "mode_current": "enabled", "mode_pending": "enabled"}
    processes = [
        {"pid": 4242, "type": "C", "name": "train", "used_memory_mib": 1024, "sm_util": 60, "mem_util": 20},
        {"pid": 4343, "type": "G", "name": "viz", "used_memory_mib": 256, "sm_util": 5, "mem_util": 1},
    ]
    profile = with_device(a100, 0, processes=processes)
    profile = with_device(profile, 2, failure={"mode": "ecc_uncorrectable", "xid": {"code": 48}})
    profile = with_device(profile, 3, mig=mig)
    seen = probe("ecc_xid", profile, tmp_path)
    gpu2 = seen["devices"][2]

    # Exactly one Xid 48 from GPU 2, stamped while the wait ran; then nothing: NVML reports
    # each critical Xid once.
    (event,) = seen["first_wait"]
    assert (event["uuid"], event["index"], event["xid"]) == (gpu2["uuid"], 2, 48)
    assert seen["wait_started"] <= event["timestamp"] <= seen["wait_finished"]
    assert seen["second_wait"] == []

    for i, slow in enumerate(seen["slow"]):
        if i == 2:
            assert slow["ecc_uncorrected"] > 0
            assert slow["remapped_rows_uncorrectable"] >= 1
            assert slow["row_remap_failure"] is True
        else:
            assert slow["ecc_uncorrected"] == 0 and slow["row_remap_failure"] is False

    verdicts = seen["verdicts"]
    assert verdicts[2]["state"] == "unhealthy"
    assert {"EccUncorrectable", "RowRemapFailure"} <= set(verdicts[2]["reasons"])
    assert all(v["state"] == "healthy" for i, v in enumerate(verdicts) if i != 2)

    # Compute and graphics processes, memory in bytes. Per-process utilization is the profile's
    # when the mock fills NVML's sample buffer, and idle (0) when it only reports a count.
    procs = {p["pid"]: p for p in seen["fast"][0]["processes"]}
    assert sorted(procs) == [4242, 4343]
    assert procs[4242]["used_memory_bytes"] == 1024 * MiB
    assert procs[4343]["used_memory_bytes"] == 256 * MiB
    assert procs[4242]["sm_utilization_ratio"] in (0.0, pytest.approx(0.60))
    assert procs[4343]["memory_utilization_ratio"] in (0.0, pytest.approx(0.01))
    assert all(f["processes"] == [] for f in seen["fast"][1:])

    # MIG mode is reported; the mock enumerates no instances (its MIG device calls are stubs).
    assert seen["devices"][3]["mig_mode"] is True
    assert seen["slow"][3]["mig_instances"] == []
    assert seen["errors"] == []
