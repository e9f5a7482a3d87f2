"""Writes a host /proc tree (``<pid>/stat`` and ``<pid>/cgroup``) as a kubelet node would show it,
for every cgroup version, cgroup driver, container runtime and QoS class."""

from __future__ import annotations

from pathlib import Path

VERSIONS = (1, 2)
DRIVERS = ("cgroupfs", "systemd")
RUNTIMES = ("containerd", "cri-o", "docker")
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")

_V1_CONTROLLERS = (
    "pids",
    "hugetlb",
    "net_cls,net_prio",
    "perf_event",
    "memory",
    "cpu,cpuacct",
    "devices",
    "freezer",
    "blkio",
    "rdma",
    "cpuset",
    "name=systemd",
)
_SCOPE_PREFIX = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}


def container_path(driver: str, runtime: str, qos: str, pod_uid: str, container_id: str) -> str:
    """The cgroup of a container as the kubelet and its runtime name it."""
    if driver == "cgroupfs":
        qos_dir = "" if qos == "guaranteed" else f"/{qos}"
        leaf = f"crio-{container_id}" if runtime == "cri-o" else container_id
        return f"/kubepods{qos_dir}/pod{pod_uid}/{leaf}"
    uid = pod_uid.replace("-", "_")
    if qos == "guaranteed":
        pod_slice = f"/kubepods.slice/kubepods-pod{uid}.slice"
    else:
        pod_slice = f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice"
    return f"{pod_slice}/{_SCOPE_PREFIX[runtime]}-{container_id}.scope"


def cgroup_file(path: str, version: int) -> str:
    """``/proc/<pid>/cgroup`` of a process in ``path``: one line per v1 hierarchy (plus the empty
    unified line of hybrid mode), or the single v2 line."""
    if version == 2:
        return f"0::{path}\n"
    # rdma is the one controller the kubelet does not manage: its processes stay at its root.
    lines = [
        f"{i}:{c}:{'/' if c == 'rdma' else path}"
        for i, c in zip(range(len(_V1_CONTROLLERS), 0, -1), _V1_CONTROLLERS, strict=True)
    ]
    return "\n".join([*lines, "0::/"]) + "\n"


def stat_line(pid: int, start_time: int, comm: str = "python3") -> str:
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(start_time)]
    fields += ["1234567", "890"] + ["0"] * 30
    return f"{pid} ({comm}) {' '.join(fields)}\n"


def write_process(
    root: Path, pid: int, cgroup: str, *, start_time: int = 1000, comm: str = "python3"
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(stat_line(pid, start_time, comm))
    (d / "cgroup").write_text(cgroup)
