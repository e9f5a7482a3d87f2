"""What the devcluster's kwok infrastructure provider does next, as a pure function of what it
sees: Cluster API's KwokMachines, the Nodes it made, and the KwokClusters and KwokControlPlanes.

The provider stands in for a cloud behind Cluster API and does only what Cluster API's
provider contract asks (docs/autoscaling.md, "Cluster API's own controllers"):

- a KwokMachine owned by a Machine becomes a kwok Node of the shape its spec holds, named like
  the KwokMachine, with provider ID ``kwok://<namespace>/<name>``; the KwokMachine then gets
  that ``spec.providerID`` and ``status.initialization.provisioned: true``, and Cluster API
  links the Machine to the Node by that ID;
- a Node whose KwokMachine is gone is deleted, as a cloud's node lifecycle controller deletes
  the Node of a terminated instance (Cluster API deletes it too when it deletes a Machine, but
  not while its Cluster is being deleted);
- a KwokCluster is reported provisioned and a KwokControlPlane initialized as soon as they
  exist (gpumon.devcluster.capi.READY_AT_ONCE): the network and the API server everything runs
  against are already there.

A KwokMachine carries no finalizer: it has nothing in a cloud to release."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumon.devcluster import nodes
from gpumon.devcluster.capi import ReadyAtOnce

PROVIDER_ID_PREFIX = "kwok://"
# On the Nodes the provider made: the KwokMachine's namespace (its name is the Node's).
MACHINE_NAMESPACE_LABEL = "infrastructure.devcluster.gpumon.io/kwok-machine-namespace"

Json = Mapping[str, Any]


def provider_id(namespace: str, name: str) -> str:
    return f"{PROVIDER_ID_PREFIX}{namespace}/{name}"


@dataclass(frozen=True)
class Provision:
    namespace: str
    name: str
    provider_id: str
    set_provider_id: bool  # spec.providerID is not written yet
    set_provisioned: bool  # status.initialization.provisioned is not true yet


@dataclass(frozen=True)
class InfraPlan:
    create_nodes: tuple[dict[str, Any], ...]
    provision: tuple[Provision, ...]
    delete_nodes: tuple[str, ...]
    make_ready: tuple[tuple[ReadyAtOnce, str, str], ...]  # (kind, namespace, name)

    @property
    def empty(self) -> bool:
        return not (self.create_nodes or self.provision or self.delete_nodes or self.make_ready)


def _owned_by_machine(obj: Json) -> bool:
    refs = obj["metadata"].get("ownerReferences") or ()
    return any(r.get("kind") == "Machine" for r in refs)


def _get(obj: Json, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)  # type: ignore[assignment]
    return obj


def plan(
    machines: Sequence[Json],
    provider_nodes: Sequence[Json],
    ready_at_once: Mapping[ReadyAtOnce, Sequence[Json]],
) -> InfraPlan:
    """``provider_nodes``: the Nodes labelled :data:`MACHINE_NAMESPACE_LABEL`, listed after
    ``machines`` (so a Node made for a listed machine is never taken for an orphan)."""
    node_by_id = {_get(n, "spec", "providerID"): n for n in provider_nodes}
    live_ids: set[str] = set()
    create: list[dict[str, Any]] = []
    provision: list[Provision] = []
    for m in machines:
        meta = m["metadata"]
        pid = provider_id(meta["namespace"], meta["name"])
        live_ids.add(pid)
        if meta.get("deletionTimestamp") or not _owned_by_machine(m):
            continue  # the contract: act only once a Machine owns the infrastructure machine
        if pid not in node_by_id:
            create.append(
                nodes.from_shape(
                    meta["name"],
                    _get(m, "spec", "node") or {},
                    provider_id=pid,
                    extra_labels={MACHINE_NAMESPACE_LABEL: meta["namespace"]},
                )
            )
        set_id = _get(m, "spec", "providerID") != pid
        set_provisioned = _get(m, "status", "initialization", "provisioned") is not True
        if set_id or set_provisioned:
            provision.append(Provision(meta["namespace"], meta["name"], pid, set_id, set_provisioned))
    orphans = sorted(
        n["metadata"]["name"]
        for pid, n in node_by_id.items()
        if pid not in live_ids and not n["metadata"].get("deletionTimestamp")
    )
    make_ready = tuple(
        (kind, obj["metadata"]["namespace"], obj["metadata"]["name"])
        for kind, objects in ready_at_once.items()
        for obj in objects
        if not kind.reported(obj) and not obj["metadata"].get("deletionTimestamp")
    )
    return InfraPlan(tuple(create), tuple(provision), tuple(orphans), make_ready)
