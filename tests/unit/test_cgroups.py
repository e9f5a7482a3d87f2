"""Process -> container resolution from a generated host /proc tree."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pytest
from fake_host_proc import (
    DRIVERS,
    QOS_CLASSES,
    RUNTIMES,
    VERSIONS,
    cgroup_file,
    container_path,
    write_process,
)

from gpumon.exporter.cgroups import ContainerKey, Unmatched, parse_cgroup
from gpumon.exporter.process_pods import ProcessPods, start_time

COMBINATIONS = list(itertools.product(VERSIONS, DRIVERS, RUNTIMES, QOS_CLASSES))
UID = "0b6c4a71-2f6d-4d3a-9a51-5f0f2a7c1e11"
CID = "3f" * 32
SD_UID = UID.replace("-", "_")  # how systemd slice names spell it


def _ids(n: int) -> tuple[str, str]:
    return str(uuid.UUID(int=n + 1)), f"{n + 1:064x}"


class Errors:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, source: str, kind: str) -> None:
        self.seen.append((source, kind))


@pytest.mark.parametrize(("version", "driver", "runtime", "qos"), COMBINATIONS)
def test_every_runtime_driver_and_qos(version: int, driver: str, runtime: str, qos: str) -> None:
    text = cgroup_file(container_path(driver, runtime, qos, UID, CID), version)
    assert parse_cgroup(text) == ContainerKey(UID, CID)


def test_generated_tree_resolves_every_process(tmp_path: Path) -> None:
    expected = {}
    for n, (version, driver, runtime, qos) in enumerate(COMBINATIONS):
        pid = 1000 + n
        uid, cid = _ids(n)
        write_process(tmp_path, pid, cgroup_file(container_path(driver, runtime, qos, uid, cid), version))
        expected[pid] = ContainerKey(uid, cid)
    errors = Errors()
    procs = ProcessPods(tmp_path, errors)
    assert all(procs.lookup(pid) is None for pid in expected)  # nothing read on the tick path
    procs.resolve()
    assert {pid: procs.lookup(pid) for pid in expected} == expected
    assert errors.seen == []


@pytest.mark.parametrize(
    "path",
    [
        # The exporter's own cgroup namespace hides the common prefix of its path and the target's.
        f"/../../kubepods-besteffort.slice/kubepods-besteffort-pod{SD_UID}.slice/cri-containerd-{CID}.scope",
        f"/../../kubepods-pod{SD_UID}.slice/crio-{CID}.scope",
        f"/../../burstable/pod{UID}/{CID}",
        # kind and other nested kubelets: a cgroup root of /kubelet under the systemd driver.
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        f"kubelet-kubepods-burstable-pod{SD_UID}.slice/cri-containerd-{CID}.scope",
        # Docker-in-Docker nodes put the kubelet's tree under the node container's cgroup.
        f"/docker/{'ab' * 32}/kubepods/besteffort/pod{UID}/{CID}",
        # Sub-cgroups a container makes for itself (systemd inside, or nested runtimes).
        f"/kubepods.slice/kubepods-pod{SD_UID}.slice/cri-containerd-{CID}.scope/init.scope",
    ],
)
def test_namespaced_nested_and_rooted_paths(path: str) -> None:
    assert parse_cgroup(f"0::{path}\n") == ContainerKey(UID, CID)


def test_static_pod_uid_is_a_hash() -> None:
    digest = "6f1d3b2a9c8e7f6d5c4b3a2918273645"
    assert parse_cgroup(f"0::/kubepods/besteffort/pod{digest}/{CID}\n") == ContainerKey(digest, CID)


def test_process_in_the_pod_cgroup_itself() -> None:
    assert parse_cgroup(f"0::/kubepods/burstable/pod{UID}\n") == ContainerKey(UID, "")


def test_v1_lines_disagreeing_first_container_wins() -> None:
    text = f"5:memory:/kubepods/pod{UID}/{CID}\n4:cpu:/\n0::/\n"
    assert parse_cgroup(text) == ContainerKey(UID, CID)


@pytest.mark.parametrize(
    ("text", "outcome"),
    [
        ("0::/system.slice/containerd.service\n", Unmatched.NOT_A_POD),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", Unmatched.NOT_A_POD),
        ("0::/\n", Unmatched.NOT_A_POD),
        ("12:memory:/\n11:cpu:/\n", Unmatched.NOT_A_POD),
        (
            f"0::/kubepods.slice/kubepods-pod{SD_UID}.slice/crio-conmon-{CID}.scope\n",
            Unmatched.NOT_A_POD,
        ),
        ("", Unmatched.EMPTY),
        ("\n\n", Unmatched.EMPTY),
        ("this is not a cgroup file\n", Unmatched.MALFORMED),
        ("memory:/kubepods/pod1\n", Unmatched.MALFORMED),
        (f"0::/kubepods/burstable/pod{UID}/not-a-container-id\n", Unmatched.UNKNOWN_FORMAT),
        (f"0::/kubepods/burstable/pod{UID}/{CID[:12]}\n", Unmatched.UNKNOWN_FORMAT),
        # systemd names containers by runtime scope, cgroupfs never does.
        (f"0::/kubepods.slice/kubepods-pod{SD_UID}.slice/{CID}\n", Unmatched.UNKNOWN_FORMAT),
        (f"0::/kubepods/pod{UID}/cri-containerd-{CID}.scope\n", Unmatched.UNKNOWN_FORMAT),
        (
            f"0::/kubepods.slice/kubepods-pod{SD_UID}.slice/runc-{CID}.scope\n",
            Unmatched.UNKNOWN_FORMAT,
        ),
        ("0::/kubepods/burstable/podnot-a-uid/abc\n", Unmatched.UNKNOWN_FORMAT),
    ],
)
def test_unmatched(text: str, outcome: Unmatched) -> None:
    assert parse_cgroup(text) is outcome


def test_unknown_formats_are_counted_once_per_process_and_never_fatal(tmp_path: Path) -> None:
    write_process(tmp_path, 10, f"0::/kubepods/burstable/pod{UID}/junk\n")
    write_process(tmp_path, 11, "garbage\n")
    write_process(tmp_path, 12, "0::/system.slice/sshd.service\n")
    write_process(
        tmp_path, 13, cgroup_file(container_path("systemd", "containerd", "burstable", UID, CID), 2)
    )
    (tmp_path / "14").mkdir()
    (tmp_path / "14" / "stat").write_text("garbled")  # 15 has no directory: the process is gone
    errors = Errors()
    procs = ProcessPods(tmp_path, errors)
    for _ in range(3):
        for pid in (10, 11, 12, 13, 14, 15):
            procs.lookup(pid)
        procs.resolve()
    assert procs.lookup(13) == ContainerKey(UID, CID)
    assert [procs.lookup(p) for p in (10, 11, 12, 14, 15)] == [None] * 5
    assert errors.seen.count(("proc", "unknown_format")) == 1
    assert errors.seen.count(("proc", "malformed")) == 1 + 3  # cgroup once (cached); bad stat each pass


def test_recycled_pid_is_read_again(tmp_path: Path) -> None:
    other_uid, other_cid = _ids(99)
    write_process(tmp_path, 42, cgroup_file(container_path("cgroupfs", "docker", "besteffort", UID, CID), 1))
    procs = ProcessPods(tmp_path, Errors())
    procs.lookup(42)
    procs.resolve()
    assert procs.lookup(42) == ContainerKey(UID, CID)
    # Same pid, a new process: another start time and another container.
    write_process(
        tmp_path,
        42,
        cgroup_file(container_path("cgroupfs", "docker", "besteffort", other_uid, other_cid), 1),
        start_time=5000,
    )
    procs.resolve()
    assert procs.lookup(42) == ContainerKey(other_uid, other_cid)


def test_same_process_is_not_read_twice(tmp_path: Path) -> None:
    write_process(tmp_path, 42, cgroup_file(container_path("cgroupfs", "docker", "besteffort", UID, CID), 1))
    procs = ProcessPods(tmp_path, Errors())
    procs.lookup(42)
    procs.resolve()
    # Same start time: the cached answer stands even if the file changed (it cannot, really).
    (tmp_path / "42" / "cgroup").write_text("0::/elsewhere\n")
    procs.lookup(42)
    procs.resolve()
    assert procs.lookup(42) == ContainerKey(UID, CID)


def test_processes_no_longer_on_a_gpu_leave_the_cache(tmp_path: Path) -> None:
    cgroup = cgroup_file(container_path("cgroupfs", "containerd", "burstable", UID, CID), 2)
    for pid in range(100, 110):
        write_process(tmp_path, pid, cgroup)
    procs = ProcessPods(tmp_path, Errors())
    for pid in range(100, 110):
        procs.lookup(pid)
    procs.resolve()
    assert len(procs) == 10
    procs.lookup(100)
    procs.resolve()
    assert len(procs) == 1
    procs.resolve()
    assert len(procs) == 0


@pytest.mark.parametrize(
    ("stat", "expected"),
    [
        ("42 (python3) S 1 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 777 123 4", 777),
        ("42 (a) b) c) S 1 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 778 123 4", 778),
        ("42 (short) S 1", None),
        ("no parenthesis", None),
    ],
)
def test_start_time(stat: str, expected: int | None) -> None:
    assert start_time(stat) == expected
