"""The repair ladder's replacement step through the pool's own machinery (pure): which machinery
replaces a node, the state of its work as the planner reads it, and how a replacement ends once
its Node is gone.

The Machine (Cluster API) or NodeClaim (Karpenter) behind a Node is deleted, and its own
controllers do the rest: Cluster API drains and deletes the Node and the MachineSet makes a new
Machine; Karpenter drains with its termination flow and launches capacity for the pods that need
it. While the Node is there, its ``gpumon.io/repair`` record follows the attempt
(:func:`gpumon.controller.core.repair.plan_repair`). The Node goes with the replacement and the
record with it, so the attempt is also recorded on the controller's ConfigMap
(:class:`gpumon.controller.core.contract.repair.Replacement`) before anything is deleted, and
:func:`follow_replacement` ends it from there.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpumon.controller.core.contract import REPLACEMENT_CONDITION_TYPE
from gpumon.controller.core.contract.repair import Replacement
from gpumon.controller.core.node_owner import NodeOwner
from gpumon.controller.core.plans import Event, ObjectRef
from gpumon.controller.core.repair import Machinery, Work
from gpumon.k8s.selectors import LabelSelector


def machinery_of(owner: NodeOwner | None) -> Machinery:
    if owner is None:
        return Machinery.NONE
    return Machinery.CLUSTER_API if owner.machinery == "cluster-api" else Machinery.KARPENTER


def owner_work(owner: Mapping[str, Any] | None) -> Work:
    """The replacement's work as the planner reads it, from the Machine or NodeClaim (``None``:
    not found): gone is done, deleting is under way, there and not deleting is not asked yet."""
    if owner is None:
        return Work.SUCCEEDED
    meta = owner.get("metadata") or {}
    return Work.RUNNING if meta.get("deletionTimestamp") else Work.ABSENT


@dataclass(frozen=True, slots=True)
class HealthCheckCover:
    """The MachineHealthCheck that judges a Machine: where one does, gpumon asks it to replace
    the node (the ``GpuReplacementRequested`` condition) and deletes nothing itself, so that the
    check's own limits (``remediation.triggerIf``, external remediation templates) still rule
    and never two parts remediate one Machine."""

    name: str
    watches: bool  # lists GpuReplacementRequested=True among its unhealthyNodeConditions


def covering_health_check(
    machine: Mapping[str, Any], checks: Iterable[Mapping[str, Any]]
) -> HealthCheckCover | None:
    """The first (by name) of ``checks``, listed in the Machine's namespace, that selects
    ``machine``: the same cluster, its selector matching the Machine's labels (how Cluster API's
    MachineHealthCheck controller picks its targets)."""
    labels = (machine.get("metadata") or {}).get("labels") or {}
    cluster = (machine.get("spec") or {}).get("clusterName")
    covering = []
    for check in checks:
        spec = check.get("spec") or {}
        if spec.get("clusterName") != cluster or not LabelSelector.from_json(spec.get("selector")).matches(
            labels
        ):
            continue
        conditions = (spec.get("checks") or {}).get("unhealthyNodeConditions") or ()
        watches = any(
            c.get("type") == REPLACEMENT_CONDITION_TYPE and c.get("status") == "True" for c in conditions
        )
        covering.append(HealthCheckCover(str((check.get("metadata") or {}).get("name", "")), watches))
    return min(covering, key=lambda c: c.name, default=None)


def replacement_condition(requested: bool, *, at: str, message: str) -> dict[str, Any]:
    """The Node status patch (strategic, merged by type) that sets ``GpuReplacementRequested``."""
    condition = {
        "type": REPLACEMENT_CONDITION_TYPE,
        "status": "True" if requested else "False",
        "reason": "GpuRepairReplace" if requested else "GpuRepairEnded",
        "message": message,
        "lastTransitionTime": at,
        "lastHeartbeatTime": at,
    }
    return {"status": {"conditions": [condition]}}


def health_check_events(node: str, machine: str, cover: HealthCheckCover, attempt: int) -> tuple[Event, ...]:
    """What the Node's Events say when a MachineHealthCheck is asked to replace it."""
    about = ObjectRef("Node", node)
    asked = Event(
        about,
        "GpuRepairReplaceRequested",
        f"MachineHealthCheck {cover.name} covers Machine {machine}: {REPLACEMENT_CONDITION_TYPE}=True "
        f"set (attempt {attempt}) for it to replace the node; gpumon deletes nothing itself",
        key=f"GpuRepairReplaceRequested:{node}:{attempt}",
    )
    if cover.watches:
        return (asked,)
    blind = Event(
        about,
        "GpuRepairHealthCheckBlind",
        f"MachineHealthCheck {cover.name} covers Machine {machine} but does not watch "
        f"{REPLACEMENT_CONDITION_TYPE}=True: the replacement waits for the check's own conditions "
        f'or gives up at its deadline. Add {{type: {REPLACEMENT_CONDITION_TYPE}, status: "True", '
        "timeoutSeconds: 0}} to its spec.checks.unhealthyNodeConditions",
        warning=True,
        key=f"GpuRepairHealthCheckBlind:{node}:{attempt}",
    )
    return (asked, blind)


@dataclass(frozen=True, slots=True)
class ReplacementView:
    """What the shell read about one recorded replacement."""

    node_present: bool
    # The Node's own record still runs this attempt (it judges while the Node is there).
    attempt_running: bool = False
    owner_gone: bool | None = None  # None: not read (the Node is still there, or the read failed)
    # Nodes of the pool that joined since: Ready, their GPUs allocatable, not quarantined, none
    # of the nodes the pool had when the replacement began.
    joined: tuple[str, ...] = ()


class Ending(enum.StrEnum):
    KEEP = "keep"  # under way (or given up, kept for a person)
    DROP = "drop"  # the Node's record ended the attempt: the ConfigMap's copy goes
    SUCCEEDED = "succeeded"
    GAVE_UP = "gave_up"


@dataclass(frozen=True, slots=True)
class ReplacementPlan:
    ending: Ending
    record: Replacement | None = None  # to write in place of the recorded one
    event: Event | None = None


_KEEP = ReplacementPlan(Ending.KEEP)


def follow_replacement(
    r: Replacement, view: ReplacementView, *, now: float, about: ObjectRef
) -> ReplacementPlan:
    """The next move of a recorded replacement. ``about`` is the object its Events go on once
    the Node is gone: the pool's ``/scale`` target."""
    if r.gave_up_at is not None:
        return _KEEP
    if view.node_present:
        return _KEEP if view.attempt_running else ReplacementPlan(Ending.DROP)
    what = ", ".join(g for g in r.gpus if g) or "the node"
    kind = "Machine" if r.machinery == Machinery.CLUSTER_API else "NodeClaim"
    # Cluster API keeps the pool's size: a new Node must join. Karpenter launches capacity for
    # pending pods only, so its replacement is done once the NodeClaim is gone.
    wants_node = r.machinery == Machinery.CLUSTER_API
    if view.owner_gone is True and (view.joined or not wants_node):
        joined = f"; {', '.join(view.joined)} joined pool {r.pool!r}" if view.joined else ""
        message = (
            f"replace of {what} on node {r.node} (attempt {r.attempt}) succeeded: its {kind} "
            f"{r.owner.rsplit('/', 1)[-1]} is gone{joined}"
        )
        event = Event(about, "GpuRepairSucceeded", message, key=f"GpuRepairSucceeded:{r.node}:{r.attempt}")
        return ReplacementPlan(Ending.SUCCEEDED, event=event)
    if now < r.deadline_at:
        return _KEEP
    missing = f"the {kind} is still there" if view.owner_gone is not True else "no new node joined the pool"
    message = (
        f"repair gave up: replace of {what} on node {r.node} (attempt {r.attempt}) timed out "
        f"({missing} by its deadline); the node is gone. Remove annotation {r.key} from gpumon's "
        "ConfigMap once handled"
    )
    event = Event(
        about, "GpuRepairGaveUp", message, warning=True, key=f"GpuRepairGaveUp:{r.node}:{r.attempt}"
    )
    return ReplacementPlan(Ending.GAVE_UP, record=replace(r, gave_up_at=now), event=event)
