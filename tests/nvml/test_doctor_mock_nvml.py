"""``gpumon doctor`` on a machine whose NVML is NVIDIA's mock libnvidia-ml: the ok paths of the
NVML family, checked against the GPU profile's own YAML.

Skipped, with the Go module proxy's answer, while the mock is not in the tools cache (the
import below skips this module for the same reason as tests/nvml/test_mock_nvml.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from test_mock_nvml import LIBRARY, device_configs, load_profile


def test_doctor_reports_every_gpu_of_the_profile(tmp_path: Path) -> None:
    profile = load_profile("a100")
    config = tmp_path / "a100.yaml"
    config.write_text(yaml.safe_dump(profile))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_NVML_")}
    env |= {"MOCK_NVML_CONFIG": str(config), "NODE_NAME": "n1", "GPUMON_PODS__API": "false"}
    done = subprocess.run(
        [sys.executable, "-m", "gpumon.cli", "doctor", "--output", "json", "--nvml-library", str(LIBRARY)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    doc = json.loads(done.stdout)
    nvml = {c["name"]: c for c in doc["checks"] if c["family"] == "nvml"}
    configs = device_configs(profile)
    system = profile["system"]

    assert nvml["NVML"]["status"] == "ok"
    assert f"driver {system['driver_version']}" in nvml["NVML"]["found"]
    assert nvml["NVML"]["found"].endswith(f"{len(configs)} GPU(s)")
    assert nvml["GPUs"]["status"] == "ok"
    for line, cfg in zip(nvml["GPUs"]["details"], configs, strict=True):
        assert cfg["uuid"] in line and cfg["name"] in line
    assert nvml["Xid events"]["status"] == "ok"
    processes = {p["pid"] for cfg in configs for p in cfg.get("processes") or ()}
    assert nvml["process listing"]["found"].startswith(f"{len(processes)} process(es)")
    assert done.returncode == doc["exit_code"]
