from __future__ import annotations

import json

import pytest
from controller_fakes import FakeKube, finding, gpu_verdict, healthy, verdict

from gpumon.controller.act.node_write import apply_node_write
from gpumon.controller.act.retry import RetryPolicy
from gpumon.controller.core import contract as c
from gpumon.controller.core.contract.node import GpuRecord, records_from_json, records_to_json
from gpumon.controller.core.node_plan import QuarantinePolicy, drain_started_at, plan_node
from gpumon.controller.core.objects import NodeView, node_from_json, to_rfc3339
from gpumon.controller.core.plans import PlanKind
from gpumon.controller.core.verdicts import SignalStatus
from gpumon.gpu.health import Severity
from gpumon.kube.client import Conflict

PATH = "/api/v1/nodes/n1"
OTHER_TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def node_json(**spec) -> dict:
    labels = spec.pop("labels", {})
    return {
        "metadata": {"name": "n1", "uid": "uid-n1", "labels": labels, "annotations": {"other": "x"}},
        "spec": {"taints": [OTHER_TAINT], **spec},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


class Cluster:
    """A node in a fake API, planned and written the way the controller does it."""

    def __init__(self, policy: QuarantinePolicy | None = None, **spec) -> None:
        self.api = FakeKube()
        self.api.add(PATH, node_json(**spec))
        self.policy = policy or QuarantinePolicy()

    @property
    def view(self) -> NodeView:
        return node_from_json(self.api.objects[PATH])

    @property
    def obj(self) -> dict:
        return self.api.objects[PATH]

    async def step(self, v, now: float, **kw):
        plan = plan_node(self.view, v, now=now, policy=self.policy, **kw)
        if plan.write is not None:
            await apply_node_write(self.api, plan.write, lambda view: None)
        return plan

    def condition(self) -> dict | None:
        return next((x for x in self.obj["status"]["conditions"] if x["type"] == c.CONDITION_TYPE), None)

    def our_taints(self) -> list[dict]:
        return [t for t in self.obj["spec"]["taints"] if t["key"] == c.TAINT_KEY]


async def test_quarantine_writes_the_whole_contract_in_two_writes_and_is_idempotent():
    k = Cluster()
    plan = await k.step(verdict(gpu_verdict(3)), now=200.0)
    assert plan.kind is PlanKind.QUARANTINE
    assert [m for m, _, _ in k.api.writes()] == ["PATCH", "PATCH"]
    assert k.obj["spec"]["taints"] == [
        OTHER_TAINT,
        {"key": c.TAINT_KEY, "value": "unhealthy", "effect": "NoSchedule"},
    ]
    cond = k.condition()
    assert cond["status"] == "True" and cond["reason"] == "XidFatal"
    assert (
        "GPU 3 (GPU-3): XidFatal (Xid 79)" in cond["message"]
        and "Recommended: fix XidFatal" in cond["message"]
    )
    assert cond["lastTransitionTime"] == to_rfc3339(200.0)
    ann = k.obj["metadata"]["annotations"]
    assert ann["other"] == "x"
    assert json.loads(ann[c.ANNOTATION_UNHEALTHY_GPUS]) == [
        {
            "uuid": "GPU-3",
            "index": 3,
            "reason": "XidFatal",
            "severity": "unhealthy",
            "rules": ["xid-unhealthy"],
            "firstSeen": to_rfc3339(100.0),
            "evidence": "Xid 79",
        }
    ]
    assert ann[c.ANNOTATION_QUARANTINED_AT] == to_rfc3339(200.0)
    assert ann[c.ANNOTATION_CORDON_PREEXISTING] == "false"
    assert k.obj["metadata"]["labels"][c.LABEL_STATE] == "quarantined"
    assert "unschedulable" not in k.obj["spec"]  # the taint is enough by default
    (ev,) = plan.events
    assert (ev.reason, ev.warning, ev.about.kind, ev.about.name) == ("GpuQuarantined", True, "Node", "n1")
    assert "gpumon.io/gpu-unhealthy=unhealthy:NoSchedule" in ev.message
    # Nothing left to do: the same verdict later plans nothing.
    again = await k.step(verdict(gpu_verdict(3)), now=300.0)
    assert again.kind is PlanKind.NONE and len(k.api.writes()) == 2


async def test_merge_patch_is_guarded_by_resource_version():
    k = Cluster()
    rv = k.view.resource_version
    plan = plan_node(k.view, verdict(gpu_verdict()), now=1.0)
    assert plan.write.merge_patch["metadata"]["resourceVersion"] == rv


async def test_degraded_prefers_no_schedule_then_escalates_in_place():
    k = Cluster()
    deg = finding("thermal-degraded", Severity.DEGRADED, "Thermal", "temperature 90 C >= 87 C")
    await k.step(verdict(gpu_verdict(1, deg)), now=10.0)
    assert k.our_taints() == [{"key": c.TAINT_KEY, "value": "degraded", "effect": "PreferNoSchedule"}]
    plan = await k.step(verdict(gpu_verdict(1, finding(at=50.0), deg)), now=60.0)
    assert plan.kind is PlanKind.UPDATE
    assert k.our_taints() == [{"key": c.TAINT_KEY, "value": "unhealthy", "effect": "NoSchedule"}]
    assert [e.reason for e in plan.events] == ["GpuQuarantineUpdated"]
    assert k.obj["metadata"]["annotations"][c.ANNOTATION_QUARANTINED_AT] == to_rfc3339(10.0)
    assert k.condition()["reason"] == "XidFatal"


async def test_taints_of_others_coming_and_going_cause_no_write_and_no_event():
    """The node lifecycle controller appends its taints after ours when a heartbeat is late
    (kwok's, after an API server restart) and removes them again: neither their place in the
    list nor their coming and going is a change of the quarantine."""
    k = Cluster()
    await k.step(verdict(gpu_verdict(3)), now=200.0)
    writes = len(k.api.writes())
    unreachable = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": "t"}
    k.obj["spec"]["taints"].append(unreachable)
    assert (await k.step(verdict(gpu_verdict(3)), now=300.0)).kind is PlanKind.NONE
    k.obj["spec"]["taints"].remove(unreachable)
    assert (await k.step(verdict(gpu_verdict(3)), now=400.0)).kind is PlanKind.NONE
    assert len(k.api.writes()) == writes
    # Our own taint changing is an update, written in place: the others keep their order.
    k.obj["spec"]["taints"].append(unreachable)
    deg = finding("thermal-degraded", Severity.DEGRADED, "Thermal", "temperature 90 C >= 87 C")
    plan = await k.step(verdict(gpu_verdict(3, deg)), now=500.0)
    assert [e.reason for e in plan.events] == ["GpuQuarantineUpdated"]
    assert k.obj["spec"]["taints"] == [
        OTHER_TAINT,
        {"key": c.TAINT_KEY, "value": "degraded", "effect": "PreferNoSchedule"},
        unreachable,
    ]


async def test_drifting_evidence_causes_no_write_but_a_new_gpu_does():
    k = Cluster()
    hot = lambda t: finding("thermal-unhealthy", reason="Thermal", evidence=f"temperature {t} C")  # noqa: E731
    await k.step(verdict(gpu_verdict(1, hot(96))), now=10.0)
    n = len(k.api.writes())
    assert (await k.step(verdict(gpu_verdict(1, hot(97))), now=20.0)).kind is PlanKind.NONE
    assert len(k.api.writes()) == n
    plan = await k.step(verdict(gpu_verdict(1, hot(97)), gpu_verdict(4)), now=30.0)
    assert plan.kind is PlanKind.UPDATE and plan.events == ()  # same taint: no event
    gpus = [r.uuid for r in records_from_json(k.obj["metadata"]["annotations"][c.ANNOTATION_UNHEALTHY_GPUS])]
    assert gpus == ["GPU-1", "GPU-4"]
    assert "GPU 4 (GPU-4)" in k.condition()["message"]


async def test_refusal_blocks_only_new_quarantines():
    k = Cluster()
    plan = await k.step(verdict(gpu_verdict()), now=1.0, refusal="circuit breaker open for pool a")
    assert plan.kind is PlanKind.REFUSED and k.api.writes() == []
    (ev,) = plan.events
    assert ev.reason == "GpuQuarantineRefused" and ev.warning
    assert ev.message.startswith("circuit breaker open for pool a: GPU 3")
    await k.step(verdict(gpu_verdict()), now=2.0)
    plan = await k.step(verdict(gpu_verdict(3), gpu_verdict(5)), now=3.0, refusal="breaker")
    assert plan.kind is PlanKind.UPDATE  # already quarantined: kept current


async def test_excluded_node_is_never_touched():
    k = Cluster(labels={c.LABEL_EXCLUDE: "true"})
    plan = await k.step(verdict(gpu_verdict()), now=1.0)
    assert plan.kind is PlanKind.SKIPPED and k.api.writes() == []
    assert plan.events[0].reason == "GpuQuarantineSkipped"
    assert (await k.step(healthy(), now=2.0)).kind is PlanKind.NONE


@pytest.mark.parametrize("signals", [SignalStatus.STALE, SignalStatus.MISSING])
async def test_unknown_signals_plan_nothing(signals):
    k = Cluster()
    assert (await k.step(verdict(gpu_verdict(), signals=signals), now=1.0)).kind is PlanKind.NONE
    await k.step(verdict(gpu_verdict()), now=2.0)
    n = len(k.api.writes())
    stale_healthy = verdict(signals=signals)
    assert (await k.step(stale_healthy, now=3.0)).kind is PlanKind.NONE
    assert len(k.api.writes()) == n


async def test_recovery_undoes_exactly_what_gpumon_did():
    k = Cluster()
    await k.step(verdict(gpu_verdict()), now=1.0, phase=c.NodePhase.DRAINING)
    plan = await k.step(healthy(), now=2000.0)
    assert plan.kind is PlanKind.RECOVER
    assert plan.events[0].reason == "GpuRecovered" and "GPU 3 (GPU-3)" in plan.events[0].message
    assert k.obj["spec"]["taints"] == [OTHER_TAINT]
    assert k.obj["metadata"]["annotations"] == {"other": "x"}
    assert c.LABEL_STATE not in k.obj["metadata"]["labels"]
    cond = k.condition()
    assert (cond["status"], cond["reason"]) == ("False", c.RECOVERED_REASON)
    assert cond["lastTransitionTime"] == to_rfc3339(2000.0)
    assert {x["type"] for x in k.obj["status"]["conditions"]} == {"Ready", c.CONDITION_TYPE}
    assert (await k.step(healthy(), now=2100.0)).kind is PlanKind.NONE


async def test_a_persons_cordon_survives_recovery():
    k = Cluster(QuarantinePolicy(cordon=True), unschedulable=True)
    await k.step(verdict(gpu_verdict()), now=1.0)
    assert k.obj["metadata"]["annotations"][c.ANNOTATION_CORDON_PREEXISTING] == "true"
    await k.step(healthy(), now=2000.0)
    assert k.obj["spec"]["unschedulable"] is True


async def test_gpumon_cordon_is_lifted_on_recovery():
    k = Cluster(QuarantinePolicy(cordon=True))
    await k.step(verdict(gpu_verdict()), now=1.0)
    assert k.obj["spec"]["unschedulable"] is True
    await k.step(healthy(), now=2000.0)
    assert k.obj["spec"]["unschedulable"] is False


async def test_cordon_added_by_a_person_during_quarantine_stays():
    k = Cluster()
    await k.step(verdict(gpu_verdict()), now=1.0)
    k.obj["spec"]["unschedulable"] = True
    await k.step(healthy(), now=2000.0)
    assert k.obj["spec"]["unschedulable"] is True


async def test_preexisting_gpumon_taint_is_recorded_and_restored():
    person = {"key": c.TAINT_KEY, "value": "maintenance", "effect": "NoExecute"}
    k = Cluster(taints=[OTHER_TAINT, person])
    await k.step(verdict(gpu_verdict()), now=1.0)
    assert k.our_taints() == [{"key": c.TAINT_KEY, "value": "unhealthy", "effect": "NoSchedule"}]
    assert json.loads(k.obj["metadata"]["annotations"][c.ANNOTATION_TAINT_PREEXISTING]) == [person]
    await k.step(healthy(), now=2000.0)
    assert k.obj["spec"]["taints"] == [OTHER_TAINT, person]


async def test_state_label_follows_drain_phase_and_recovery():
    k = Cluster()
    await k.step(verdict(gpu_verdict()), now=10.0, phase=c.NodePhase.DRAINING)
    ann = k.obj["metadata"]["annotations"]
    assert k.obj["metadata"]["labels"][c.LABEL_STATE] == "draining"
    assert ann[c.ANNOTATION_DRAIN_STARTED_AT] == to_rfc3339(10.0)
    assert drain_started_at(k.view, now=50.0) == 10.0
    await k.step(verdict(gpu_verdict()), now=50.0, phase=c.NodePhase.DRAINING)
    assert k.obj["metadata"]["annotations"][c.ANNOTATION_DRAIN_STARTED_AT] == to_rfc3339(10.0)
    await k.step(verdict(gpu_verdict()), now=60.0, phase=c.NodePhase.DRAINED)
    assert k.obj["metadata"]["labels"][c.LABEL_STATE] == "drained"
    assert c.ANNOTATION_DRAIN_STARTED_AT not in k.obj["metadata"]["annotations"]
    assert drain_started_at(k.view, now=70.0) == 70.0
    await k.step(verdict(gpu_verdict(recovering=True)), now=80.0, phase=c.NodePhase.DRAINED)
    assert k.obj["metadata"]["labels"][c.LABEL_STATE] == "recovering"
    # A step of the repair ladder under way (its validation, say) is what the label tells, as the
    # findings clear: the ladder decides when the quarantine lifts.
    await k.step(verdict(gpu_verdict(recovering=True)), now=90.0, phase=c.NodePhase.VALIDATING)
    assert k.obj["metadata"]["labels"][c.LABEL_STATE] == "validating"


async def test_node_scoped_finding_is_recorded_for_the_node():
    k = Cluster()
    nf = finding("nvlink", reason="NvlinkDown", evidence="nvlink 2 > 0")
    await k.step(verdict(node_findings=(nf,)), now=1.0)
    (rec,) = records_from_json(k.obj["metadata"]["annotations"][c.ANNOTATION_UNHEALTHY_GPUS])
    assert (rec.uuid, rec.index, rec.reason) == ("", None, "NvlinkDown")
    assert k.condition()["message"].startswith("node: NvlinkDown (nvlink 2 > 0)")


def test_records_round_trip_and_tolerate_hand_edits():
    recs = (
        GpuRecord("", None, "Custom", Severity.DEGRADED, ("r",), 5.0, "x"),
        GpuRecord("GPU-1", 1, "XidFatal", Severity.UNHEALTHY, ("a", "b"), 7.0, "Xid 79"),
    )
    assert records_from_json(records_to_json(recs)) == recs
    assert records_from_json("not json") == ()
    assert records_from_json('{"a": 1}') == ()
    mixed = [
        *json.loads(records_to_json(recs)),
        {"uuid": "x"},
        {**json.loads(records_to_json(recs))[1], "firstSeen": "?"},
    ]
    assert records_from_json(json.dumps(mixed)) == recs


async def test_conflict_rereads_replans_and_retries():
    k = Cluster()
    plan = plan_node(k.view, verdict(gpu_verdict()), now=1.0)
    k.api.touch(PATH)  # someone else wrote the node meanwhile
    fresh_rv = k.view.resource_version
    seen = []

    def replan(view: NodeView):
        seen.append(view.resource_version)
        return plan_node(view, verdict(gpu_verdict()), now=1.0).write

    result = await apply_node_write(k.api, plan.write, replan)
    assert seen == [fresh_rv]
    assert [m for m, _, _ in k.api.calls] == ["PATCH", "GET", "PATCH", "PATCH"]
    assert result is not None and result.gpu_condition is not None
    assert k.our_taints()


async def test_conflict_that_persists_is_raised():
    k = Cluster()

    def replan(view: NodeView):
        k.api.touch(PATH)
        return plan_node(view, verdict(gpu_verdict()), now=1.0).write

    plan = plan_node(k.view, verdict(gpu_verdict()), now=1.0)
    k.api.touch(PATH)
    with pytest.raises(Conflict):
        await apply_node_write(k.api, plan.write, replan, RetryPolicy(conflict_attempts=3))


async def test_replan_with_nothing_left_returns_quietly():
    k = Cluster()
    plan = plan_node(k.view, verdict(gpu_verdict()), now=1.0)
    k.api.touch(PATH)
    assert await apply_node_write(k.api, plan.write, lambda view: None) is None
