"""Pods in the real API server of the local control plane, running on a kwok node the way a
kubelet and its container runtime would leave them, for tests that attribute host processes
to pods: the pod is created bound to the node, kwok runs it, and the test plays the runtime's
part, patching ``status.containerStatuses[].containerID`` through the status subresource.

The API server chooses the pod's UID, so the host /proc tree naming its cgroups is written
after the pod exists: :meth:`RunningPod.write_process`."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fake_host_proc import cgroup_file, container_path, write_process
from kubernetes_asyncio import client

from gpumon.devcluster.waiting import eventually

IMAGE = "cuda:12"


@dataclass(frozen=True)
class RunningPod:
    """A pod as the API server has it, with the runtime container ID of each container."""

    namespace: str
    name: str
    uid: str
    container_ids: Mapping[str, str]  # container name -> bare runtime ID (no ``containerd://``)

    def cgroup_path(self, container: str, *, driver: str = "systemd", qos: str = "burstable") -> str:
        """The cgroup containerd gives ``container`` of this pod."""
        return container_path(driver, "containerd", qos, self.uid, self.container_ids[container])

    def write_process(self, host_proc: Path, pid: int, container: str, *, cgroup_version: int = 2) -> None:
        """Process ``pid`` in ``container`` of this pod, in the host /proc tree ``host_proc``."""
        write_process(host_proc, pid, cgroup_file(self.cgroup_path(container), cgroup_version))


def pod_manifest(
    name: str,
    node: str,
    containers: Mapping[str, Mapping[str, str]],
    *,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod bound to ``node`` (no scheduler involved) whose containers (name -> resource
    limits) run :data:`IMAGE`."""
    return {
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": c, "image": IMAGE, "resources": {"limits": dict(limits)}}
                for c, limits in containers.items()
            ],
        },
    }


async def create_namespace(core: client.CoreV1Api, name: str) -> None:
    """Create namespace ``name`` and wait for its ``default`` service account, without which
    the API server refuses pods."""
    await core.create_namespace({"metadata": {"name": name}})
    await eventually(lambda: _default_account(core, name), what=f"service account default in {name}")


async def run_pods(
    core: client.CoreV1Api, namespace: str, manifests: Iterable[Mapping[str, Any]]
) -> dict[str, RunningPod]:
    """Create the pods, wait until kwok has them Running, give each container a runtime ID in
    the pod's status, as the kubelet reports what containerd started; by pod name."""
    bodies = list(manifests)
    for body in bodies:
        await core.create_namespaced_pod(namespace, body)
    started = await asyncio.gather(*(running_pod(core, namespace, body) for body in bodies))
    return {p.name: p for p in started}


async def running_pod(core: client.CoreV1Api, namespace: str, manifest: Mapping[str, Any]) -> RunningPod:
    """Once kwok has the pod (``manifest``: its name and containers, or the pod itself as JSON)
    Running, give each container a runtime ID in its status, as the kubelet reports them."""
    name = manifest["metadata"]["name"]
    await eventually(lambda: _running(core, namespace, name), what=f"pod {namespace}/{name} Running")
    ids = {c["name"]: secrets.token_hex(32) for c in manifest["spec"]["containers"]}
    pod = await core.patch_namespaced_pod_status(name, namespace, _status_with_ids(ids))
    return RunningPod(namespace, name, pod.metadata.uid, ids)


async def _default_account(core: client.CoreV1Api, namespace: str) -> bool | None:
    accounts = await core.list_namespaced_service_account(namespace)
    return True if any(a.metadata.name == "default" for a in accounts.items) else None


async def _running(core: client.CoreV1Api, namespace: str, name: str) -> bool | None:
    pod = await core.read_namespaced_pod(name, namespace)
    return True if pod.status.phase == "Running" else None


def _status_with_ids(container_ids: Mapping[str, str]) -> dict[str, Any]:
    return {
        "status": {
            "containerStatuses": [
                {
                    "name": container,
                    "containerID": f"containerd://{cid}",
                    "image": IMAGE,
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {}},
                }
                for container, cid in container_ids.items()
            ]
        }
    }
