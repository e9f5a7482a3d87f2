"""The device check's parts that need no GPU (bench/device_check; docs/nvml.md, "The device
check"): its rule for every family gpumon exports, nvidia-smi's XML in both shapes drivers write,
the field comparison, its usage errors, and that nothing in it can change a GPU's settings."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.device_check import crosscheck, families, smi
from gpumon.exporter.exposition import family_names

REPO = Path(__file__).resolve().parents[2]
MiB = 2**20


def test_every_family_gpumon_exports_has_exactly_one_rule() -> None:
    """A family added to the exporter without a rule here would be reported missing on the GPU."""
    ruled = set(families.SOURCES) | set(families.ONLY_WHEN)
    assert not set(families.SOURCES) & set(families.ONLY_WHEN)
    assert ruled == set(family_names("both"))


def test_families_are_present_not_supported_not_applicable_or_missing() -> None:
    everything = set(family_names("both"))
    absent = {"gpumon_gpu_fan_speed_ratio", "DCGM_FI_DEV_FAN_SPEED", "gpumon_gpu_pipe_active_ratio",
              "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gpumon_gpu_xid_errors", "gpumon_gpu_power_watts",
              "gpumon_gpu_clock_violation_seconds"}  # fmt: skip
    found = families.classify(everything - absent, {"fan_speed", "gpm.fp64_active_ratio", "violation.power"})
    assert {name: found[name] for name in absent} == {
        "gpumon_gpu_fan_speed_ratio": ("not_supported", "fan_speed"),
        "DCGM_FI_DEV_FAN_SPEED": ("not_supported", "fan_speed"),
        # one pipe's metric unsupported explains the family only for its own DCGM field...
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("not_supported", "gpm.fp64_active_ratio"),
        "gpumon_gpu_pipe_active_ratio": ("not_supported", "gpm.fp64_active_ratio"),
        "gpumon_gpu_xid_errors": ("not_applicable", "only when an Xid was received"),
        "gpumon_gpu_power_watts": ("missing", ""),
        "gpumon_gpu_clock_violation_seconds": ("not_supported", "violation.power"),
    }
    assert all(state == "present" for name, (state, _) in found.items() if name not in absent)
    # Without the load loop no pod's process runs on the GPU: its pod's families cannot be there.
    no_pod = families.classify(everything - set(families.WITH_A_POD), set(), pod=False)
    assert {no_pod[name][0] for name in families.WITH_A_POD} == {"not_applicable"}
    assert families.classify(everything - set(families.WITH_A_POD), set())["gpumon_pod_gpu_allocated"] == (
        "missing",
        "",
    )


def _xml(gpu: str, driver: str = "580.95.05") -> str:
    return (
        f'<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n<nvidia_smi_log>'
        f"<driver_version>{driver}</driver_version><cuda_version>13.0</cuda_version>"
        f"<attached_gpus>1</attached_gpus>{gpu}</nvidia_smi_log>"
    )


# Hopper on R580: SRAM/DRAM ECC counters, clocks_event_reasons, gpu_power_readings with the
# instant and average draws, a process.
HOPPER = _xml("""<gpu id="00000000:1B:00.0"><product_name>NVIDIA H200</product_name>
<uuid>GPU-0a1b</uuid>
<pci><pci_bus_id>00000000:1B:00.0</pci_bus_id><replay_counter>0</replay_counter></pci>
<fan_speed>N/A</fan_speed><performance_state>P0</performance_state>
<clocks_event_reasons><clocks_event_reason_gpu_idle>Active</clocks_event_reason_gpu_idle>
<clocks_event_reason_sw_power_cap>Not Active</clocks_event_reason_sw_power_cap>
<clocks_event_reason_hw_thermal_slowdown>Not Active</clocks_event_reason_hw_thermal_slowdown>
</clocks_event_reasons>
<fb_memory_usage><total>143771 MiB</total><reserved>581 MiB</reserved><used>2 MiB</used>
<free>143189 MiB</free></fb_memory_usage>
<utilization><gpu_util>7 %</gpu_util><memory_util>0 %</memory_util><encoder_util>0 %</encoder_util>
<decoder_util>N/A</decoder_util></utilization>
<ecc_errors><volatile><sram_correctable>1</sram_correctable>
<sram_uncorrectable_parity>0</sram_uncorrectable_parity>
<sram_uncorrectable_secded>0</sram_uncorrectable_secded><dram_correctable>2</dram_correctable>
<dram_uncorrectable>0</dram_uncorrectable></volatile></ecc_errors>
<remapped_rows><remapped_row_corr>0</remapped_row_corr><remapped_row_unc>0</remapped_row_unc>
<remapped_row_pending>No</remapped_row_pending><remapped_row_failure>No</remapped_row_failure></remapped_rows>
<temperature><gpu_temp>31 C</gpu_temp><memory_temp>39 C</memory_temp></temperature>
<gpu_power_readings><average_power_draw>76.12 W</average_power_draw>
<instant_power_draw>77.01 W</instant_power_draw>
<current_power_limit>700.00 W</current_power_limit></gpu_power_readings>
<clocks><graphics_clock>345 MHz</graphics_clock><sm_clock>345 MHz</sm_clock>
<mem_clock>3201 MHz</mem_clock></clocks>
<processes><process_info><pid>4242</pid><type>C</type><process_name>python3</process_name>
<used_memory>1024 MiB</used_memory></process_info></processes>
</gpu>""")  # fmt: skip

# Ampere on R470: single/double-bit ECC, clocks_throttle_reasons, power_readings.
AMPERE_R470 = _xml(
    """<gpu id="00000000:07:00.0"><product_name>NVIDIA A100-SXM4-40GB</product_name>
<uuid>GPU-77</uuid><pci><pci_bus_id>00000000:07:00.0</pci_bus_id><replay_counter>3</replay_counter></pci>
<performance_state>P8</performance_state>
<clocks_throttle_reasons><clocks_throttle_reason_gpu_idle>Not Active</clocks_throttle_reason_gpu_idle>
<clocks_throttle_reason_hw_slowdown>Active</clocks_throttle_reason_hw_slowdown></clocks_throttle_reasons>
<fb_memory_usage><total>40536 MiB</total><used>0 MiB</used><free>40536 MiB</free></fb_memory_usage>
<ecc_errors><volatile><single_bit><device_memory>4</device_memory><total>4</total></single_bit>
<double_bit><device_memory>1</device_memory><total>1</total></double_bit></volatile></ecc_errors>
<power_readings><power_draw>55.50 W</power_draw>
<enforced_power_limit>400.00 W</enforced_power_limit></power_readings>
</gpu>""",
    driver="470.256.02",
)


def test_nvidia_smi_readings_in_gpumon_units() -> None:
    (bus, r), = smi.readings(HOPPER).items()  # fmt: skip
    assert bus == "00000000:1b:00.0"
    assert r["uuid"] == "GPU-0a1b" and r["model"] == "NVIDIA H200"
    assert r["memory_total_bytes"] == 143771 * MiB and r["memory_reserved_bytes"] == 581 * MiB
    assert r["utilization_ratio"] == pytest.approx(0.07)
    assert r["decoder_utilization_ratio"] is None  # N/A
    assert r["power_watts"] == pytest.approx(76.12)  # the average, NVML's power usage
    assert r["power_limit_watts"] == 700.0
    assert r["sm_clock_hertz"] == 345e6 and r["memory_clock_hertz"] == 3201e6
    assert (r["ecc_corrected"], r["ecc_uncorrected"]) == (3, 0)
    assert (r["row_remap_pending"], r["row_remap_failure"], r["performance_state"]) == (0, 0, 0)
    assert (r["throttled.gpu_idle"], r["throttled.sw_power_cap"], r["throttled.hw_thermal"]) == (1, 0, 0)
    assert r["throttled.sync_boost"] is None  # not in this output at all
    assert smi.versions(HOPPER) == {"driver_version": "580.95.05", "cuda_version": "13.0"}
    assert smi.processes(HOPPER) == {4242: 1024 * MiB}


def test_nvidia_smi_readings_of_an_older_driver() -> None:
    (r,) = smi.readings(AMPERE_R470).values()
    assert (r["ecc_corrected"], r["ecc_uncorrected"]) == (4, 1)
    assert (r["power_watts"], r["power_limit_watts"]) == (55.5, 400.0)
    assert (r["throttled.gpu_idle"], r["throttled.hw_slowdown"]) == (0, 1)
    assert (r["performance_state"], r["pcie_replays"], r["memory_reserved_bytes"]) == (8, 3, None)


def test_a_value_is_judged_against_the_range_of_the_scrapes_around_it() -> None:
    rows = {
        r.field: r
        for r in crosscheck.compare(
            {
                "utilization_ratio": 0.50,
                "power_watts": 100.0,
                "pcie_replays": 2,
                "fan_speed": None,
                "ecc_corrected": None,
                "temperature_gpu_celsius": 40,
                "uuid": "GPU-1",
            },
            {"utilization_ratio": 0.20, "power_watts": 130.0, "pcie_replays": 2, "ecc_corrected": 0},
            {"utilization_ratio": 0.70, "power_watts": 140.0, "pcie_replays": 2},
        )
    }
    assert rows["utilization_ratio"].ok  # between the two scrapes
    assert not rows["power_watts"].ok and rows["power_watts"].tolerance == 15  # 100 W vs 130..140 ± 15
    assert rows["pcie_replays"].ok and rows["pcie_replays"].tolerance == 0
    assert rows["ecc_corrected"].ok and rows["ecc_corrected"].why == "not reported by nvidia-smi"
    assert not rows["temperature_gpu_celsius"].ok  # nvidia-smi has it, gpumon does not
    assert set(rows) == {"utilization_ratio", "power_watts", "pcie_replays", "ecc_corrected",
                         "temperature_gpu_celsius"}  # fmt: skip


# nvidia-smi's flags that change a GPU: reset, MIG, clocks, persistence, power, ECC, compute mode.
_CHANGES = re.compile(
    r"""["'](-r|-pm|-pl|-ac|-rac|-lgc|-rgc|-lmc|-rmc|-mig|-e|-c|-am|-caa|-cc)["']"""
    r"|--gpu-reset|--persistence-mode|--power-limit|--lock-gpu-clocks|--lock-memory-clocks"
    r"|--reset-gpu-clocks|--reset-memory-clocks|--applications-clocks|--multi-instance-gpu"
    r"|--ecc-config|--compute-mode|--auto-boost"
)
# NVML's calls that change a GPU (nvmlDeviceSet*, nvmlDeviceReset*, nvmlDeviceClear*, ...); the
# event-set calls only create, wait on and free the exporter's own event set.
_NVML_SETTERS = re.compile(r"nvml(?!EventSet)\w*(Set|Reset|Clear)\w*")


def test_nothing_the_check_runs_can_change_a_gpu() -> None:
    sources = [*sorted((REPO / "bench" / "device_check").glob("*.py")), REPO / "hack" / "device-check.sh"]
    product = sorted((REPO / "gpumon").rglob("*.py"))
    for path in sources:
        text = path.read_text()
        assert not _CHANGES.search(text), path
        # Only smi.run, which refuses any other command line, names the program to run.
        assert path.name == "smi.py" or not re.search(r"([\"'])nvidia-smi\1", text), path
    for path in [*sources, *product]:
        assert not _NVML_SETTERS.search(path.read_text()), path
    assert (smi.QUERY, smi.VERSION) == (("nvidia-smi", "-q", "-x"), ("nvidia-smi", "--version"))
    with pytest.raises(ValueError, match="does not run nvidia-smi -r"):
        smi.run(("nvidia-smi", "-r"))


def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    script = REPO / "hack" / "device-check.sh"
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("")
    for argv, says in (
        ([str(script), "--bundle", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")],
         "is not a device bundle"),
        ([str(script), "--out", str(tmp_path / "o"), "--bundle"], "--bundle needs a directory"),
        ([sys.executable, "-m", "bench", "device-check", "--out", str(tmp_path / "taken")],
         "is not a new or empty directory"),
    ):  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr.strip().splitlines()[-1]
        assert "Traceback" not in done.stderr
