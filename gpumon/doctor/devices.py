"""NVIDIA device files (Linux) or NVML's DLL (Windows): can NVML reach the driver at all?"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpumon.doctor.result import CheckResult, Status

FAMILY = "devices"
CONTROL_FILES = ("nvidiactl", "nvidia-uvm")
_GPU_FILE = re.compile(r"^nvidia(\d+)$")
MAP_DEVICES_FIX = (
    "run the pod with the NVIDIA container runtime (runtimeClassName: nvidia, or "
    "NVIDIA_VISIBLE_DEVICES=all), or mount /dev/nvidia* into it"
)


@dataclass(frozen=True, slots=True)
class DeviceFile:
    path: str
    exists: bool
    usable: bool  # readable and writable by this process: NVML opens them read-write


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    platform: str  # sys.platform
    files: tuple[DeviceFile, ...]  # control files first, then every /dev/nvidia<N>, or the DLLs
    uid: int | None = None


def windows_dll_paths(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Where nvidia-ml-py looks for ``nvml.dll`` on Windows, in its order."""
    system_root = environ.get("SystemRoot", r"C:\Windows")
    program_files = environ.get("ProgramFiles", r"C:\Program Files")
    return (
        rf"{system_root}\System32\nvml.dll",
        rf"{program_files}\NVIDIA Corporation\NVSMI\nvml.dll",
    )


def _file(path: Path) -> DeviceFile:
    exists = path.exists()
    return DeviceFile(str(path), exists, exists and os.access(path, os.R_OK | os.W_OK))


def gather(dev_root: Path, platform: str) -> DeviceFacts:
    if platform == "win32":
        return DeviceFacts(platform, tuple(_file(Path(p)) for p in windows_dll_paths(os.environ)))
    try:
        names = sorted(
            (n for n in os.listdir(dev_root) if _GPU_FILE.match(n)),
            key=lambda n: int(n.removeprefix("nvidia")),
        )
    except OSError:
        names = []
    files = [_file(dev_root / n) for n in (*CONTROL_FILES, *names)]
    return DeviceFacts(platform, tuple(files), os.getuid() if hasattr(os, "getuid") else None)


def judge(facts: DeviceFacts) -> list[CheckResult]:
    if facts.platform == "win32":
        return [_judge_windows(facts)]
    by_name = {Path(f.path).name: f for f in facts.files}
    gpus = [f for f in facts.files if _GPU_FILE.match(Path(f.path).name)]
    details = tuple(_describe(f) for f in facts.files)
    ctl, uvm = by_name.get("nvidiactl"), by_name.get("nvidia-uvm")
    if ctl is None or not ctl.exists or not gpus:
        missing = [] if ctl is not None and ctl.exists else ["nvidiactl"]
        if not gpus:
            missing.append("nvidia<N>")
        found = f"missing: {', '.join(missing)} (no NVIDIA driver, or the device files are not mapped in)"
        return [CheckResult(FAMILY, "device files", Status.FAIL, found, MAP_DEVICES_FIX, details)]
    unusable = [f.path for f in facts.files if f.exists and not f.usable]
    if unusable:
        who = f"uid {facts.uid}" if facts.uid is not None else "this process"
        return [
            CheckResult(
                FAMILY,
                "device files",
                Status.FAIL,
                f"not readable and writable by {who}: {', '.join(unusable)}",
                "run as root (the exporter chart does for attribution) or give the pod the group "
                "owning /dev/nvidia* (securityContext.supplementalGroups)",
                details,
            )
        ]
    if uvm is None or not uvm.exists:
        return [
            CheckResult(
                FAMILY,
                "device files",
                Status.WARN,
                f"{len(gpus)} GPU device file(s) and nvidiactl; nvidia-uvm missing (NVML works without "
                "it, CUDA does not)",
                "load it on the node: nvidia-modprobe -u -c=0 (or modprobe nvidia-uvm)",
                details,
            )
        ]
    found = f"{len(gpus)} GPU device file(s), nvidiactl and nvidia-uvm, all readable"
    return [CheckResult(FAMILY, "device files", Status.OK, found, details=details)]


def _describe(f: DeviceFile) -> str:
    return f"{f.path}: " + ("missing" if not f.exists else "ok" if f.usable else "no access")


def _judge_windows(facts: DeviceFacts) -> CheckResult:
    details = tuple(_describe(f) for f in facts.files)
    present = [f.path for f in facts.files if f.exists]
    if not present:
        return CheckResult(
            FAMILY,
            "NVML DLL",
            Status.FAIL,
            "nvml.dll not found in " + " or ".join(f.path for f in facts.files),
            "install the NVIDIA driver (it ships nvml.dll in System32), or set nvml_library to its path",
            details,
        )
    return CheckResult(FAMILY, "NVML DLL", Status.OK, f"found {present[0]}", details=details)
