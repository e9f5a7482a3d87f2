"""Doctor's Kubernetes API family: judging what the API said, and running with no credentials
(against the real API server: tests/cluster/test_doctor.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.doctor import kubeapi
from gpumon.doctor.kubeapi import KubeFacts
from gpumon.doctor.result import Status


def test_no_credentials_fails_with_the_fix(tmp_path: Path) -> None:
    facts = kubeapi.gather("n1", node_from_env=True, timeout_seconds=5, kubeconfig=tmp_path / "none")
    node, api = kubeapi.judge(facts)
    assert node.status is Status.OK
    assert api.status is Status.FAIL and "no_credentials" in api.found
    assert "automountServiceAccountToken" in api.fix


def test_api_not_read_by_the_exporter() -> None:
    _, api = kubeapi.judge(kubeapi.gather("n1", node_from_env=True, timeout_seconds=5, used=False))
    assert api.status is Status.OK and "not used" in api.found


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("forbidden", "ClusterRole"),
        ("unauthorized", "fresh service account token"),
        ("unreachable", "network"),
    ],
)
def test_each_api_failure_has_its_fix(kind: str, words: str) -> None:
    _, api = kubeapi.judge(KubeFacts("n1", True, True, error_kind=kind, error="..."))
    assert api.status is Status.FAIL and words in api.fix
    assert api.found.startswith(f"as the pod's service account: {kind}")


def test_node_name_from_the_host_name_is_wrong_inside_a_pod() -> None:
    node, _ = kubeapi.judge(KubeFacts("exporter-x7k2p", False, True, pods_on_node=0))
    assert node.status is Status.FAIL and "spec.nodeName" in node.fix
    node, _ = kubeapi.judge(KubeFacts("gpu-node-1", False, False, pods_on_node=3))
    assert node.status is Status.WARN


def test_no_pod_on_the_node_from_inside_a_pod_means_a_wrong_node_name() -> None:
    _, api = kubeapi.judge(KubeFacts("typo", True, True, pods_on_node=0))
    assert api.status is Status.WARN and "is the node name right?" in api.found
    _, api = kubeapi.judge(KubeFacts("gpu-1", True, True, pods_on_node=500, more=True))
    assert (api.status, api.found) == (Status.OK, "as the pod's service account: 500+ pod(s) on node gpu-1")
