"""The kubelet's pod-resources socket: present, answering, and which resources it reports.

Asked through the exporter's own client (:class:`PodResourcesClient`), with every resource
watched so that names the exporter would ignore show up too.
"""

from __future__ import annotations

import asyncio
import stat
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpumon.doctor.result import CheckResult, Status
from gpumon.exporter.podresources_client import DeviceAssignment, PodResourcesClient

FAMILY = "pod-resources"
NAME = "pod-resources socket"
MOUNT_FIX = (
    "mount the kubelet's /var/lib/kubelet/pod-resources into the pod (hostPath, the chart's "
    "podAttribution.podResourcesDir) or set pods.pod_resources_socket"
)
_FIXES = {
    "forbidden": "run the exporter as uid 0: the socket belongs to root",
    "unavailable": (
        "the kubelet does not answer on it: is the mount the live kubelet directory? "
        "(restart the pod after a kubelet restart)"
    ),
    "timeout": "the kubelet accepted the connection but never answered: check the kubelet on the node",
    "unimplemented": "the kubelet is older than the v1 pod-resources API (Kubernetes 1.20)",
}


@dataclass(frozen=True, slots=True)
class PodResourcesFacts:
    socket: str
    used: bool = True  # False when pod attribution is off
    exists: bool = False
    is_socket: bool = False
    error_kind: str | None = None  # the exporter's error-metric kind
    pods: int = 0
    # resource name -> devices assigned to running containers
    resources: dict[str, int] = field(default_factory=dict)


def gather(socket: Path, *, timeout_seconds: float, used: bool = True) -> PodResourcesFacts:
    if not used:
        return PodResourcesFacts(str(socket), used=False)
    try:
        mode = socket.stat().st_mode
    except OSError:
        return PodResourcesFacts(str(socket))
    if not stat.S_ISSOCK(mode):
        return PodResourcesFacts(str(socket), exists=True)
    kinds: list[str] = []
    client = PodResourcesClient(
        socket,
        lambda source, kind: kinds.append(kind),
        lambda resource: True,  # every resource: also those the exporter would not watch
        timeout_seconds=timeout_seconds,
    )

    asyncio.run(client.poll())
    resources: Counter[str] = Counter()
    for containers in (client.view or {}).values():
        for assignments in containers.values():
            for a in assignments:
                if isinstance(a, DeviceAssignment):  # no DRA drivers asked for: the only kind
                    resources[a.resource] += len(a.device_ids)
    return PodResourcesFacts(
        str(socket),
        exists=True,
        is_socket=True,
        error_kind=kinds[0] if kinds else None,
        pods=len(client.view or {}),
        resources=dict(resources),
    )


def judge(facts: PodResourcesFacts, watched: Callable[[str], bool]) -> list[CheckResult]:
    if not facts.used:
        return [CheckResult(FAMILY, NAME, Status.OK, "not used: pod attribution is off (pods.enabled)")]
    if not facts.exists:
        return [CheckResult(FAMILY, NAME, Status.FAIL, f"{facts.socket} not found", MOUNT_FIX)]
    if not facts.is_socket:
        return [CheckResult(FAMILY, NAME, Status.FAIL, f"{facts.socket} is not a unix socket", MOUNT_FIX)]
    if facts.error_kind is not None:
        fix = _FIXES.get(facts.error_kind, "check the kubelet's log on the node")
        found = f"{facts.socket} does not answer List ({facts.error_kind})"
        return [CheckResult(FAMILY, NAME, Status.FAIL, found, fix)]
    names = sorted(facts.resources)
    details = tuple(f"{r}: {facts.resources[r]} device(s) assigned" for r in names)
    found = f"answering: {facts.pods} pod(s)"
    found += "; resources " + ", ".join(names) if names else "; no device assigned to any pod now"
    ignored = [r for r in names if not watched(r) and ("gpu" in r or r.startswith("nvidia.com/"))]
    if ignored:
        return [
            CheckResult(
                FAMILY,
                NAME,
                Status.WARN,
                f"{found}; not watched: {', '.join(ignored)}",
                "add them to pods.resource_names or pods.resource_prefixes, or their pods get no GPU series",
                details,
            )
        ]
    return [CheckResult(FAMILY, NAME, Status.OK, found, details=details)]
