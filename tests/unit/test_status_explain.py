"""``gpumon status node NAME``: the explanation of one node, from cluster objects as the API
server and the controller write them, and an exporter snapshot as the exporter serves it."""

from __future__ import annotations

from typing import Any

from status_builders import at, event, node, pod, record, snapshot_doc, state

from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core.contract.breakers import BreakerTrip, breaker_to_annotation
from gpumon.controller.core.objects import pdb_from_json
from gpumon.gpu.health import Severity
from gpumon.status.explain import build_explanation
from gpumon.status.model import Explanation

NAME = "gpu-a-1"
POLICY = build_policy(
    ControllerConfig(
        policy={
            "rules": [
                {"name": "xid-unhealthy", "recoverAfter": "30m"},
                {"name": "thermal-degraded", "recoverAfter": 120},
            ]
        }
    )
)


def explain(**kw: Any) -> Explanation:
    n = kw.pop("node_obj", None) or node(
        NAME,
        records=(record(1), record(3, "Thermal", Severity.DEGRADED, rules=("thermal-degraded",))),
        quarantined_ago=600,
        state="draining",
    )
    return build_explanation(state([n], kw.pop("pods", []), **kw), pool_label="gpumon.io/pool", policy=POLICY)


def test_the_rules_that_fired_with_evidence_and_when() -> None:
    why = explain()
    assert why.node.quarantined_at == at(600)
    assert [(p.index, p.reason, p.rules, p.evidence, p.first_seen) for p in why.node.problems] == [
        (1, "XidFatal", ("xid-unhealthy",), "Xid 79", at(300)),
        (3, "Thermal", ("thermal-degraded",), "Xid 79", at(300)),
    ]
    assert why.condition is not None and why.condition.reason == "XidFatal" and why.condition.since == at(600)


def test_what_lifts_the_quarantine_follows_each_rules_recover_after() -> None:
    gpu1, gpu3, then, by_hand = explain().lift
    assert gpu1.startswith("GPU 1 (GPU-1): XidFatal (xid-unhealthy) must clear, then stay clear for 30m00s")
    assert "an Xid counts for 10m00s after it was seen" in gpu1 and "Recommended: drain the node" in gpu1
    assert "stay clear for 2m00s" in gpu3 and "Xid" not in gpu3.split("Recommended")[0]
    assert then == "then gpumon removes the taint gpumon.io/gpu-unhealthy, sets GpuUnhealthy=False"
    assert by_hand.startswith(f"by hand: kubectl label node {NAME} gpumon.io/exclude=true")


def test_a_persons_cordon_stays_and_gpumons_own_is_lifted() -> None:
    def lifted(**kw: Any) -> str:
        n = node(NAME, records=(record(1),), quarantined_ago=60, **kw)
        return explain(node_obj=n).lift[-2]

    assert lifted(cordoned=True, cordon_preexisting=True).endswith(f"(kubectl uncordon {NAME} when done)")
    assert lifted(cordoned=True, cordon_preexisting=False).endswith("uncordons the node (it cordoned it)")


def test_an_excluded_node_is_never_lifted_by_gpumon() -> None:
    why = explain(node_obj=node(NAME, records=(record(1),), quarantined_ago=60, excluded=True))
    assert why.lift[-1].endswith(f"(kubectl taint node {NAME} gpumon.io/gpu-unhealthy-)")
    assert any(line.startswith("gpumon.io/exclude=true") for line in why.refused)


def test_a_healthy_node_has_nothing_to_lift() -> None:
    why = explain(node_obj=node(NAME))
    assert why.lift == ("not quarantined: nothing to lift",) and why.node.problems == ()


def test_the_timeline_keeps_node_events_deletions_and_the_pools_breaker() -> None:
    events = (
        event("Node", NAME, "GpuQuarantined", "tainted ...", ago=600),
        event("Node", NAME, "GpuPodEvicted", "evicted ml/train-0: uses GPU 1", ago=590),
        event(
            "Pod",
            "train-0",
            "GpuPodEvicted",
            f"evicted from node {NAME}: uses GPU 1",
            namespace="ml",
            ago=590,
        ),
        event(
            "Pod",
            "stuck",
            "GpuPodDeleted",
            f"deleted from node {NAME} after the drain deadline",
            namespace="ml",
            ago=5,
        ),
        event("Pod", "other", "GpuPodEvicted", "evicted from node gpu-a-10: ...", namespace="ml", ago=5),
        event("Node", "gpu-a-10", "GpuQuarantined", "tainted ...", ago=5),
        event(
            "ConfigMap",
            "gpumon-controller",
            "GpuBreakerOpen",
            "circuit breaker for pool 'a100' opened",
            namespace="gpumon-system",
            ago=3,
        ),
        event(
            "ConfigMap",
            "gpumon-controller",
            "GpuBreakerOpen",
            "circuit breaker for pool 'h100' opened",
            namespace="gpumon-system",
            ago=2,
        ),
    )
    why = explain(events=events)
    assert [(e.reason, e.about) for e in why.timeline] == [
        ("GpuQuarantined", f"Node/{NAME}"),
        ("GpuPodEvicted", f"Node/{NAME}"),
        ("GpuPodDeleted", "Pod/ml/stuck"),
        ("GpuBreakerOpen", "ConfigMap/gpumon-system/gpumon-controller"),
    ]
    assert why.node.evicted == ("ml/train-0", "ml/stuck")


def test_what_holds_the_controller_back_now() -> None:
    key, value = breaker_to_annotation(BreakerTrip("a100", 1_799_990_000.0, "3 of 10 nodes"))
    n = node(NAME, records=(record(1),), quarantined_ago=60, cordoned=True, cordon_preexisting=True)
    dry = (event("Node", NAME, "GpuQuarantined", "[dry-run] tainted ...", ago=1),)
    why = explain(node_obj=n, state_annotations={key: value, "gpumon.io/paused": "true"}, events=dry)
    breaker, paused, dry_run, cordon = why.refused
    assert (
        breaker.startswith("circuit breaker open for pool 'a100' since ")
        and "breaker.gpumon.io/a100" in breaker
    )
    assert paused.startswith("paused") and dry_run.startswith("dry-run (from its events)")
    assert cordon.startswith("cordoned by a person")


def test_blocked_evictions_name_the_pod_and_its_pdbs() -> None:
    pdb = pdb_from_json(
        {"metadata": {"namespace": "ml", "name": "keep"}, "spec": {"selector": {"matchLabels": {"app": "s"}}}}
    )
    pods = [
        pod("ml", "s-0", node_name=NAME, labels={"app": "s"}),
        pod("ml", "s-00", node_name=NAME, labels={"app": "s"}),
    ]
    events = (
        event("Node", NAME, "GpuEvictionBlocked", "eviction of ml/s-0 refused (PDB ml/keep): no", ago=1),
    )
    (blocker,) = explain(pods=pods, pdbs=(pdb,), events=events).blockers
    assert (blocker.pod, blocker.pdbs) == ("ml/s-0", ("ml/keep",))


def test_latest_signals_from_the_exporters_snapshot() -> None:
    why = explain(snapshot=snapshot_doc(NAME), snapshot_source="http://exporter/api/v1/snapshot")
    healthy, bad = why.signals
    assert (bad.index, bad.uuid, bad.health, bad.reasons, bad.xids) == (
        1,
        "GPU-1",
        "unhealthy",
        ("XidFatal: Xid 79",),
        {79: 2},
    )
    assert (healthy.health, healthy.temperature_celsius, healthy.ecc_uncorrected) == ("healthy", 40.0, 0)
    unreachable = explain(snapshot_error="no running exporter pod on the node")
    assert unreachable.signals == () and unreachable.signals_error == "no running exporter pod on the node"


def test_the_repair_ladder_tried_so_far_and_what_comes_next() -> None:
    from rich.console import Console

    from gpumon.controller.core.contract.repair import (
        Attempt,
        AttemptOutcome,
        LadderStep,
        RepairRecord,
        record_to_json,
    )
    from gpumon.status import render

    n = node(NAME, records=(record(1),), quarantined_ago=900, state="rebooting")
    t0 = 1_800_000_000.0
    ladder = RepairRecord(
        (
            Attempt(
                LadderStep.RESET,
                1,
                ("GPU-1",),
                t0,
                AttemptOutcome.TIMED_OUT,
                ended_at=t0 + 600,
                detail="not finished",
            ),
            Attempt(LadderStep.REBOOT, 2, ("",), t0 + 610),
        )
    )
    n["metadata"]["annotations"]["gpumon.io/repair"] = record_to_json(ladder)
    why = explain(node_obj=n)
    assert why.repair is not None
    assert [(s.attempt, s.step, s.gpus, s.outcome, s.detail) for s in why.repair.steps] == [
        (1, "reset", ("GPU-1",), "timed_out", "not finished"),
        (2, "reboot", (), "running", ""),
    ]
    assert why.repair.next == "waiting for the reboot Job of attempt 2 to finish"
    console = Console(width=200, record=True)
    console.print(render.explanation(why))
    text = console.export_text()
    assert "Repair ladder" in text and "timed_out" in text and "next: waiting for the reboot Job" in text
    assert explain().repair is None, "no ladder on the node"
    gave_up = RepairRecord(ladder.attempts[:1], gave_up_at=t0 + 700)
    n["metadata"]["annotations"]["gpumon.io/repair"] = record_to_json(gave_up)
    assert explain(node_obj=n).repair.next.startswith("nothing: the ladder gave up")  # type: ignore[union-attr]
