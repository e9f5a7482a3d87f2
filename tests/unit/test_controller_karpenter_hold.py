"""A quarantined Karpenter node carries karpenter.sh/do-not-disrupt, written in the quarantine's
own merge patch; recovery takes off only what gpumon put there."""

from __future__ import annotations

from controller_fakes import FakeKube, gpu_verdict, healthy, verdict

from gpumon.controller.act.node_write import apply_node_write
from gpumon.controller.core import contract as c
from gpumon.controller.core.node_plan import plan_node
from gpumon.controller.core.objects import node_from_json
from gpumon.controller.core.plans import NodePlan, PlanKind

PATH = "/api/v1/nodes/n1"
KARPENTER = {c.KARPENTER_NODEPOOL_LABEL: "gpu"}
HOLD = c.KARPENTER_DO_NOT_DISRUPT_ANNOTATION


class Node:
    def __init__(self, labels: dict[str, str], annotations: dict[str, str] | None = None) -> None:
        self.api = FakeKube()
        meta = {"name": "n1", "labels": labels, "annotations": {"other": "x", **(annotations or {})}}
        self.api.add(PATH, {"metadata": meta, "spec": {}, "status": {"conditions": []}})

    @property
    def annotations(self) -> dict[str, str]:
        return self.api.objects[PATH]["metadata"]["annotations"]

    async def step(self, v, now: float) -> NodePlan:
        plan = plan_node(node_from_json(self.api.objects[PATH]), v, now=now)
        if plan.write is not None:
            await apply_node_write(self.api, plan.write, lambda view: None)
        return plan


async def test_quarantine_of_a_karpenter_node_holds_it_in_the_same_patch_and_recovery_lets_go():
    k = Node(KARPENTER)
    plan = await k.step(verdict(gpu_verdict()), now=10.0)
    assert plan.kind is PlanKind.QUARANTINE
    merge = plan.write.merge_patch["metadata"]["annotations"]
    assert merge[HOLD] == "true" and merge[c.ANNOTATION_QUARANTINED_AT]  # one patch, with the taint
    assert k.annotations[c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING] == "null"
    assert (await k.step(verdict(gpu_verdict()), now=20.0)).kind is PlanKind.NONE

    recovered = await k.step(healthy(), now=30.0)
    assert recovered.kind is PlanKind.RECOVER
    assert k.annotations == {"other": "x"}


async def test_a_hold_someone_else_set_stays_after_recovery():
    k = Node(KARPENTER, {HOLD: "true"})
    await k.step(verdict(gpu_verdict()), now=10.0)
    assert k.annotations[c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING] == '"true"'
    await k.step(healthy(), now=30.0)
    assert k.annotations == {"other": "x", HOLD: "true"}


async def test_another_value_is_overridden_while_quarantined_and_put_back():
    k = Node(KARPENTER, {HOLD: "false"})
    await k.step(verdict(gpu_verdict()), now=10.0)
    assert k.annotations[HOLD] == "true"
    await k.step(healthy(), now=30.0)
    assert k.annotations == {"other": "x", HOLD: "false"}


async def test_a_node_quarantined_before_the_hold_existed_gets_it_and_records_what_was_there():
    k = Node(KARPENTER)
    await k.step(verdict(gpu_verdict()), now=10.0)
    del k.annotations[HOLD], k.annotations[c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING]
    plan = await k.step(verdict(gpu_verdict()), now=20.0)
    assert plan.kind is PlanKind.UPDATE and k.annotations[HOLD] == "true"
    await k.step(healthy(), now=30.0)
    assert HOLD not in k.annotations


async def test_an_unreadable_record_leaves_the_hold_to_people_on_recovery():
    k = Node(KARPENTER)
    await k.step(verdict(gpu_verdict()), now=10.0)
    k.annotations[c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING] = "edited by hand"
    await k.step(healthy(), now=30.0)
    assert k.annotations == {"other": "x", HOLD: "true"}


async def test_nodes_karpenter_did_not_launch_get_no_hold():
    k = Node({"gpumon.io/pool": "gpu"})
    plan = await k.step(verdict(gpu_verdict()), now=10.0)
    assert plan.kind is PlanKind.QUARANTINE
    assert HOLD not in k.annotations and c.ANNOTATION_DO_NOT_DISRUPT_PREEXISTING not in k.annotations
