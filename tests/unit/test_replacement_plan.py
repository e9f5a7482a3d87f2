"""The replacement step's pure parts (gpumon/controller/core/repair_replace.py and its record
in core/contract/repair.py): what the planner reads of a Machine or NodeClaim, and how a
replacement whose Node is gone ends. The real Cluster API and Karpenter controllers carry it out
in tests/cluster/test_repair_replace.py."""

from __future__ import annotations

from dataclasses import replace

from gpumon.controller.core import contract as c
from gpumon.controller.core.contract.repair import (
    Replacement,
    replacement_to_annotation,
    replacements_from_annotations,
)
from gpumon.controller.core.node_owner import NodeOwner
from gpumon.controller.core.plans import ObjectRef
from gpumon.controller.core.repair import Machinery, Work
from gpumon.controller.core.repair_replace import (
    Ending,
    HealthCheckCover,
    ReplacementView,
    covering_health_check,
    follow_replacement,
    health_check_events,
    machinery_of,
    owner_work,
    replacement_condition,
)

T = 1_800_000_000.0
PATH = "/apis/cluster.x-k8s.io/v1beta2/namespaces/capi/machines/h100-abc"
R = Replacement(
    node="n1",
    pool="h100",
    owner=PATH,
    machinery="cluster-api",
    attempt=2,
    gpus=("GPU-1",),
    started_at=T,
    deadline_at=T + 3600,
    before=("n1", "n2"),
)
ABOUT = ObjectRef("MachineDeployment", "h100", "", "capi", "cluster.x-k8s.io/v1beta2")


def test_the_record_round_trips_under_a_key_that_fits_any_node_name() -> None:
    long = replace(R, node="n" * 253, gave_up_at=T + 5)
    for r in (R, long):
        key, value = replacement_to_annotation(r)
        assert key.startswith(c.REPLACEMENT_ANNOTATION_PREFIX) and len(key.split("/", 1)[1]) <= 63
        assert replacements_from_annotations({key: value, "breaker.gpumon.io/h100": "{}"}) == [r]


def test_an_unreadable_record_is_left_alone() -> None:
    key, value = replacement_to_annotation(R)
    other, _ = replacement_to_annotation(replace(R, node="n9"))
    assert replacements_from_annotations({key: "{not json"}) == []
    assert replacements_from_annotations({key: value.replace('"n":2', '"n":"x"')}) == []
    assert replacements_from_annotations({other: value}) == [], "filed under another node's key"


def test_the_owner_tells_the_work() -> None:
    assert owner_work(None) is Work.SUCCEEDED
    assert owner_work({"metadata": {"name": "m"}}) is Work.ABSENT
    assert owner_work({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}) is Work.RUNNING
    assert machinery_of(None) is Machinery.NONE
    assert machinery_of(NodeOwner("cluster-api", "Machine", "v", "m", "ns")) is Machinery.CLUSTER_API
    assert machinery_of(NodeOwner("karpenter", "NodeClaim", "v", "nc")) is Machinery.KARPENTER


def test_while_the_node_is_there_its_own_record_judges() -> None:
    running = follow_replacement(R, ReplacementView(True, attempt_running=True), now=T + 9999, about=ABOUT)
    assert running.ending is Ending.KEEP and running.event is None
    ended = follow_replacement(R, ReplacementView(True, attempt_running=False), now=T, about=ABOUT)
    assert ended.ending is Ending.DROP


def test_cluster_api_needs_the_machine_gone_and_a_new_node_in_the_pool() -> None:
    waiting = [
        ReplacementView(False),  # the owner could not be read
        ReplacementView(False, owner_gone=False),
        ReplacementView(False, owner_gone=True),  # no new node yet
    ]
    for view in waiting:
        assert follow_replacement(R, view, now=T + 10, about=ABOUT).ending is Ending.KEEP
    done = follow_replacement(R, ReplacementView(False, owner_gone=True, joined=("n3",)), now=T, about=ABOUT)
    assert done.ending is Ending.SUCCEEDED and done.event is not None
    assert done.event.about == ABOUT and done.event.reason == "GpuRepairSucceeded"
    assert "Machine h100-abc is gone; n3 joined pool 'h100'" in done.event.message


def test_karpenter_is_done_once_the_node_claim_is_gone() -> None:
    k = replace(R, machinery="karpenter", owner="/apis/karpenter.sh/v1/nodeclaims/gpu-x")
    done = follow_replacement(k, ReplacementView(False, owner_gone=True), now=T, about=ABOUT)
    assert done.ending is Ending.SUCCEEDED and done.event is not None
    assert "NodeClaim gpu-x is gone" in done.event.message


def test_past_the_deadline_it_gives_up_once_and_keeps_the_record_for_a_person() -> None:
    late = T + 3600
    for view, missing in (
        (ReplacementView(False, owner_gone=False), "the Machine is still there"),
        (ReplacementView(False, owner_gone=True), "no new node joined the pool"),
    ):
        plan = follow_replacement(R, view, now=late, about=ABOUT)
        assert plan.ending is Ending.GAVE_UP and plan.record == replace(R, gave_up_at=late)
        assert plan.event is not None and plan.event.warning and missing in plan.event.message
        again = follow_replacement(plan.record, view, now=late + 5, about=ABOUT)
        assert again.ending is Ending.KEEP and again.event is None


MACHINE = {
    "metadata": {"name": "h100-abc", "labels": {"cluster.x-k8s.io/deployment-name": "h100", "gpu": "h100"}},
    "spec": {"clusterName": "prod"},
}


def health_check(name: str, selector: dict, *, cluster: str = "prod", conditions=()) -> dict:
    checks = {
        "unhealthyNodeConditions": [{"type": t, "status": s, "timeoutSeconds": 0} for t, s in conditions]
    }
    return {
        "metadata": {"name": name},
        "spec": {"clusterName": cluster, "selector": selector, "checks": checks},
    }


def test_a_health_check_covers_a_machine_of_its_cluster_its_selector_matches() -> None:
    by_deployment = {"matchLabels": {"cluster.x-k8s.io/deployment-name": "h100"}}
    by_expression = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100", "a100"]}]}
    other_pool = {"matchLabels": {"cluster.x-k8s.io/deployment-name": "a100"}}
    assert covering_health_check(MACHINE, []) is None
    assert covering_health_check(MACHINE, [health_check("a", other_pool)]) is None
    assert covering_health_check(MACHINE, [health_check("a", by_deployment, cluster="staging")]) is None
    assert covering_health_check(
        MACHINE, [health_check("b", by_deployment), health_check("a", by_expression)]
    ) == (HealthCheckCover("a", watches=False))
    watching = health_check(
        "c", by_deployment, conditions=[("Ready", "False"), (c.REPLACEMENT_CONDITION_TYPE, "True")]
    )
    assert covering_health_check(MACHINE, [watching]) == HealthCheckCover("c", watches=True)
    wrong_status = health_check("d", by_deployment, conditions=[(c.REPLACEMENT_CONDITION_TYPE, "False")])
    assert covering_health_check(MACHINE, [wrong_status]) == HealthCheckCover("d", watches=False)


def test_the_condition_asks_and_withdraws_by_type() -> None:
    asked = replacement_condition(True, at="2027-01-15T08:00:00Z", message="m")["status"]["conditions"]
    assert [(x["type"], x["status"], x["reason"]) for x in asked] == [
        (c.REPLACEMENT_CONDITION_TYPE, "True", "GpuRepairReplace")
    ]
    withdrawn = replacement_condition(False, at="2027-01-15T08:00:00Z", message="m")["status"]["conditions"]
    assert [(x["type"], x["status"]) for x in withdrawn] == [(c.REPLACEMENT_CONDITION_TYPE, "False")]


def test_a_health_check_that_does_not_watch_the_condition_is_told_with_the_fix() -> None:
    (asked,) = health_check_events("n1", "h100-abc", HealthCheckCover("mhc", watches=True), 2)
    assert asked.reason == "GpuRepairReplaceRequested" and not asked.warning
    assert "MachineHealthCheck mhc covers Machine h100-abc" in asked.message
    _, blind = health_check_events("n1", "h100-abc", HealthCheckCover("mhc", watches=False), 2)
    assert blind.warning and blind.reason == "GpuRepairHealthCheckBlind"
    assert f'{{type: {c.REPLACEMENT_CONDITION_TYPE}, status: "True", timeoutSeconds: 0}}' in blind.message
