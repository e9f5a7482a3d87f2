"""What the NVML tier shares: NVIDIA's mock libnvidia-ml located in the tools cache, its GPU
profiles read as the mock reads them, child-process environments, and ``gpumon exporter
--backend nvml`` as a real process scraped until a condition holds.

NVML is one library per process and the mock reads ``MOCK_NVML_CONFIG`` once, so everything
that loads the library runs in a child process with ``LD_LIBRARY_PATH`` at the cache's ``lib/``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from metrics_text import Series, free_port, parse, select

from gpumon.devcluster.binaries import MockNvml

MiB = 2**20
PROFILES = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")
# Other suites share this machine's two cores: be patient, and never sleep to pass.
DEADLINE = 60.0

# The profile's clocks_throttle_reasons keys, as gpumon names them (model.CLOCK_EVENT_REASONS):
# both follow NVML's nvmlClocksEventReason* bits, with different spellings.
REASON_NAMES = {
    "gpu_idle": "gpu_idle",
    "applications_clocks_setting": "applications_clocks_setting",
    "sw_power_cap": "sw_power_cap",
    "hw_slowdown": "hw_slowdown",
    "sync_boost": "sync_boost",
    "sw_thermal_slowdown": "sw_thermal",
    "hw_thermal_slowdown": "hw_thermal",
    "hw_power_brake_slowdown": "hw_power_brake",
    "display_clocks_setting": "display_clock_setting",
}


# A100 40GB MIG devices as NVIDIA's tools name and size them: GPU instance 1 (3g.20gb) split
# into two compute instances, a 2g.10gb and a 1g.5gb.
A100_MIG = [
    {"uuid": "MIG-3a1c0e7e-5b1f-5d6e-9a43-3c1b6a2f0001", "profile": "1c.3g.20gb", "gpu_instance_id": 1,
     "compute_instance_id": 0, "gpu_instance_slices": 3, "compute_instance_slices": 1,
     "multiprocessor_count": 14, "memory_mib": 19968, "used_memory_mib": 2048},
    {"uuid": "MIG-3a1c0e7e-5b1f-5d6e-9a43-3c1b6a2f0002", "profile": "2c.3g.20gb", "gpu_instance_id": 1,
     "compute_instance_id": 1, "gpu_instance_slices": 3, "compute_instance_slices": 2,
     "multiprocessor_count": 28, "memory_mib": 19968},
    {"uuid": "MIG-3a1c0e7e-5b1f-5d6e-9a43-3c1b6a2f0003", "profile": "2g.10gb", "gpu_instance_id": 5,
     "compute_instance_id": 0, "gpu_instance_slices": 2, "compute_instance_slices": 2,
     "multiprocessor_count": 28, "memory_mib": 9984, "used_memory_mib": 512},
    {"uuid": "MIG-3a1c0e7e-5b1f-5d6e-9a43-3c1b6a2f0004", "profile": "1g.5gb", "gpu_instance_id": 13,
     "compute_instance_id": 0, "gpu_instance_slices": 1, "compute_instance_slices": 1,
     "multiprocessor_count": 14, "memory_mib": 4864},
]  # fmt: skip


# -- the profile's own word ---------------------------------------------------------------------


def load_profile(mock: MockNvml, name: str) -> dict[str, Any]:
    with mock.profile(name).open() as f:
        profile: dict[str, Any] = yaml.safe_load(f)
    return profile


# The blocks of a device's own entry that replace the defaults' (engine/config.go,
# mergeDeviceOverride; `mig` and `recovery_action` by our patches). Others in a device entry
# are ignored by the mock.
_DEVICE_BLOCKS = frozenset({
    "uuid", "name", "serial", "brand", "board_part_number", "vbios_version", "architecture",
    "memory", "bar1_memory", "power", "thermal", "clocks", "clocks_throttle_reasons",
    "utilization", "ecc", "dynamic_metrics", "failure", "processes", "mig", "recovery_action",
})  # fmt: skip


def device_configs(profile: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each GPU's configuration as the mock builds it: the defaults, with the blocks of the
    device's own entry that the mock merges replacing theirs whole, and its PCI bus id."""
    count = profile.get("system", {}).get("num_devices") or len(profile["devices"])
    by_index = {d["index"]: d for d in profile["devices"]}
    out = []
    for i in range(min(count, 8)):
        own = by_index.get(i, {})
        cfg = copy.deepcopy(dict(profile["device_defaults"]))
        cfg |= {k: copy.deepcopy(v) for k, v in own.items() if k in _DEVICE_BLOCKS}
        cfg["pci"] = {**cfg.get("pci", {}), **own.get("pci", {})}
        out.append(cfg)
    return out


def with_device(profile: Mapping[str, Any], index: int, **fields: Any) -> dict[str, Any]:
    """A copy of the profile whose GPU ``index`` also carries ``fields`` (whole blocks)."""
    out = copy.deepcopy(dict(profile))
    entry = next(d for d in out["devices"] if d["index"] == index)
    entry.update(copy.deepcopy(fields))
    return out


def write_profile(profile: Mapping[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(dict(profile)))
    return path


def mig_block(cfg: Mapping[str, Any], instances: list[dict[str, Any]]) -> dict[str, Any]:
    """MIG on, with these instances (hack/tools/mocknvml/patches/0001-mig-instances.patch)."""
    return {**cfg["mig"], "mode_current": "enabled", "mode_pending": "enabled", "instances": instances}


# -- child processes ----------------------------------------------------------------------------


def child_env(
    mock: MockNvml | None, config: Path | None, *, overrides: Path | None = None, **extra: str
) -> dict[str, str]:
    """This process's environment without any MOCK_NVML_ setting of its own, plus the mock's
    configuration and the library's directory first on the loader path (``mock=None``: left
    off, so that no libnvidia-ml can be found)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOCK_NVML_", "GPUMON_"))}
    env.pop("LD_LIBRARY_PATH", None)
    if mock is not None:
        env["LD_LIBRARY_PATH"] = str(mock.lib_dir)
    if config is not None:
        env["MOCK_NVML_CONFIG"] = str(config)
    if overrides is not None:
        env |= {"MOCK_NVML_OVERRIDES": str(overrides), "MOCK_NVML_OVERRIDES_TTL": "100ms"}
    return env | extra


def value(series: Series, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` matching ``labels`` (None when there is none)."""
    found = select(series, name, **labels)
    assert len(found) <= 1, (name, labels, found)
    return next(iter(found.values()), None)


class Exporter:
    """``gpumon exporter --backend nvml`` on a free loopback port, logging to ``log``."""

    def __init__(self, env: Mapping[str, str], log: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.argv = [
            sys.executable, "-m", "gpumon.cli", "exporter", "--backend", "nvml", "--node-name", "nvml-node",
            "--listen-address", "127.0.0.1", "--port", str(self.port),
            "--fast-interval", "0.25", "--slow-interval", "0.5", *args,
        ]  # fmt: skip
        self.env = dict(env)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Exporter:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def stop(self) -> None:
        """SIGTERM, as the kubelet stops it, then wait (killed after 15 s)."""
        if self.process is None:
            return
        self.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Exporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()

    def scrape(self) -> Series | None:
        """The current /metrics, or None while the exporter does not serve one yet."""
        try:
            status, body = self.get("/metrics")
        except OSError:
            return None
        return parse(body) if status == 200 else None

    def until(self, condition: Callable[[Series], bool], what: str, deadline: float = DEADLINE) -> Series:
        """The first scrape for which ``condition`` holds; fails after ``deadline`` seconds
        with the last scrape's relevant part and the exporter's log."""
        start = time.monotonic()
        last: Series | None = None
        while time.monotonic() - start < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"exporter exited ({self.process.returncode}):\n{self.log_text()}")
            series = self.scrape()
            if series is not None:
                last = series
                if condition(series):
                    return series
            time.sleep(0.05)
        raise AssertionError(
            f"{what}: not within {deadline} s; last scrape had {len(last or {})} series\n{self.log_text()}"
        )

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@contextlib.contextmanager
def running(*exporters: Exporter) -> Iterator[tuple[Exporter, ...]]:
    """Start them all at once (their start-up overlaps), stop them all after."""
    try:
        for e in exporters:
            e.start()
        yield exporters
    finally:
        # Each takes up to its Xid wait (1 s) to stop: let them stop side by side.
        for e in exporters:
            e.terminate()
        for e in exporters:
            e.stop()
