"""This node's pods, kept current by one list+watch (``fieldSelector=spec.nodeName=<node>``,
:mod:`node_watch`: resume, relist on 410, backoff, failures counted as ``api``).

Only a slim projection of each pod is kept (:class:`PodMeta`): what attribution needs to name a
container and read its shared-GPU allocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumon.devices.backend import ErrorSink
from gpumon.exporter.node_watch import node_view
from gpumon.k8s import sharing
from gpumon.kube.informer import View

SOURCE = "api"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodMeta:
    uid: str
    namespace: str
    name: str
    init_containers: tuple[sharing.ContainerLimits, ...]
    containers: tuple[sharing.ContainerLimits, ...]
    # Runtime container ID (bare, without "containerd://") -> container name, for every
    # container, init and ephemeral container that has started.
    container_ids: Mapping[str, str]
    # Only the annotations sharing.py reads.
    annotations: Mapping[str, str]
    # A static pod runs under the UID of its manifest hash, which its API mirror carries in
    # this annotation while having a UID of its own.
    mirror_uid: str = ""


def project_pod(obj: Mapping[str, Any]) -> PodMeta | None:
    """The slim view of a raw Pod object, or None for a pod that holds no GPU any more
    (terminal phase). Raises KeyError/TypeError/AttributeError on an object of the wrong shape."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if status.get("phase") in _TERMINAL_PHASES:
        return None
    annotations = meta.get("annotations") or {}
    ids: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or ():
            _, sep, bare = (cs.get("containerID") or "").partition("://")
            if sep and bare:
                ids[bare] = cs["name"]
    return PodMeta(
        uid=meta["uid"],
        namespace=meta["namespace"],
        name=meta["name"],
        init_containers=tuple(sharing.container_limits(c) for c in spec.get("initContainers") or ()),
        containers=tuple(sharing.container_limits(c) for c in spec.get("containers") or ()),
        container_ids=ids,
        annotations={k: str(v) for k, v in annotations.items() if k in sharing.ANNOTATIONS},
        mirror_uid=str(annotations.get(MIRROR_ANNOTATION, "")),
    )


PODS = "/api/v1/pods"


def pod_watch(node: str, errors: ErrorSink, **options: Any) -> View[PodMeta]:
    """The pods of one node by UID; the view's ``generation`` moves whenever it changes."""
    return node_view(PODS, node, project_pod, errors, source=SOURCE, name="pod watch", **options)
