"""Doctor's device-file check on generated /dev trees, and on Windows' DLL paths."""

from __future__ import annotations

from pathlib import Path

from gpumon.doctor import devices
from gpumon.doctor.devices import DeviceFacts, DeviceFile
from gpumon.doctor.result import Status


def dev_tree(root: Path, *names: str) -> Path:
    root.mkdir(exist_ok=True)
    for n in names:
        (root / n).touch()
    return root


def test_everything_present(tmp_path: Path) -> None:
    dev = dev_tree(tmp_path / "dev", "nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia10", "null")
    (r,) = devices.judge(devices.gather(dev, "linux"))
    assert r.status is Status.OK and r.found.startswith("3 GPU device file(s)")
    assert [d.split(":")[0] for d in r.details] == [
        str(dev / n) for n in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia10")
    ]


def test_no_device_files_fails_with_the_runtime_fix(tmp_path: Path) -> None:
    (r,) = devices.judge(devices.gather(dev_tree(tmp_path / "dev", "null"), "linux"))
    assert r.status is Status.FAIL
    assert r.found.startswith("missing: nvidiactl, nvidia<N>") and "runtimeClassName: nvidia" in r.fix


def test_gpu_files_without_the_control_file_fail(tmp_path: Path) -> None:
    (r,) = devices.judge(devices.gather(dev_tree(tmp_path / "dev", "nvidia0"), "linux"))
    assert r.status is Status.FAIL and r.found.startswith("missing: nvidiactl (")


def test_missing_uvm_only_warns(tmp_path: Path) -> None:
    (r,) = devices.judge(devices.gather(dev_tree(tmp_path / "dev", "nvidiactl", "nvidia0"), "linux"))
    assert r.status is Status.WARN and "nvidia-modprobe" in r.fix


def test_files_this_process_cannot_open_fail() -> None:
    # Built by hand: the tests run as root, for whom every file is accessible.
    facts = DeviceFacts(
        "linux",
        (
            DeviceFile("/dev/nvidiactl", True, True),
            DeviceFile("/dev/nvidia-uvm", True, True),
            DeviceFile("/dev/nvidia0", True, False),
        ),
        uid=1000,
    )
    (r,) = devices.judge(facts)
    assert r.status is Status.FAIL and r.found == "not readable and writable by uid 1000: /dev/nvidia0"
    assert "supplementalGroups" in r.fix


def test_windows_looks_for_the_nvml_dll() -> None:
    paths = devices.windows_dll_paths({"SystemRoot": r"D:\Win", "ProgramFiles": r"D:\Programs"})
    assert paths == (r"D:\Win\System32\nvml.dll", r"D:\Programs\NVIDIA Corporation\NVSMI\nvml.dll")
    (missing,) = devices.judge(devices.gather(Path("/dev"), "win32"))  # no such paths here
    assert missing.status is Status.FAIL and missing.name == "NVML DLL" and "nvml.dll" in missing.fix
    found = DeviceFacts("win32", (DeviceFile(paths[0], False, False), DeviceFile(paths[1], True, True)))
    (r,) = devices.judge(found)
    assert r.status is Status.OK and r.found == f"found {paths[1]}"
