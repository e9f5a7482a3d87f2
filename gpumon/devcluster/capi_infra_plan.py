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

Beyond the contract, the node's own side, which a cloud behind Cluster API does not show it
either: a machine whose spec says ``devicesAfterSeconds`` becomes a Node without its GPUs, as a
real one joins before its device plugin or DRA driver registers; that long after the Node was
made, its extended resources become allocatable or, for a DRA shape (``node.dra``), its
ResourceSlice is published (gpumon.devcluster.resourceslices), labelled like the Node.

A KwokMachine carries no finalizer: it has nothing in a cloud to release."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpumon.devcluster import nodes
from gpumon.devcluster.capi import ReadyAtOnce

PROVIDER_ID_PREFIX = "kwok://"
# On the Nodes the provider made (and their ResourceSlices): the KwokMachine's namespace (its
# name is the Node's).
MACHINE_NAMESPACE_LABEL = "infrastructure.devcluster.gpumon.io/kwok-machine-namespace"
# On those Nodes: when the provider made it, in unix seconds (creationTimestamp has whole ones).
CREATED_AT_ANNOTATION = "infrastructure.devcluster.gpumon.io/created-at"

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
class DevicesUp:
    """A Node's devices registering: its extended resources, or its DRA driver's slice."""

    node: str
    resources: Mapping[str, str]  # to make allocatable (device plugins); empty for DRA
    dra: nodes.NodeTemplate | None  # the devices to publish in the Node's ResourceSlice
    labels: Mapping[str, str]  # the slice's: the Node's


@dataclass(frozen=True)
class InfraPlan:
    create_nodes: tuple[dict[str, Any], ...]
    provision: tuple[Provision, ...]
    delete_nodes: tuple[str, ...]
    make_ready: tuple[tuple[ReadyAtOnce, str, str], ...]  # (kind, namespace, name)
    devices_up: tuple[DevicesUp, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.create_nodes or self.provision or self.delete_nodes or self.make_ready or self.devices_up
        )


def _owned_by_machine(obj: Json) -> bool:
    refs = obj["metadata"].get("ownerReferences") or ()
    return any(r.get("kind") == "Machine" for r in refs)


def _get(obj: Json, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)  # type: ignore[assignment]
    return obj


def _created_at(node: Json) -> float:
    meta = node["metadata"]
    try:
        return float((meta.get("annotations") or {})[CREATED_AT_ANNOTATION])
    except (KeyError, ValueError):
        stamp = str(meta.get("creationTimestamp") or "1970-01-01T00:00:00Z")
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _new_node(meta: Json, pid: str, node_shape: Json, delay: float, now: float) -> dict[str, Any]:
    body = nodes.from_shape(
        meta["name"],
        node_shape,
        provider_id=pid,
        extra_labels={MACHINE_NAMESPACE_LABEL: meta["namespace"]},
        annotations={CREATED_AT_ANNOTATION: repr(now)},
    )
    if delay > 0:  # joins before its device plugin registers
        for key in ("capacity", "allocatable"):
            held = nodes.device_resources(body["status"][key])
            body["status"][key] = {k: v for k, v in body["status"][key].items() if k not in held}
    return body


def _devices_up(node: Json, node_shape: Json, sliced: set[str]) -> DevicesUp | None:
    """What still has to register on ``node`` for it to offer its shape's devices, or None."""
    name = node["metadata"]["name"]
    template = nodes.dra_template(node_shape)
    if template is not None:
        labels = dict(node["metadata"].get("labels") or {})
        return None if name in sliced else DevicesUp(name, {}, template, labels)
    wanted = nodes.device_resources(node_shape.get("resources") or {})
    have = _get(node, "status", "allocatable") or {}
    return None if all(k in have for k in wanted) else DevicesUp(name, wanted, None, {})


def plan(
    machines: Sequence[Json],
    provider_nodes: Sequence[Json],
    ready_at_once: Mapping[ReadyAtOnce, Sequence[Json]],
    *,
    sliced: Sequence[str] = (),
    now: float = 0.0,
) -> InfraPlan:
    """``provider_nodes``: the Nodes labelled :data:`MACHINE_NAMESPACE_LABEL`, listed after
    ``machines`` (so a Node made for a listed machine is never taken for an orphan); ``sliced``:
    the names of the Nodes whose ResourceSlice the provider published; ``now``: unix seconds."""
    node_by_id = {_get(n, "spec", "providerID"): n for n in provider_nodes}
    live_ids: set[str] = set()
    create: list[dict[str, Any]] = []
    provision: list[Provision] = []
    devices: list[DevicesUp] = []
    for m in machines:
        meta = m["metadata"]
        pid = provider_id(meta["namespace"], meta["name"])
        live_ids.add(pid)
        if meta.get("deletionTimestamp") or not _owned_by_machine(m):
            continue  # the contract: act only once a Machine owns the infrastructure machine
        node_shape = _get(m, "spec", "node") or {}
        delay = float(_get(m, "spec", "devicesAfterSeconds") or 0)
        node = node_by_id.get(pid)
        if node is None:
            create.append(_new_node(meta, pid, node_shape, delay, now))
        elif not node["metadata"].get("deletionTimestamp"):
            up = _devices_up(node, node_shape, set(sliced))
            if up is not None and now >= _created_at(node) + delay:
                devices.append(up)
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
    return InfraPlan(
        tuple(create),
        tuple(provision),
        tuple(orphans),
        make_ready,
        tuple(devices),
    )
