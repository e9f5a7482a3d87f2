"""Doctor's NVML family on this machine, which has no NVIDIA driver (the real nvidia-ml-py
failing to find libnvidia-ml), and its judgement of what a driver could report."""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import pytest

from gpumon.doctor import nvml
from gpumon.doctor.nvml import GpuFacts, NvmlFacts
from gpumon.doctor.result import Status
from gpumon.gpu.model import DriverInfo, GpuIdentity

has_driver = ctypes.util.find_library("nvidia-ml") is not None


@pytest.mark.skipif(has_driver, reason="this machine has an NVIDIA driver")
def test_without_any_nvml_the_check_fails_with_the_fix() -> None:
    facts = nvml.gather(None)
    assert facts.error_kind == "library_not_found"
    (r,) = nvml.judge(facts)
    assert r.status is Status.FAIL and r.name == "NVML"
    assert "libnvidia-ml.so.1 not found" in r.found
    assert "install the NVIDIA driver" in r.fix and "--nvml-library" in r.fix


def test_a_configured_library_that_does_not_exist(tmp_path: Path) -> None:
    facts = nvml.gather(tmp_path / "libnvidia-ml.so.1")
    (r,) = nvml.judge(facts)
    assert r.status is Status.FAIL and "does not exist" in r.found
    assert facts.error_kind == "library_path" and "--nvml-library" in r.fix


def test_a_configured_library_that_is_not_a_library(tmp_path: Path) -> None:
    lib = tmp_path / "libnvidia-ml.so.1"
    lib.write_text("not ELF")
    (r,) = nvml.judge(nvml.gather(lib))
    assert r.status is Status.FAIL and f"cannot load {lib}" in r.found


def test_simulated_gpus_need_no_nvml() -> None:
    (r,) = nvml.judge(nvml.gather(None, used=False))
    assert r.status is Status.OK and "not used" in r.found


# -- judging what a driver reports (pure) -----------------------------------------------------

DRIVER = DriverInfo("550.54.15", "12.4", "12.550.54.15")


def gpu(index: int, **kw: object) -> GpuFacts:
    identity = GpuIdentity(
        index, f"GPU-{index:08d}", "NVIDIA A100-SXM4-80GB", f"00000000:0{index}:00.0", mig_mode=False
    )
    defaults: dict[str, object] = {"persistence": True}
    defaults.update(kw)
    return GpuFacts(identity, **defaults)  # type: ignore[arg-type]


def by_name(facts: NvmlFacts) -> dict[str, tuple[Status, str, str]]:
    return {r.name: (r.status, r.found, r.fix) for r in nvml.judge(facts)}


def test_a_healthy_node() -> None:
    facts = NvmlFacts(True, driver=DRIVER, gpus=(gpu(0, pids=(10, 11)), gpu(1)))
    results = nvml.judge(facts)
    assert [r.status for r in results] == [Status.OK] * 5
    got = by_name(facts)
    assert got["NVML"][1] == "initialised: driver 550.54.15, CUDA 12.4, NVML 12.550.54.15; 2 GPU(s)"
    assert got["GPUs"][1] == "2 × NVIDIA A100-SXM4-80GB"
    assert got["Xid events"][1] == "registered on 2 GPU(s)"
    assert got["process listing"][1] == "2 process(es) on 1 GPU(s)"
    details = next(r for r in results if r.name == "GPUs").details
    assert details[0] == "GPU 0 GPU-00000000 NVIDIA A100-SXM4-80GB 00000000:00:00.0: persistence on, MIG off"


def test_a_lost_gpu_fails_with_the_runbook() -> None:
    status, found, fix = by_name(NvmlFacts(True, driver=DRIVER, gpus=(gpu(0), gpu(1, lost=True))))["GPUs"]
    assert status is Status.FAIL and found == "lost: GPU 1 (GPU-00000001)" and "reboot" in fix


def test_no_gpu_at_all_fails() -> None:
    got = by_name(NvmlFacts(True, driver=DRIVER))
    assert got["GPUs"][0] is Status.FAIL and "NVIDIA_VISIBLE_DEVICES" in got["GPUs"][2]
    assert "Xid events" not in got


def test_warnings_persistence_off_xid_unsupported_processes_unlisted() -> None:
    facts = NvmlFacts(
        True,
        driver=DRIVER,
        gpus=(gpu(0, persistence=False), gpu(1, xid_error="not_supported")),
        errors=(("nvml.processes", "no_permission"),),
    )
    got = by_name(facts)
    assert got["persistence mode"][0] is Status.WARN and "GPU 0" in got["persistence mode"][1]
    assert "nvidia-persistenced" in got["persistence mode"][2]
    assert got["Xid events"] == (
        Status.WARN,
        "cannot be registered on GPU 1 (GPU-00000001) (not_supported)",
        got["Xid events"][2],
    )
    assert got["process listing"][0] is Status.WARN and "hostPID" in got["process listing"][2]


def test_windows_reports_no_persistence_mode_and_that_is_fine() -> None:
    got = by_name(NvmlFacts(True, driver=DRIVER, gpus=(gpu(0, persistence=None),)))
    assert got["persistence mode"][0] is Status.OK


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("driver_not_loaded", "modprobe nvidia"),
        ("no_permission", "device files"),
        ("lib_rm_version_mismatch", "reboot"),
        ("unknown", "dmesg"),
    ],
)
def test_each_init_failure_has_its_own_fix(kind: str, words: str) -> None:
    (r,) = nvml.judge(NvmlFacts(True, error="NVML unavailable: ...", error_kind=kind))
    assert r.status is Status.FAIL and words in r.fix


def test_a_driver_without_process_listing_is_no_warning() -> None:
    """The backend counts a call the driver lacks as ``not_supported``: no hostPID advice for it."""
    facts = NvmlFacts(True, driver=DRIVER, gpus=(gpu(0),), errors=(("nvml.processes", "not_supported"),))
    assert by_name(facts)["process listing"][0] is Status.OK
