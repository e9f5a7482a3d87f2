"""Which node-lifecycle machinery owns a Node, and the object whose deletion replaces it: a
Cluster API Machine or a Karpenter NodeClaim. Pure: read from the Node's own JSON.

- Cluster API writes the Machine's name and namespace on the Nodes of its Machines
  (annotations ``cluster.x-k8s.io/machine`` and ``cluster.x-k8s.io/cluster-namespace``;
  cluster-api v1.13 ``machine_controller_noderef.go``).
- Karpenter makes each Node it launched owned by its NodeClaim (an ownerReference of kind
  ``NodeClaim`` in ``karpenter.sh``; v1.15 ``nodeclaim/lifecycle/registration.go``), and labels
  it with its NodePool.

Checked against both on the real control plane (tests/cluster/test_cluster_api_pools.py,
tests/cluster/test_karpenter_pools.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpumon.controller.core.contract import (
    MACHINE_ANNOTATION,
    MACHINE_API_VERSION,
    MACHINE_NAMESPACE_ANNOTATION,
)

KARPENTER_GROUP = "karpenter.sh"


@dataclass(frozen=True, slots=True)
class NodeOwner:
    machinery: Literal["cluster-api", "karpenter"]
    kind: Literal["Machine", "NodeClaim"]
    api_version: str
    name: str
    namespace: str | None = None  # Machines are namespaced; NodeClaims are cluster-scoped

    @property
    def path(self) -> str:
        """The object's API path: deleting it replaces the node through its own machinery."""
        plural = f"{self.kind.lower()}s"
        where = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"/apis/{self.api_version}{where}/{plural}/{self.name}"


def node_owner(node: Mapping[str, Any]) -> NodeOwner | None:
    """The Machine or NodeClaim behind ``node``, or None when neither machinery owns it (or a
    Cluster API Node does not say its Machine's namespace)."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    machine, namespace = annotations.get(MACHINE_ANNOTATION), annotations.get(MACHINE_NAMESPACE_ANNOTATION)
    if machine and namespace:
        return NodeOwner("cluster-api", "Machine", MACHINE_API_VERSION, machine, namespace)
    for ref in meta.get("ownerReferences") or ():
        group = str(ref.get("apiVersion", "")).split("/")[0]
        if ref.get("kind") == "NodeClaim" and group == KARPENTER_GROUP and ref.get("name"):
            return NodeOwner("karpenter", "NodeClaim", str(ref["apiVersion"]), str(ref["name"]))
    return None
