"""The cluster states the demo's steps wait for, checked against hand-made views."""

from __future__ import annotations

from demo_builders import job, node, pod, pool, snapshot, view

from gpumon.demo import expect
from gpumon.demo.expect import Broken, StepContext
from gpumon.demo.scenario import Expect

CTX = StepContext(apps={"trainer": 2}, attributed_app="trainer", pool_desired_before=2)


def _steady_cluster(**over: object) -> dict[str, object]:
    parts: dict[str, object] = {
        "nodes": [node("gpu-pool-0"), node("gpu-pool-1")],
        "pods": [pod("trainer-a", "gpu-pool-0"), pod("trainer-b", "gpu-pool-1")],
        "md": pool(2),
        "snapshots": {
            "gpu-pool-0": snapshot(4, {0: ["trainer-a"]}),
            "gpu-pool-1": snapshot(4, {1: ["trainer-b"]}),
        },
    }
    return parts | over


def test_steady_needs_everything_running_placed_and_untainted() -> None:
    outcome = expect.check(Expect.STEADY, view(**_steady_cluster()), CTX)  # type: ignore[arg-type]
    assert outcome.met, outcome.detail
    assert outcome.detail.startswith("2 nodes Ready, pool 2/2, trainer 2/2 Running")


def test_steady_says_what_is_missing() -> None:
    cases = {
        "gpu-pool-1 tainted NoSchedule": {
            "nodes": [node("gpu-pool-0"), node("gpu-pool-1", taint="NoSchedule")]
        },
        "gpu-pool-1 NotReady": {"nodes": [node("gpu-pool-0"), node("gpu-pool-1", ready=False)]},
        "gpu-pool-1: no exporter answer": {"snapshots": {"gpu-pool-0": snapshot(4, {0: ["trainer-a"]})}},
        "trainer-b not placed on a GPU yet": {
            "snapshots": {"gpu-pool-0": snapshot(4, {0: ["trainer-a"]}), "gpu-pool-1": snapshot(4)}
        },
        "trainer 1/2 Running, 1 Pending": {
            "pods": [pod("trainer-a", "gpu-pool-0"), pod("trainer-b", None, phase="Pending")]
        },
        "pool 1/2 nodes with GPUs": {"nodes": [node("gpu-pool-0"), node("gpu-pool-1", gpus=0)]},
    }
    for missing, over in cases.items():
        outcome = expect.check(Expect.STEADY, view(**_steady_cluster(**over)), CTX)  # type: ignore[arg-type]
        assert not outcome.met and missing in outcome.detail, (missing, outcome.detail)


def test_quarantined_needs_taint_condition_the_victim_gone_and_its_replacement_running() -> None:
    ctx = StepContext(
        apps={"trainer": 2},
        attributed_app="trainer",
        pool_desired_before=2,
        broken=(Broken("gpu-pool-0", 0, ("gpumon-demo/trainer-a",)),),
    )
    done = view(
        [node("gpu-pool-0", taint="NoSchedule", condition="XidFatal"), node("gpu-pool-1")],
        [
            pod("trainer-a", "gpu-pool-0", deleting=True),
            pod("trainer-b", "gpu-pool-1"),
            pod("trainer-c", "gpu-pool-1"),
        ],
        pool(2),
    )
    outcome = expect.check(Expect.QUARANTINED, done, ctx)
    assert outcome.met, outcome.detail
    assert "taint NoSchedule, GpuUnhealthy=True (XidFatal); evicted: trainer-a; trainer 2/2" in outcome.detail
    untainted = view(
        [node("gpu-pool-0", condition="XidFatal"), node("gpu-pool-1")],
        done_pods := [pod("trainer-b", "gpu-pool-1"), pod("trainer-c", "gpu-pool-1")],
        pool(2),
    )
    assert not expect.check(Expect.QUARANTINED, untainted, ctx).met
    victim_runs = view(
        [node("gpu-pool-0", taint="NoSchedule", condition="XidFatal"), node("gpu-pool-1")],
        [*done_pods, pod("trainer-a", "gpu-pool-0")],
        pool(2),
    )
    outcome = expect.check(Expect.QUARANTINED, victim_runs, ctx)
    assert not outcome.met and "still running: gpumon-demo/trainer-a" in outcome.detail
    unreplaced = view(
        [node("gpu-pool-0", taint="NoSchedule", condition="XidFatal"), node("gpu-pool-1")],
        [pod("trainer-b", "gpu-pool-1"), pod("trainer-c", None, phase="Pending")],
        pool(2),
    )
    assert not expect.check(Expect.QUARANTINED, unreplaced, ctx).met


def test_scaled_up_needs_more_replicas_with_gpus_and_every_pod_running() -> None:
    ctx = StepContext(apps={"trainer": 3}, attributed_app="trainer", pool_desired_before=2)
    pods = [pod("trainer-a", "gpu-pool-0"), pod("trainer-b", "gpu-pool-1")]
    booting = view(
        [node("gpu-pool-0"), node("gpu-pool-1")],
        [*pods, pod("trainer-c", None, phase="Pending")],
        pool(3, available=2),
    )
    assert not expect.check(Expect.SCALED_UP, booting, ctx).met
    landed = view(
        [node("gpu-pool-0"), node("gpu-pool-1"), node("gpu-pool-2")],
        [*pods, pod("trainer-c", "gpu-pool-2")],
        pool(3),
    )
    outcome = expect.check(Expect.SCALED_UP, landed, ctx)
    assert outcome.met and outcome.detail.startswith("pool 2 -> 3 replicas (3 joined, 3 with GPUs)")


def test_recovered_needs_taint_and_condition_gone() -> None:
    ctx = StepContext(
        apps={}, attributed_app="trainer", pool_desired_before=2, broken=(Broken("gpu-pool-0", 1, ()),)
    )
    still = view(
        [node("gpu-pool-0", condition="XidFatal")],
        [],
        pool(1),
        {"gpu-pool-0": snapshot(4, states={1: "healthy"})},
    )
    assert not expect.check(Expect.RECOVERED, still, ctx).met
    done = view([node("gpu-pool-0")], [], pool(1), {"gpu-pool-0": snapshot(4)})
    outcome = expect.check(Expect.RECOVERED, done, ctx)
    assert outcome.met and outcome.detail == "gpu-pool-0 GPU 1 healthy: taint lifted, GpuUnhealthy=False"
    assert not expect.check(Expect.RECOVERED, view([], [], pool(1)), ctx).met  # the node is gone


def test_repaired_needs_the_reset_and_the_validation_succeeded_and_the_quarantine_lifted() -> None:
    ctx = StepContext(
        apps={}, attributed_app="trainer", pool_desired_before=2, broken=(Broken("gpu-pool-0", 1, ()),)
    )
    healthy = {"gpu-pool-0": snapshot(4)}
    lifted = [node("gpu-pool-0")]
    validating = view(
        lifted,
        [],
        pool(1),
        healthy,
        jobs=[job("gpu-pool-0", "reset"), job("gpu-pool-0", "validate", succeeded=False)],
    )
    outcome = expect.check(Expect.REPAIRED, validating, ctx)
    assert not outcome.met and "reset Job succeeded, validate Job running" in outcome.detail
    # Lifted without the repair (a recovery on its own) is not a repair.
    assert not expect.check(Expect.REPAIRED, view(lifted, [], pool(1), healthy), ctx).met
    jobs = [job("gpu-pool-0", "reset"), job("gpu-pool-0", "validate"), job("gpu-pool-1", "reset")]
    still = view(
        [node("gpu-pool-0", taint="NoSchedule", condition="EccUncorrectable")],
        [],
        pool(1),
        healthy,
        jobs=jobs,
    )
    assert not expect.check(Expect.REPAIRED, still, ctx).met, "the hysteresis has not passed"
    outcome = expect.check(Expect.REPAIRED, view(lifted, [], pool(1), healthy, jobs=jobs), ctx)
    assert outcome.met and outcome.detail == (
        "gpu-pool-0: reset Job succeeded, validate Job succeeded; "
        "GPU 1 healthy: taint lifted, GpuUnhealthy=False"
    )


def test_scaled_down_needs_fewer_replicas_and_the_nodes_gone() -> None:
    ctx = StepContext(apps={"trainer": 1}, attributed_app="trainer", pool_desired_before=3)
    pods = [pod("trainer-a", "gpu-pool-0")]
    lowered = view([node("gpu-pool-0"), node("gpu-pool-1", unschedulable=True)], pods, pool(1))
    assert not expect.check(Expect.SCALED_DOWN, lowered, ctx).met
    done = view([node("gpu-pool-0"), node("gpu-shared-0", pool=None)], pods, pool(1))
    outcome = expect.check(Expect.SCALED_DOWN, done, ctx)
    assert outcome.met and outcome.detail.startswith("pool 3 -> 1 replicas (1 nodes left)")


def test_replaced_needs_the_broken_node_gone_its_successor_up_and_the_pool_at_its_size() -> None:
    ctx = StepContext(
        apps={"trainer": 2},
        attributed_app="trainer",
        pool_desired_before=2,
        broken=(Broken("gpu-pool-0", 1, ("gpumon-demo/trainer-a",)),),
    )
    pods = [pod("trainer-a", "gpu-pool-1"), pod("trainer-b", "gpu-pool-1")]
    draining = view([node("gpu-pool-0", unschedulable=True), node("gpu-pool-1")], pods, pool(2))
    joining = view([node("gpu-pool-1"), node("gpu-pool-2", gpus=0)], pods, pool(2))
    shrunk = view([node("gpu-pool-1")], pods, pool(1))
    for not_yet in (draining, joining, shrunk):
        assert not expect.check(Expect.REPLACED, not_yet, ctx).met
    assert "gpu-pool-0 still there" in expect.check(Expect.REPLACED, draining, ctx).detail
    done = view([node("gpu-pool-1"), node("gpu-pool-2")], pods, pool(2))
    outcome = expect.check(Expect.REPLACED, done, ctx)
    assert outcome.met and outcome.detail == (
        "gpu-pool-0 gone; pool 2/2 nodes with GPUs (was 2), trainer 2/2 Running"
    )
