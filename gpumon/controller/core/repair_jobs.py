"""The node-local steps of the repair ladder as Jobs: their manifests, names and state (pure).

A step's Job comes from the pool's pod template (``pools[].repair.<step>_job``) with what makes
it a repair of one node: pinned to the node by node affinity (as the DaemonSet controller pins
its pods, so the scheduler still admits it), tolerating gpumon's quarantine taint and the
cordon, never restarted, bounded by the step's deadline, and told the node, the GPUs and the
driver's recovery action in its environment. Its name carries the node and the attempt's
number, so creating it again (a new leader continuing an attempt) finds the one already there.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpumon.controller.core import contract as c
from gpumon.controller.core.contract.repair import LadderStep, node_key
from gpumon.controller.core.repair import RepairPolicy, Work

_NO_JOBS: Mapping[LadderStep, Mapping[str, Any]] = MappingProxyType({})
FINISHED_JOB_TTL_SECONDS = 86400


@dataclass(frozen=True, slots=True)
class PoolRepair:
    """A pool's repair: the planner's policy and the node-local steps' pod templates."""

    policy: RepairPolicy
    templates: Mapping[LadderStep, Mapping[str, Any]] = field(default_factory=lambda: _NO_JOBS)


def job_name(node: str, step: LadderStep, attempt: int) -> str:
    """Unique per node and attempt, at most 63 characters (a Job's pods are named after it)."""
    return f"gpumon-{step.value}-{node_key(node)}-{attempt}"


def job_manifest(
    *,
    node: str,
    step: LadderStep,
    attempt: int,
    gpus: Sequence[str],
    action: str,
    template: Mapping[str, Any],
    namespace: str,
    deadline_seconds: float,
) -> dict[str, Any]:
    pod = copy.deepcopy(dict(template))
    meta = pod.setdefault("metadata", {})
    labels = {c.LABEL_REPAIR_NODE: node_key(node), c.LABEL_REPAIR_STEP: step.value}
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    meta["annotations"] = {**(meta.get("annotations") or {}), c.ANNOTATION_REPAIR_NODE: node}
    spec = pod["spec"]
    spec["restartPolicy"] = "Never"
    spec["affinity"] = {
        **(spec.get("affinity") or {}),
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        },
    }
    spec["tolerations"] = [
        *(spec.get("tolerations") or []),
        {"key": c.TAINT_KEY, "operator": "Exists"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    ]
    env = [
        {"name": "GPUMON_NODE", "value": node},
        {"name": "GPUMON_GPU_UUIDS", "value": ",".join(g for g in gpus if g)},
        {"name": "GPUMON_RECOVERY_ACTION", "value": action},
    ]
    for container in spec["containers"]:
        container["env"] = [*(container.get("env") or []), *env]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(node, step, attempt),
            "namespace": namespace,
            "labels": labels,
            "annotations": {c.ANNOTATION_REPAIR_NODE: node},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, int(deadline_seconds)),
            # Kept (at least a day) for people to read, then collected. Gone, it cannot be run
            # twice: its attempt's deadline, counted from before the Job was made, has passed.
            "ttlSecondsAfterFinished": max(FINISHED_JOB_TTL_SECONDS, int(deadline_seconds)),
            "template": pod,
        },
    }


def job_work(job: Mapping[str, Any] | None) -> Work:
    """A Job's state as the planner reads it (``None``: not found)."""
    if job is None:
        return Work.ABSENT
    status = job.get("status") or {}
    if int(status.get("succeeded") or 0) > 0:
        return Work.SUCCEEDED
    failing = [
        cond
        for cond in status.get("conditions") or ()
        # FailureTarget comes first: the Job controller sets it, then stops the pods, then Failed.
        if cond.get("type") in ("Failed", "FailureTarget") and cond.get("status") == "True"
    ]
    if any(cond.get("reason") == "DeadlineExceeded" for cond in failing):
        return Work.EXPIRED
    if any(cond.get("type") == "Failed" for cond in failing) or int(status.get("failed") or 0) > 0:
        return Work.FAILED
    return Work.RUNNING
