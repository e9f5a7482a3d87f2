"""Doctor's pod-resources family against a gRPC server speaking the kubelet's v1 proto, against
no socket at all, and against a socket that never answers (its check ends at its timeout)."""

from __future__ import annotations

import socket as sockets
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from podresources_server import pod_resources, serve, short_socket_dir

from gpumon.config import ExporterConfig, PodsConfig
from gpumon.doctor import podresources
from gpumon.doctor.command import diagnose
from gpumon.doctor.result import CheckResult, Status
from gpumon.exporter.attribution import watched_resource

WATCHED = watched_resource(PodsConfig())


@pytest.fixture
def sock() -> Iterator[Path]:
    with short_socket_dir() as d:
        yield d / "kubelet.sock"


def check(path: Path, timeout: float = 5.0) -> CheckResult:
    (r,) = podresources.judge(podresources.gather(path, timeout_seconds=timeout), WATCHED)
    return r


def test_a_kubelet_answering_with_gpu_pods(sock: Path) -> None:
    with serve(sock) as kubelet:
        kubelet.pods = [
            pod_resources(
                "ml", "train", {"main": {"nvidia.com/gpu": ["GPU-a", "GPU-b"], "example.com/nic": ["x"]}}
            ),
            pod_resources("ml", "small", {"main": {"nvidia.com/mig-1g.10gb": ["MIG-c"]}}),
            pod_resources("web", "front", {"nginx": {}}),
        ]
        r = check(sock)
    assert r.status is Status.OK
    assert r.found == "answering: 3 pod(s); resources example.com/nic, nvidia.com/gpu, nvidia.com/mig-1g.10gb"
    assert r.details == (
        "example.com/nic: 1 device(s) assigned",
        "nvidia.com/gpu: 2 device(s) assigned",
        "nvidia.com/mig-1g.10gb: 1 device(s) assigned",
    )


def test_gpu_resources_the_exporter_does_not_watch_warn(sock: Path) -> None:
    with serve(sock) as kubelet:
        kubelet.pods = [pod_resources("ml", "p", {"c": {"nvidia.com/gpu.shared": ["GPU-a::1"]}})]
        r = check(sock)
    assert r.status is Status.WARN and r.found.endswith("not watched: nvidia.com/gpu.shared")
    assert "pods.resource_names" in r.fix


def test_an_idle_node(sock: Path) -> None:
    with serve(sock):
        r = check(sock)
    assert r.status is Status.OK and r.found == "answering: 0 pod(s); no device assigned to any pod now"


def test_no_socket_fails_with_the_mount_fix(sock: Path) -> None:
    r = check(sock)
    assert r.status is Status.FAIL and r.found == f"{sock} not found" and "hostPath" in r.fix


def test_a_file_that_is_not_a_socket(sock: Path) -> None:
    sock.touch()
    r = check(sock)
    assert r.status is Status.FAIL and "not a unix socket" in r.found


def test_a_kubelet_refusing_the_call(sock: Path) -> None:
    with serve(sock) as kubelet:
        kubelet.fail_with = grpc.StatusCode.PERMISSION_DENIED
        r = check(sock)
    assert r.status is Status.FAIL and r.found.endswith("(forbidden)") and "uid 0" in r.fix


def test_attribution_off_needs_no_socket(sock: Path) -> None:
    (r,) = podresources.judge(podresources.gather(sock, timeout_seconds=1, used=False), WATCHED)
    assert r.status is Status.OK and "not used" in r.found


@pytest.mark.timeout(60)
def test_a_socket_that_never_answers_ends_at_its_timeout(sock: Path, tmp_path: Path) -> None:
    # Connections land in the listen backlog and are never accepted: the kubelet is wedged.
    listener = sockets.socket(sockets.AF_UNIX)
    listener.bind(str(sock))
    listener.listen(8)
    config = ExporterConfig(
        node_name="n1",
        port=_free_port(),
        pods=PodsConfig(pod_resources_socket=sock, host_proc=tmp_path, api=False),
    )
    try:
        results, _ = diagnose(config, timeout_seconds=1.0, dev_root=tmp_path, platform="linux")
    finally:
        listener.close()
    (r,) = [r for r in results if r.family == "pod-resources"]
    assert r.status is Status.FAIL
    assert r.found.endswith("does not answer List (timeout)") or "no answer within 1s" in r.found
    assert r.seconds is not None and r.seconds <= 1.0


def _free_port() -> int:
    with sockets.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
