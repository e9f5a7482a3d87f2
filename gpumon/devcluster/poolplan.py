"""What the pool simulator does next for one pool, as a pure function of what it sees and the
time. The simulator stands in for a cloud provider behind Cluster API: a MachineDeployment's
``spec.replicas`` becomes kwok nodes that appear after a boot delay and get their GPUs after
a device-plugin delay.

There are no Machine objects (the Machine CRD and its controllers are not installed): a
machine that is still booting exists only as an entry of the MachineDeployment's
``devcluster.gpumon.io/booting`` annotation (node name → time requested), and a machine
that has booted is its Node, labelled with the pool's name."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

POOL_LABEL = "devcluster.gpumon.io/pool"  # on a pool's Nodes: the MachineDeployment's name
BOOTING_ANNOTATION = "devcluster.gpumon.io/booting"  # on the MachineDeployment
JOINED_AT_ANNOTATION = "devcluster.gpumon.io/joined-at"  # on a pool's Nodes: unix seconds


@dataclass(frozen=True)
class SimulatedNode:
    name: str
    joined_at: float  # unix seconds
    gpus_allocatable: bool
    marked_for_deletion: bool  # cluster.x-k8s.io/delete-machine on the Node


@dataclass(frozen=True)
class Boot:
    name: str
    requested_at: float


@dataclass(frozen=True)
class Timing:
    boot_delay_seconds: float = 5.0
    gpu_delay_seconds: float = 5.0


@dataclass(frozen=True)
class SimulatedPoolStatus:
    replicas: int  # booting + joined
    ready_replicas: int  # joined (kwok makes them Ready)
    available_replicas: int  # joined with their GPUs allocatable


@dataclass(frozen=True)
class Plan:
    boots: tuple[Boot, ...]  # the booting bookkeeping after this step
    join: tuple[str, ...]  # create these Nodes
    join_with_gpus: bool
    delete: tuple[str, ...]  # delete these Nodes
    enable_gpus: tuple[str, ...]  # make these Nodes' GPUs allocatable
    status: SimulatedPoolStatus
    wake_in: float | None  # seconds until the next timed event, None when nothing is pending


def _next_index(pool: str, names: Sequence[str]) -> int:
    pattern = re.compile(rf"^{re.escape(pool)}-(\d+)$")
    indices = [int(m.group(1)) for n in names if (m := pattern.match(n))]
    return max(indices, default=-1) + 1


def _removal_order(node: SimulatedNode) -> tuple[bool, bool, float]:
    # Marked nodes first (what the autoscaler chose), then nodes whose GPUs never came up,
    # then the newest.
    return (not node.marked_for_deletion, node.gpus_allocatable, -node.joined_at)


def plan(
    pool: str, desired: int, nodes: Sequence[SimulatedNode], boots: Sequence[Boot], timing: Timing, now: float
) -> Plan:
    if desired < 0:
        raise ValueError(f"desired replicas must be >= 0, got {desired}")
    # A boot whose Node exists already joined (a step that stopped before saving its bookkeeping).
    joined_names = {n.name for n in nodes}
    kept_boots = sorted((b for b in boots if b.name not in joined_names), key=lambda b: b.requested_at)
    kept_nodes = list(nodes)
    delete: list[str] = []
    surplus = len(kept_nodes) + len(kept_boots) - desired
    if surplus > 0:
        cancelled = min(surplus, len(kept_boots))  # a machine still booting is the cheapest to drop
        kept_boots = kept_boots[: len(kept_boots) - cancelled]
        doomed = sorted(kept_nodes, key=_removal_order)[: surplus - cancelled]
        delete = sorted(n.name for n in doomed)
        kept_nodes = [n for n in kept_nodes if n.name not in delete]
    elif surplus < 0:
        first = _next_index(pool, [n.name for n in nodes] + [b.name for b in boots])
        kept_boots += [Boot(f"{pool}-{first + i}", now) for i in range(-surplus)]

    join = [b for b in kept_boots if b.requested_at + timing.boot_delay_seconds <= now]
    still_booting = [b for b in kept_boots if b not in join]
    join_with_gpus = timing.gpu_delay_seconds <= 0
    enable = sorted(
        n.name for n in kept_nodes if not n.gpus_allocatable and n.joined_at + timing.gpu_delay_seconds <= now
    )
    waiting_gpus = [n.joined_at for n in kept_nodes if not n.gpus_allocatable and n.name not in enable]
    if not join_with_gpus:
        waiting_gpus += [now] * len(join)
    deadlines = [b.requested_at + timing.boot_delay_seconds for b in still_booting]
    deadlines += [t + timing.gpu_delay_seconds for t in waiting_gpus]

    joined = len(kept_nodes) + len(join)
    available = sum(n.gpus_allocatable for n in kept_nodes) + len(enable)
    available += len(join) if join_with_gpus else 0
    return Plan(
        boots=tuple(still_booting),
        join=tuple(b.name for b in join),
        join_with_gpus=join_with_gpus,
        delete=tuple(delete),
        enable_gpus=tuple(enable),
        status=SimulatedPoolStatus(
            replicas=joined + len(still_booting), ready_replicas=joined, available_replicas=available
        ),
        wake_in=max(0.0, min(deadlines) - now) if deadlines else None,
    )


def encode_boots(boots: Sequence[Boot]) -> str:
    return json.dumps({b.name: b.requested_at for b in boots}, sort_keys=True)


def decode_boots(text: str | None) -> tuple[Boot, ...]:
    """Tolerant: bookkeeping someone mangled counts as no machine booting."""
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return ()
    if not isinstance(doc, dict):
        return ()
    return tuple(
        Boot(str(name), float(at)) for name, at in sorted(doc.items()) if isinstance(at, int | float)
    )
