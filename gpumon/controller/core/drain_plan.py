"""Which pods leave a quarantined node (pure), and the Eviction API calls that move them.

Partial drain: when the exporter says which pods use which GPU, only the pods on the bad GPUs
go, plus any GPU pod the exporter cannot place (it might be on a bad GPU). Otherwise every GPU
pod on the node goes. DaemonSet pods (they belong to the node) and mirror pods (the kubelet
owns them) are never evicted. Evictions go through the Eviction API so PodDisruptionBudgets
hold; a 429 is retried with backoff until the node's deadline, then the configured escalation
applies: ``report`` (an Event, nothing forced; the default) or ``delete``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from gpumon.controller.core.contract import NodePhase
from gpumon.controller.core.objects import PdbView, PodView, pdbs_covering
from gpumon.controller.core.plans import DrainPlan, DrainTarget
from gpumon.controller.core.signals import NodeReading
from gpumon.controller.core.verdicts import NodeVerdict
from gpumon.gpu_health import Severity


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


def plan_drain(
    verdict: NodeVerdict,
    reading: NodeReading | None,
    pods: Sequence[PodView],
    pdbs: Sequence[PdbView],
    *,
    now: float,
    started_at: float,
    policy: DrainPolicy,
) -> DrainPlan:
    """The pods to evict from a quarantined node now (``pods`` are the node's pods)."""
    deadline = started_at + policy.deadline_seconds
    drain_severities = {Severity.UNHEALTHY} | ({Severity.DEGRADED} if policy.on_degraded else set())
    bad = {g.uuid: g for g in verdict.gpus if g.severity in drain_severities}
    partial = not verdict.whole_node and reading is not None and reading.pods_attributed
    placed: dict[tuple[str, str], list[int]] = {}
    bad_users: dict[tuple[str, str], list[str]] = {}
    if partial and reading is not None:
        for g in reading.gpus:
            for ref in g.pods:
                placed.setdefault((ref.namespace, ref.pod), []).append(g.index)
                if g.uuid in bad:
                    bad_users.setdefault((ref.namespace, ref.pod), []).append(f"GPU {g.index} ({g.uuid})")
    targets: list[DrainTarget] = []
    skipped: list[tuple[PodView, str]] = []
    for pod in sorted(pods, key=lambda p: p.key):
        if not pod.uses_gpu or pod.terminating or pod.finished:
            continue
        why_not = _skip_reason(pod)
        if why_not is not None:
            skipped.append((pod, why_not))
            continue
        if not partial:
            why = "GPU pod on a node with unhealthy GPUs"
        elif pod.key in bad_users:
            why = "uses " + ", ".join(dict.fromkeys(bad_users[pod.key]))
        elif pod.key not in placed:
            why = "GPU pod the exporter does not place on any GPU"
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
