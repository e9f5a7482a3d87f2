"""``gpumon doctor`` on a machine whose NVML is NVIDIA's mock libnvidia-ml: the ok paths of the
NVML family, checked against the GPU profile's own YAML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nvml_mock import child_env, device_configs, load_profile, with_device, write_profile

from gpumon.devcluster.binaries import MockNvml


def test_doctor_reports_every_gpu_of_the_profile(mock: MockNvml, tmp_path: Path) -> None:
    processes = [
        {"pid": 4242, "type": "C", "name": "train", "used_memory_mib": 1024, "sm_util": 60},
        {"pid": 4343, "type": "C", "name": "eval", "used_memory_mib": 512, "sm_util": 10},
    ]
    profile = with_device(load_profile(mock, "a100"), 2, processes=processes)
    config = write_profile(profile, tmp_path / "a100.yaml")
    # The library by --nvml-library alone, as on a node whose driver is mounted elsewhere.
    env = child_env(None, config, NODE_NAME="n1", GPUMON_PODS__API="false")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpumon.cli",
            "doctor",
            "--output",
            "json",
            "--nvml-library",
            str(mock.library),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    doc = json.loads(done.stdout)
    nvml = {c["name"]: c for c in doc["checks"] if c["family"] == "nvml"}
    configs = device_configs(profile)
    system = profile["system"]

    assert {name: c["status"] for name, c in nvml.items()} == {
        "NVML": "ok",
        "GPUs": "ok",
        "persistence mode": "ok",
        "Xid events": "ok",
        "process listing": "ok",
    }
    assert f"driver {system['driver_version']}" in nvml["NVML"]["found"]
    assert nvml["NVML"]["found"].endswith(f"{len(configs)} GPU(s)")
    for line, cfg in zip(nvml["GPUs"]["details"], configs, strict=True):
        assert cfg["uuid"] in line and cfg["name"] in line
    assert nvml["Xid events"]["found"] == f"registered on {len(configs)} GPU(s)"
    assert nvml["process listing"]["found"].startswith("2 process(es) on 1 GPU(s)")
    assert done.returncode == doc["exit_code"]
