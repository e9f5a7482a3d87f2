"""Doctor's /proc family on generated host /proc trees of every cgroup layout."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pytest
from fake_host_proc import DRIVERS, RUNTIMES, VERSIONS, cgroup_file, container_path, write_process

from gpumon.doctor import proc
from gpumon.doctor.result import CheckResult, Status

HOST_INIT = {1: "/init.scope", 2: "/init.scope"}


def container_id(n: int) -> str:
    return f"{n:064x}"


def host_tree(
    root: Path, version: int, driver: str, runtime: str, *, pods: int = 3, init: str | None = None
) -> list[int]:
    """PID 1 (the host's init, unless ``init`` is another cgroup path), a host daemon, and one
    process per pod; returns the pods' pids."""
    write_process(root, 1, cgroup_file(init or HOST_INIT[version], version))
    write_process(root, 500, cgroup_file("/system.slice/containerd.service", version))
    pids = []
    for i, qos in zip(range(pods), itertools.cycle(("guaranteed", "burstable", "besteffort")), strict=False):
        pid = 1000 + i
        path = container_path(driver, runtime, qos, str(uuid.UUID(int=i + 1)), container_id(i + 1))
        write_process(root, pid, cgroup_file(path, version))
        pids.append(pid)
    return pids


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


@pytest.mark.parametrize(
    ("version", "driver", "runtime"), list(itertools.product(VERSIONS, DRIVERS, RUNTIMES))
)
def test_every_cgroup_layout_is_detected(tmp_path: Path, version: int, driver: str, runtime: str) -> None:
    pids = host_tree(tmp_path, version, driver, runtime)
    expected = {1: "v1 (hybrid)", 2: "v2"}[version]  # the generated v1 files carry the unified line

    sampled = by_name(proc.judge(proc.gather(tmp_path, None)))
    assert sampled["cgroup layout"].status is Status.OK
    assert sampled["cgroup layout"].found == f"cgroup {expected}, {driver} driver (from 3 pod process(es))"
    assert all(r.status is Status.OK for r in sampled.values()), sampled

    from_gpus = by_name(proc.judge(proc.gather(tmp_path, tuple(pids[:2]))))
    assert (
        from_gpus["cgroup layout"].found == f"cgroup {expected}, {driver} driver (from 2 pod GPU process(es))"
    )
    assert from_gpus["hostPID"].found.endswith("all 2 GPU process(es) found")


def test_pure_v1_without_the_unified_hierarchy() -> None:
    text = "12:memory:/kubepods/burstable/pod1/abc\n11:cpu,cpuacct:/kubepods/burstable/pod1/abc\n"
    assert proc.cgroup_version(text) == "v1"
    assert proc.cgroup_driver(text) == "cgroupfs"
    assert proc.cgroup_driver("0::/init.scope\n") is None


def test_a_container_pid_namespace_hides_other_pods(tmp_path: Path) -> None:
    # The exporter without hostPID: its own /proc, whose PID 1 is its own container.
    own = container_path("systemd", "containerd", "burstable", str(uuid.UUID(int=99)), container_id(99))
    host_tree(tmp_path, 2, "systemd", "containerd", pods=0, init=own)
    r = by_name(proc.judge(proc.gather(tmp_path, None)))["hostPID"]
    assert r.status is Status.WARN and "other pods' processes are not visible" in r.found
    assert "hostPID: true" in r.fix


def test_gpu_processes_missing_from_proc_mean_another_pid_namespace(tmp_path: Path) -> None:
    pids = host_tree(tmp_path, 2, "systemd", "containerd")
    r = by_name(proc.judge(proc.gather(tmp_path, (pids[0], 4242, 4343))))["hostPID"]
    assert r.status is Status.WARN
    assert r.found.startswith("2 of 3 GPU process(es) NVML lists are not under") and "PID 4242" in r.found


def test_gpu_processes_outside_pods_are_fine(tmp_path: Path) -> None:
    host_tree(tmp_path, 2, "systemd", "containerd", pods=0)
    r = by_name(proc.judge(proc.gather(tmp_path, (500,))))["cgroup layout"]
    assert r.status is Status.OK and "nothing to attribute" in r.found


def test_cgroup_lines_that_do_not_parse_are_shown(tmp_path: Path) -> None:
    host_tree(tmp_path, 2, "systemd", "containerd")
    odd = "0::/kubepods.slice/kubepods-pod0a1b.slice/something-else\n"
    write_process(tmp_path, 2000, odd)
    write_process(tmp_path, 2001, "not a cgroup file\n")
    r = by_name(proc.judge(proc.gather(tmp_path, None)))["cgroup lines"]
    assert r.status is Status.WARN and r.found.startswith("2 process(es)")
    assert r.details == ("PID 2000: " + odd.strip(), "PID 2001: not a cgroup file")


def test_a_node_with_two_layouts_warns(tmp_path: Path) -> None:
    host_tree(tmp_path, 2, "systemd", "containerd", pods=1)
    path = container_path("cgroupfs", "containerd", "burstable", str(uuid.UUID(int=7)), container_id(7))
    write_process(tmp_path, 3000, cgroup_file(path, 2))
    r = by_name(proc.judge(proc.gather(tmp_path, None)))["cgroup layout"]
    assert r.status is Status.WARN and r.found.startswith("mixed: cgroup v2, systemd, cgroupfs driver")


def test_no_pods_under_proc_warns(tmp_path: Path) -> None:
    host_tree(tmp_path, 2, "systemd", "containerd", pods=0)
    r = by_name(proc.judge(proc.gather(tmp_path, None)))["cgroup layout"]
    assert r.status is Status.WARN and "--host-proc" in r.fix


def test_host_proc_not_mounted(tmp_path: Path) -> None:
    (r,) = proc.judge(proc.gather(tmp_path / "host" / "proc", None))
    assert r.status is Status.FAIL and r.name == "host /proc" and "No such file" in r.found
    assert "hostPath /proc" in r.fix
