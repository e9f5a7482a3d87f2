"""Which pods leave a quarantined node (pure), and the Eviction API calls that move them.

Partial drain: when the exporter says which pods use which GPU, or sharing annotations say
which card a shared pod holds (gpushare, cGPU, HAMi: :func:`gpumon.k8s.sharing.pod_cards`), or a
pod's ResourceClaims hold DRA devices on known GPUs (:mod:`.claims`), only the pods on the bad
GPUs go, plus any GPU pod placed on no GPU (it might be on a bad one; a DirectX pod names no
card, so it is one; so is a DRA pod holding a device no ResourceSlice describes). Otherwise
every GPU pod on the node goes. DaemonSet pods (they belong to the node) and mirror pods (the
kubelet owns them) are never evicted. Evictions go through the Eviction API so
PodDisruptionBudgets hold; a 429 is retried with backoff until the node's deadline, then the
configured escalation applies: ``report`` (an Event, nothing forced; the
default) or ``delete``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from gpumon.controller.core.claims import DeviceHold
from gpumon.controller.core.contract import NodePhase
from gpumon.controller.core.objects import PdbView, PodView, pdbs_covering
from gpumon.controller.core.plans import DrainPlan, DrainTarget
from gpumon.controller.core.signals import NodeReading
from gpumon.controller.core.verdicts import NodeVerdict
from gpumon.gpu.health import Severity


class Escalation(enum.StrEnum):
    REPORT = "report"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class DrainPolicy:
    enabled: bool = True
    # Degraded GPUs get a PreferNoSchedule taint; evicting their pods too is opt-in.
    on_degraded: bool = False
    deadline_seconds: float = 600.0
    escalation: Escalation = Escalation.REPORT


def needs_drain(verdict: NodeVerdict, policy: DrainPolicy) -> bool:
    severity = verdict.severity
    if not policy.enabled or severity is None:
        return False
    return severity is Severity.UNHEALTHY or policy.on_degraded


def _skip_reason(pod: PodView) -> str | None:
    if pod.mirror:
        return "mirror pod (owned by the kubelet)"
    if pod.owner_kind == "DaemonSet":
        return "DaemonSet pod"
    return None


NO_HOLDS: Mapping[tuple[str, str], tuple[DeviceHold, ...]] = MappingProxyType({})


def plan_drain(
    verdict: NodeVerdict,
    reading: NodeReading | None,
    pods: Sequence[PodView],
    pdbs: Sequence[PdbView],
    *,
    now: float,
    started_at: float,
    policy: DrainPolicy,
    holds: Mapping[tuple[str, str], tuple[DeviceHold, ...]] = NO_HOLDS,
) -> DrainPlan:
    """The pods to evict from a quarantined node now (``pods`` are the node's pods; ``holds``
    the GPU devices each of them holds through its ResourceClaims, by pod key)."""
    deadline = started_at + policy.deadline_seconds
    drain_severities = {Severity.UNHEALTHY} | ({Severity.DEGRADED} if policy.on_degraded else set())
    bad = [g for g in verdict.gpus if g.severity in drain_severities]
    exporter_places = reading is not None and reading.pods_attributed
    # Placement comes from the exporter (the pods it sees on each GPU), from the sharing
    # annotations (the card a gpushare, cGPU or HAMi pod was given) and from the claims' DRA
    # devices on GPUs the slices name: any one suffices.
    claims_place = any(h.card_uuid for hs in holds.values() for h in hs)
    partial = not verdict.whole_node and (exporter_places or claims_place or any(p.cards for p in pods))
    placed: set[tuple[str, str]] = set()
    bad_users: dict[tuple[str, str], list[str]] = {}
    if partial and reading is not None and reading.pods_attributed:
        bad_uuids = {g.uuid for g in bad}
        for g in reading.gpus:
            for ref in g.pods:
                placed.add((ref.namespace, ref.pod))
                if g.uuid in bad_uuids:
                    bad_users.setdefault((ref.namespace, ref.pod), []).append(f"GPU {g.index} ({g.uuid})")
    targets: list[DrainTarget] = []
    skipped: list[tuple[PodView, str]] = []
    bad_by_uuid = {g.uuid: g for g in bad}
    for pod in sorted(pods, key=lambda p: p.key):
        held_devices = holds.get(pod.key, ())
        if not (pod.uses_gpu or held_devices) or pod.terminating or pod.finished:
            continue
        why_not = _skip_reason(pod)
        if why_not is not None:
            skipped.append((pod, why_not))
            continue
        held = [f"GPU {g.index} ({g.uuid})" for g in bad if any(c.names(g.uuid, g.index) for c in pod.cards)]
        held += [
            f"GPU {v.index} ({v.uuid}) through {h.describe()}"
            for h in held_devices
            if (v := bad_by_uuid.get(h.card_uuid or "")) is not None
        ]
        on_bad = bad_users.get(pod.key, []) + held
        # A DRA pod is placed when the slices say which GPU each of its devices is.
        claims_placed = bool(held_devices) and all(h.card_uuid for h in held_devices)
        if not partial:
            why = "GPU pod on a node with unhealthy GPUs"
        elif on_bad:
            why = "uses " + ", ".join(dict.fromkeys(on_bad))
        elif pod.key not in placed and not pod.cards and not claims_placed:
            why = (
                "GPU pod that neither the exporter, a sharing annotation nor a ResourceSlice places on a GPU"
            )
        else:
            continue
        targets.append(DrainTarget(pod, why, pdbs_covering(pod, pdbs)))
    return DrainPlan(
        phase=NodePhase.DRAINING if targets else NodePhase.DRAINED,
        targets=tuple(targets),
        partial=partial,
        deadline_at=deadline,
        overdue=bool(targets) and now >= deadline,
        skipped=tuple(skipped),
    )
