"""The device check as a lent GPU machine would run it, proven here (docs/nvml.md, "The device
check"): ``make device-bundle``, the bundle installed offline into a fresh CPython 3.12, and
``hack/device-check.sh --bundle DIR --mock`` run whole by that Python on NVIDIA's mock library,
every step either run or skipped for a reason the mock gives."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
import zipfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from python312 import python312

from gpumon.devcluster.binaries import MockNvml

REPO = Path(__file__).resolve().parents[2]
MiB = 2**20


# What an earlier in-place wheel build could have left in the checkout's (ignored) build/.
STALE = REPO / "build" / "lib" / "gpumon" / "removed_since_the_last_build.py"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("bundle") / "device-bundle"
    env = {k: v for k, v in os.environ.items() if k != "GPUMON_PEER_SRC"}  # no peer: as in CI
    STALE.parent.mkdir(parents=True, exist_ok=True)
    STALE.write_text("")
    started = time.monotonic()
    try:
        done = subprocess.run(
            ["make", "-s", "device-bundle", f"BUNDLE={out}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        STALE.unlink()
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"make device-bundle: {time.monotonic() - started:.0f} s; {done.stdout.strip()}")
    yield out


def test_gpumon_s_wheel_holds_the_checkout_s_modules_and_no_others(bundle: Path) -> None:
    """Built in place, the wheel would also carry what build/ kept from earlier builds."""
    (wheel,) = (bundle / "wheels").glob("gpumon-*.whl")
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if n.endswith(".py")}
    listed = ["git", "ls-files", "--cached", "--others", "--exclude-standard", "gpumon/**.py"]
    checkout = subprocess.run(listed, cwd=REPO, capture_output=True, text=True, check=True)
    assert shipped == set(checkout.stdout.split())


def test_the_bundle_installs_offline_into_a_fresh_python_312(bundle: Path, tmp_path: Path) -> None:
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    wheels = sorted(p.name for p in (bundle / "wheels").iterdir())
    assert wheels == [w["file"] for w in manifest["wheels"]] and manifest["peer"] is None
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert size < 32 * MiB, f"{size / MiB:.1f} MiB"
    # Each dependency at the version this environment resolved, nothing newer.
    for w in wheels:
        name, at = w.split("-")[:2]
        assert name == "gpumon" or at == version(name), w

    venv = tmp_path / "venv"
    started = time.monotonic()
    subprocess.run([python312(), "-m", "venv", venv], check=True)
    pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "install", "--no-index", "--find-links", bundle / "wheels", "gpumon"], check=True)
    print(f"offline install into a fresh {python312()} venv: {time.monotonic() - started:.0f} s")
    subprocess.run([*pip, "check"], check=True)
    done = subprocess.run([venv / "bin" / "gpumon", "exporter", "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: gpumon exporter")


# (step, what) the mock cannot do, and why; every other check of every step runs.
MOCK_SKIPS = [
    ["record", "nvidia-smi -q -x", "nvidia-smi reads the driver, and the mock is a library without one"],
    ["crosscheck", "every field both nvidia-smi and gpumon report", "the mock has no nvidia-smi"],
    [
        "load",
        "utilization, SM-active and tensor-active under load",
        "the mock has no load generator: its utilization and GPM values are the profile's constants",
    ],
    [
        "footprint",
        "nvidia_gpu_exporter beside gpumon",
        "the bundle carries no nvidia_gpu_exporter (built without GPUMON_PEER_SRC)",
    ],
]


def test_the_device_check_runs_whole_on_the_mock(bundle: Path, mock: MockNvml, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMON_", "MOCK_NVML_", "PYTHON"))}
    started = time.monotonic()
    done = subprocess.run(
        [REPO / "hack" / "device-check.sh", "--bundle", bundle, "--mock", "--out", out],
        env=env | {"PYTHON": str(python312())},
        cwd=REPO,  # as on the lent machine: this checkout's gpumon/ must not hide the bundle's
        capture_output=True,
        text=True,
        timeout=480,
    )
    print(f"hack/device-check.sh --bundle --mock: {time.monotonic() - started:.0f} s")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # A lent machine sends back at most 8 files: three, the evidence packed.
    assert sorted(p.name for p in out.iterdir()) == ["report.tar.gz", "summary.json", "summary.md"]
    doc = json.loads((out / "summary.json").read_text())
    assert doc["passed"] and doc["mode"] == "mock"
    assert {s["key"]: s["status"] for s in doc["steps"]} == {
        "record": "passed",
        "families": "passed",
        "crosscheck": "skipped",
        "load": "skipped",
        "attribution": "passed",
        "footprint": "passed",
        "doctor": "passed",
    }
    assert doc["skipped"] == MOCK_SKIPS
    # Run by the bundle's gpumon on the lent machine's Python, not this checkout's.
    assert doc["facts"]["Python"].startswith("3.12.") and "/gpumon-site." in doc["facts"]["gpumon"]
    steps = {s["key"]: s for s in doc["steps"]}
    checks = {c["name"] for s in doc["steps"] for c in s["checks"]}
    assert {
        "NVML answers",
        "NVML lists the loop's process with its memory",
        "gpumon attributes the process's memory to pod team-a/train-000",
        "gpumon gives pod team-a/train-000 an SM share",
        "pod-resources' GPU is allocated to team-a/train-000",
        "no read failed other than not_supported",
        "no NVML check of gpumon doctor fails",
    } <= checks
    families = steps["families"]["figures"]
    # The H100 profile has no fan, and states no recovery action (its driver predates the field);
    # GPM runs on the mock (read for real on Hopper for the first time).
    assert families["not_supported"] == {
        "gpumon_gpu_fan_speed_ratio": "fan_speed",
        "DCGM_FI_DEV_FAN_SPEED": "fan_speed",
        "gpumon_gpu_recovery_action": "recovery_action",
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": "recovery_action",
    }
    assert families["missing"] == [] and "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in families["present"]
    assert steps["footprint"]["figures"]["gpumon"]["series"] > 100
    with tarfile.open(out / "report.tar.gz") as tar:
        kept = {Path(n).name for n in tar.getnames()}
    assert {
        "scrape-settled.txt",
        "nvml-view.json",
        "doctor.json",
        "exporter.log",
        "mock-profile.yaml",
    } <= kept
