"""DRA device taints for unhealthy GPUs: which DeviceTaintRules gpumon wants, and the writes
that get there. Pure: no I/O.

Kubernetes 1.36 serves ``DeviceTaintRule`` in ``resource.k8s.io/v1beta2`` (gate
``DRADeviceTaintRules``, beta and off by default; the API is a beta one, also off by default,
and the scheduler reads the rules through exactly that version). A rule selects devices by
driver, pool and device name and puts one taint on them. gpumon writes one rule per DRA device
on a GPU it recorded as unhealthy on its node (``gpumon.io/unhealthy-gpus``): the whole GPU and
every MIG device carved from it, so that the scheduler allocates none of them to a new claim.
The effect is ``NoSchedule``, never ``NoExecute``: with NoExecute kube-controller-manager's
device-taint eviction controller would *delete* the pods using those devices, past gpumon's
Eviction API, PodDisruptionBudgets, dry-run, circuit breaker and drain deadline; gpumon's own
partial drain moves those pods. Rules follow the node's record, so a restarted or new leader
wants exactly the same ones, and recovery (the record gone) takes them away.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumon.controller.core import contract as c
from gpumon.controller.core.claims import SliceView
from gpumon.controller.core.contract.node import node_records
from gpumon.controller.core.objects import NodeView
from gpumon.controller.core.plans import Event, ObjectRef
from gpumon.gpu.health import Severity
from gpumon.k8s.dra import DeviceRef, newest_generation

API_VERSION = "resource.k8s.io/v1beta2"
GROUP_VERSION_PATH = "/apis/resource.k8s.io/v1beta2"
RESOURCE = "devicetaintrules"
RULES_PATH = f"{GROUP_VERSION_PATH}/{RESOURCE}"
SELECTOR = f"{c.MANAGED_BY_LABEL}={c.MANAGED_BY}"
EFFECT = "NoSchedule"


def rule_name(ref: DeviceRef) -> str:
    """A stable name per device: readable (the device name is a DNS label) and unique (a hash
    of the whole triple, since the same device name is in every node's pool)."""
    digest = hashlib.sha256(str(ref).encode()).hexdigest()[:10]
    return f"gpumon-{ref.device}-{digest}"


@dataclass(frozen=True, slots=True)
class RuleView:
    """One of gpumon's DeviceTaintRules as the cache keeps it."""

    name: str
    node: str


def rule_from_json(obj: Mapping[str, Any]) -> RuleView:
    meta = obj.get("metadata") or {}
    return RuleView(
        str(meta.get("name") or ""), str((meta.get("annotations") or {}).get(c.RULE_NODE_ANNOTATION, ""))
    )


@dataclass(frozen=True, slots=True)
class WantedRule:
    node: str
    ref: DeviceRef
    gpu_uuid: str

    @property
    def name(self) -> str:
        return rule_name(self.ref)

    def to_json(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": self.name,
                "labels": {c.MANAGED_BY_LABEL: c.MANAGED_BY},
                "annotations": {c.RULE_NODE_ANNOTATION: self.node, c.RULE_GPU_ANNOTATION: self.gpu_uuid},
            },
            "spec": {
                "deviceSelector": {
                    "driver": self.ref.driver,
                    "pool": self.ref.pool,
                    "device": self.ref.device,
                },
                "taint": {"key": c.TAINT_KEY, "value": Severity.UNHEALTHY.value, "effect": EFFECT},
            },
        }


def wanted_rules(node: str, view: NodeView | None, slices: Iterable[SliceView]) -> tuple[WantedRule, ...]:
    """The rules node ``node`` should have: one per DRA device of its slices on a GPU its record
    names unhealthy (``view`` None: the node is gone, so none). Degraded GPUs get none: devices
    have no PreferNoSchedule, and the node's taint for them is only a preference."""
    if view is None:
        return ()
    records = node_records(view)
    bad = {r.uuid for r in records if r.uuid and r.severity is Severity.UNHEALTHY}
    if not bad:
        return ()
    out = {
        d.ref: WantedRule(node, d.ref, d.card_uuid)
        for s in newest_generation(slices)
        if s.node == node
        for d in s.devices
        if d.card_uuid is not None and d.card_uuid in bad
    }
    return tuple(out[r] for r in sorted(out))


@dataclass(frozen=True, slots=True)
class RulesPlan:
    create: tuple[WantedRule, ...] = ()
    delete: tuple[str, ...] = ()  # rule names

    def __bool__(self) -> bool:
        return bool(self.create or self.delete)


def plan_rules(node: str, wanted: Iterable[WantedRule], existing: Iterable[RuleView]) -> RulesPlan:
    """What to create and delete so that ``node``'s rules are ``wanted`` (``existing``: every
    rule gpumon has; those of other nodes are left alone)."""
    want = {w.name: w for w in wanted}
    have = {r.name for r in existing if r.node == node}
    return RulesPlan(
        create=tuple(w for name, w in sorted(want.items()) if name not in have),
        delete=tuple(sorted(have - set(want))),
    )


def rules_event(node: str, plan: RulesPlan) -> Event:
    """The node's Event telling what ``plan`` changed."""
    ref = ObjectRef("Node", node)
    if plan.create:
        devices = ", ".join(f"{w.ref.device} (GPU {w.gpu_uuid})" for w in plan.create)
        msg = f"DeviceTaintRule {EFFECT} on DRA device(s) {devices}: no new ResourceClaim gets them"
        return Event(ref, "GpuDevicesTainted", msg, key="devtaint:" + ",".join(w.name for w in plan.create))
    msg = f"DeviceTaintRule(s) {', '.join(plan.delete)} deleted: the GPUs are no longer recorded unhealthy"
    return Event(ref, "GpuDevicesUntainted", msg, key="devuntaint:" + ",".join(plan.delete))
