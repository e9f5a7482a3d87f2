"""Which pod and container a process runs in, read from the text of ``/proc/<pid>/cgroup``.

Purely computational: no I/O. Covers cgroup v1 (one line per hierarchy) and v2 (``0::/path``),
the kubelet's cgroupfs and systemd drivers, containerd, CRI-O and Docker (cri-dockerd), the
three QoS classes, and paths seen through a cgroup namespace (``/../../kubepods-…``), which is
what a containerised exporter with ``hostPID`` reads. The pod is found by its segment, not by
a fixed prefix, so kubelet cgroup roots such as kind's ``/kubelet.slice/kubelet-kubepods.slice``
work as well:

==========  ==============================================================================
driver      path (QoS segment absent for Guaranteed pods)
==========  ==============================================================================
cgroupfs    ``/kubepods/burstable/pod<uid>/<id>`` (containerd, Docker) or ``…/crio-<id>``
systemd     ``/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_with_underscores>.slice/``
            ``cri-containerd-<id>.scope`` | ``crio-<id>.scope`` | ``docker-<id>.scope``
==========  ==============================================================================
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

_UID = r"[0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12}|[0-9a-f]{32}"
"""A pod UID: a UUID, or the 32-hex-digit hash kubelet gives static pods."""

_POD_SEGMENT = re.compile(
    rf"^(?:pod(?P<fs>{_UID})|(?:[\w.-]+-)?kubepods(?:-burstable|-besteffort)?-pod(?P<sd>{_UID})\.slice)$"
)
_CONTAINER_SEGMENT = re.compile(
    r"^(?:(?P<prefix>cri-containerd|crio|docker)-)?(?P<id>[0-9a-f]{64})(?P<scope>\.scope)?$"
)
_RUNTIME_HELPER = re.compile(r"^crio-conmon-[0-9a-f]{64}(?:\.scope)?$")
_LINE = re.compile(r"^\d+:[^:]*:(?P<path>/.*)$")


@dataclass(frozen=True, slots=True)
class ContainerKey:
    """Where a process runs: its pod's UID (dashed) and its container's runtime ID (bare hex,
    as in ``status.containerStatuses[].containerID`` without its ``containerd://`` scheme).

    ``container_id`` is empty for a process in the pod's own cgroup."""

    pod_uid: str
    container_id: str


class Unmatched(enum.StrEnum):
    """Why a cgroup file names no container; the value is the error-metric ``kind``."""

    NOT_A_POD = "not_a_pod"  # host process, system service, or a runtime helper such as conmon
    UNKNOWN_FORMAT = "unknown_format"  # looks like a pod's cgroup, but not one we can read
    MALFORMED = "malformed"  # not the /proc/<pid>/cgroup line format at all
    EMPTY = "empty"  # the process exited between listing and reading, or a kernel thread

    @property
    def is_error(self) -> bool:
        return self in (Unmatched.UNKNOWN_FORMAT, Unmatched.MALFORMED)


def parse_cgroup(text: str) -> ContainerKey | Unmatched:
    """The container of the process whose ``/proc/<pid>/cgroup`` reads ``text``.

    cgroup v1 lists one line per hierarchy; the first line that names a container wins (they
    agree on real nodes, and the unified ``0::/`` line of hybrid mode often names nothing)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return Unmatched.EMPTY
    outcome = Unmatched.MALFORMED
    for line in lines:
        m = _LINE.match(line.strip())
        if m is None:
            continue
        found = _parse_path(m["path"])
        if isinstance(found, ContainerKey):
            return found
        if found is Unmatched.UNKNOWN_FORMAT or outcome is Unmatched.MALFORMED:
            outcome = found
    return outcome


def _parse_path(path: str) -> ContainerKey | Unmatched:
    segments = path.split("/")
    for i, segment in enumerate(segments):
        pod = _POD_SEGMENT.match(segment)
        if pod is None:
            continue
        uid = (pod["fs"] or pod["sd"]).replace("_", "-")
        rest = [s for s in segments[i + 1 :] if s]
        if not rest:
            return ContainerKey(uid, "")
        if _RUNTIME_HELPER.match(rest[0]):
            return Unmatched.NOT_A_POD
        container = _CONTAINER_SEGMENT.match(rest[0])
        # Under the systemd driver a container is a scope named for its runtime; under cgroupfs
        # it is a plain directory.
        systemd = pod["sd"] is not None
        if container is None or systemd != bool(container["scope"]) or (systemd and not container["prefix"]):
            return Unmatched.UNKNOWN_FORMAT
        return ContainerKey(uid, container["id"])
    return Unmatched.UNKNOWN_FORMAT if "kubepods" in path else Unmatched.NOT_A_POD
