"""The scale planner (gpumon.controller.core.scale_plan): a pure function of pools, cluster and time."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from gpumon.config.pools import PoolConfig
from gpumon.controller.configure import pool_from_config
from gpumon.controller.core.contract import CA_MAX_ANNOTATION, CA_MIN_ANNOTATION, RECORD_ANNOTATION
from gpumon.controller.core.contract.autoscaler import (
    Record,
    Removal,
    record_from_annotation,
    record_to_annotation,
)
from gpumon.controller.core.demand import PodDemand, Toleration
from gpumon.controller.core.pools import Pool, PoolNode, ScaleState, pool_node_from_json
from gpumon.controller.core.scale_plan import (
    SETTLE_SECONDS,
    Action,
    PoolInput,
    PoolPlan,
    bounds,
    plan_pools,
    removal_record,
)

GPU = "nvidia.com/gpu"
NOW = 10_000.0


def make_pool(name: str = "a", **over: Any) -> Pool:
    cfg: dict[str, Any] = {
        "name": name,
        "target": {"namespace": "capi", "name": f"md-{name}"},
        "node_selector": f"pool={name}",
        "template": {"resources": {GPU: 8}},
        "max_replicas": 10,
        **over,
    }
    return pool_from_config(PoolConfig.model_validate(cfg))


def scale(replicas: int = 0, record: Record | None = None, **annotations: str) -> ScaleState:
    ann = dict(annotations)
    if record is not None:
        ann[RECORD_ANNOTATION] = record_to_annotation(record)
    return ScaleState(replicas, replicas, "", "7", "uid-md", MappingProxyType(ann))


def node(name: str, created_at: float = 0.0, allocatable: bool = True, **kw: Any) -> PoolNode:
    return PoolNode(name, created_at, allocatable, **kw)


def pods(count: int, gpus: int = 2, prefix: str = "p", **kw: Any) -> list[PodDemand]:
    return [
        PodDemand(
            "ml", f"{prefix}{i}", f"uid-{prefix}{i}", MappingProxyType({GPU: gpus * 1000, "pods": 1000}), **kw
        )
        for i in range(count)
    ]


def plan1(
    pool: Pool,
    sc: ScaleState | None,
    pending: list[PodDemand] = (),
    now: float = NOW,
    **kw: Any,  # type: ignore[assignment]
) -> PoolPlan:
    (p,) = plan_pools([PoolInput(pool, sc, **kw)], pending, now)
    return p


def after(plan: PoolPlan, replicas: int | None = None) -> ScaleState:
    """The target once a plan was carried out."""
    return scale(plan.desired if replicas is None else replicas, plan.record)


def idle_since(*names: str, at: float = 0.0) -> dict[str, float]:
    return {n: at for n in names}


# -- scale-up ----------------------------------------------------------------------------------


def test_pending_pods_ask_for_exactly_the_nodes_they_fill() -> None:
    p = plan1(make_pool(), scale(0), pods(5))
    assert p.action is Action.SCALE_UP and (p.current, p.desired, p.demand_nodes) == (0, 2, 2)
    assert p.pods == tuple(f"ml/p{i}" for i in range(5))
    assert set(p.record.provided) == {f"uid-p{i}" for i in range(5)} and p.record.scaled_up_at == NOW
    assert p.record_changed and p.pending == 5
    assert p.reason == (
        "scaling MachineDeployment capi/md-a 0 -> 2: 5 pending GPU pod(s) need 2 node(s) "
        "(ml/p0, ml/p1, ml/p2, ml/p3, ml/p4)"
    )
    assert [n.reason for n in p.notes] == ["GpuPoolScaleUp"]


def test_no_second_scale_up_while_capacity_arrives() -> None:
    pool, pending = make_pool(), pods(5)
    first = plan1(pool, scale(0), pending)
    sc = after(first)
    booting = plan1(pool, sc, pending, now=NOW + 5)
    assert booting.action is Action.NONE and booting.desired == 2 and booting.arriving == 2
    joined = (node("n0", NOW + 6, allocatable=False), node("n1", NOW + 6, allocatable=False))
    plugin_starting = plan1(pool, sc, pending, now=NOW + 8, nodes=joined)
    assert plugin_starting.action is Action.NONE and plugin_starting.arriving == 2
    # GPUs allocatable, the scheduler has bound some pods but not all yet.
    ready = (node("n0", NOW + 6), node("n1", NOW + 6))
    binding = plan1(
        pool,
        sc,
        pending[3:],
        now=NOW + 12,
        nodes=ready,
        busy=frozenset({"n0", "n1"}),
        ready_since=idle_since("n0", "n1", at=NOW + 11),
    )
    assert binding.action is Action.NONE and set(binding.record.provided) == {"uid-p3", "uid-p4"}


def test_idle_ready_nodes_take_pending_pods_instead_of_new_ones() -> None:
    # The scheduler has not bound them yet, or cannot for reasons a template does not show.
    p = plan1(make_pool(), scale(2), pods(5), nodes=(node("n0"), node("n1")))
    assert p.action is Action.NONE and p.desired == 2
    assert "wait for capacity" in p.reason


def test_pods_provided_for_count_again_once_capacity_settled_without_them() -> None:
    pool = make_pool()
    rec = Record(provided=MappingProxyType({"uid-p0": NOW - 100}), scaled_up_at=NOW - 100)
    busy = (node("n0"),)
    kw: dict[str, Any] = {"nodes": busy, "busy": frozenset({"n0"})}
    settling = plan1(pool, scale(1, rec), pods(1), ready_since={"n0": NOW - SETTLE_SECONDS + 1}, **kw)
    assert settling.action is Action.NONE and settling.record.provided == {"uid-p0": NOW - 100}
    settled = plan1(pool, scale(1, rec), pods(1), ready_since={"n0": NOW - SETTLE_SECONDS - 1}, **kw)
    assert settled.action is Action.SCALE_UP and settled.desired == 2


def test_new_pods_fill_arriving_capacity_first_and_are_remembered() -> None:
    pool = make_pool()
    first = plan1(pool, scale(0), pods(3))  # 6 of 8 GPUs on one new node
    assert first.desired == 1
    more = pods(2, prefix="q")
    second = plan1(pool, after(first), pods(3) + more, now=NOW + 1)
    # q0 fits the 2 GPUs left on the arriving node, q1 needs another.
    assert second.action is Action.SCALE_UP and second.desired == 2 and second.pods == ("ml/q1",)
    assert second.record.provided["uid-q0"] == NOW + 1 and second.record.provided["uid-p0"] == NOW
    absorbed = plan1(pool, after(first), pods(3) + more[:1], now=NOW + 1)
    assert absorbed.action is Action.NONE and absorbed.record_changed
    assert "uid-q0" in absorbed.record.provided


def test_capacity_that_never_registers_stops_counting_after_the_timeout() -> None:
    pool = make_pool(arriving_timeout_seconds=60)
    first = plan1(pool, scale(0), pods(4, gpus=8))
    late = plan1(pool, after(first), pods(4, gpus=8), now=NOW + 61)
    assert late.action is Action.SCALE_UP and late.desired == 8  # a second attempt, four more
    assert "GpuPoolNodesNotRegistered" in [n.reason for n in late.notes]
    # Replicas set by someone else: dated by the shell's first sighting.
    seen = plan1(pool, scale(2), pods(1, gpus=8), unregistered_since=NOW - 10)
    assert seen.action is Action.NONE and seen.arriving == 2


def test_nodes_whose_gpus_never_come_up_are_not_capacity() -> None:
    pool = make_pool(arriving_timeout_seconds=60)
    broken = node("n0", created_at=NOW - 61, allocatable=False)
    p = plan1(pool, scale(1), pods(1, gpus=8), nodes=(broken,))
    assert p.action is Action.SCALE_UP and p.desired == 2
    assert any(n.reason == "GpuPoolGpusNotAllocatable" and "n0" in n.message for n in p.notes)


def test_pods_no_template_hosts_are_not_demand() -> None:
    pool = make_pool(template={"resources": {GPU: 8}, "taints": [{"key": "gpu", "effect": "NoSchedule"}]})
    p = plan1(pool, scale(0), pods(2))
    assert p.action is Action.NONE and p.pending == 0
    tolerating = pods(2, tolerations=(Toleration("gpu", "Exists"),))
    assert plan1(pool, scale(0), tolerating).desired == 1


def test_higher_priority_pods_get_the_room_first() -> None:
    pool = make_pool(max_replicas=1)
    low, high = pods(1, gpus=8, prefix="low"), pods(1, gpus=8, prefix="high", priority=1000)
    p = plan1(pool, scale(0), low + high)
    assert p.pods == ("ml/high0",)
    limit = next(n for n in p.notes if n.reason == "GpuPoolAtLimit")
    assert "ml/low0" in limit.message and "max size" in limit.message and limit.warning


# -- replacements, headroom, bounds ----------------------------------------------------------


def test_each_quarantined_node_is_replaced_once() -> None:
    pool = make_pool()
    nodes = (node("n0", quarantined=True), node("n1"))
    p = plan1(pool, scale(2), nodes=nodes, busy=frozenset({"n1"}))
    assert p.action is Action.SCALE_UP and p.desired == 3 and p.quarantined == 1 and p.demand_nodes == 0
    assert "replacing quarantined n0" in p.reason and p.record.replaced == {"n0": NOW}
    again = plan1(pool, after(p), nodes=nodes, busy=frozenset({"n1"}), now=NOW + 1)
    assert again.action is Action.NONE
    # Back in service: forgotten (the extra node goes the way of any idle node).
    recovered = plan1(pool, after(p), nodes=(node("n0"), node("n1")), busy=frozenset({"n1"}), now=NOW + 2)
    assert recovered.record.replaced == {} and recovered.record_changed
    off = make_pool(replace_quarantined=False)
    assert plan1(off, scale(2), nodes=nodes, busy=frozenset({"n1"})).action is Action.NONE


def test_evicted_pods_of_a_quarantined_node_land_on_its_replacement() -> None:
    pool = make_pool()
    nodes = (node("n0", quarantined=True), node("n1"))
    p = plan1(pool, scale(2), nodes=nodes, busy=frozenset({"n0", "n1"}))
    assert p.desired == 3
    evicted = plan1(pool, after(p), pods(4), nodes=nodes, busy=frozenset({"n0", "n1"}), now=NOW + 3)
    assert evicted.action is Action.NONE  # they fit the replacement on its way


def test_headroom_keeps_empty_nodes_ready() -> None:
    pool = make_pool(headroom_nodes=1)
    busy = (node("n0"),)
    p = plan1(pool, scale(1), nodes=busy, busy=frozenset({"n0"}))
    assert p.action is Action.SCALE_UP and p.desired == 2 and "headroom of 1" in p.reason
    assert plan1(pool, after(p), nodes=busy, busy=frozenset({"n0"}), now=NOW + 1).action is Action.NONE
    spare = (node("n0"), node("n1"))
    assert plan1(pool, scale(2), nodes=spare, busy=frozenset({"n0"})).action is Action.NONE


def test_min_size_is_reached_within_the_step_limit() -> None:
    pool = make_pool(min_replicas=3, max_step=2)
    p = plan1(pool, scale(0))
    assert p.action is Action.SCALE_UP and p.desired == 2 and "min size 3" in p.reason
    assert plan1(pool, after(p), now=NOW + 1).desired == 3


def test_max_size_and_step_limit_bound_a_scale_up() -> None:
    at_max = plan1(make_pool(max_replicas=3), scale(0), pods(5, gpus=8))
    assert at_max.desired == 3 and len(at_max.pods) == 3
    assert any("at its max size" in n.message and n.message.startswith("2 pending") for n in at_max.notes)
    stepped = plan1(make_pool(max_step=2), scale(0), pods(5, gpus=8))
    assert stepped.desired == 2
    assert any("step limit (2)" in n.message for n in stepped.notes)
    # Pods left out are not remembered as provided for: the next step takes them.
    assert len(stepped.record.provided) == 2
    assert plan1(make_pool(max_step=2), after(stepped), pods(5, gpus=8), now=NOW + 1).desired == 4


def test_above_max_nothing_is_added() -> None:
    p = plan1(make_pool(max_replicas=2), scale(4), pods(9, gpus=8))
    assert p.action is Action.NONE and p.desired == 4


def test_scale_up_cooldown_defers_and_forgets_what_it_did_not_request() -> None:
    pool = make_pool(scale_up_cooldown_seconds=30)
    first = plan1(pool, scale(0), pods(1, gpus=8))
    more = pods(1, gpus=8, prefix="q")
    cooling = plan1(pool, after(first), pods(1, gpus=8) + more, now=NOW + 10)
    assert cooling.action is Action.NONE and "uid-q0" not in cooling.record.provided
    assert any(n.reason == "GpuPoolScaleUpDeferred" and "waits 20s" in n.message for n in cooling.notes)
    cooled = plan1(pool, after(first), pods(1, gpus=8) + more, now=NOW + 31)
    assert cooled.action is Action.SCALE_UP and cooled.pods == ("ml/q0",)


# -- who owns the target -----------------------------------------------------------------------


CA = {CA_MIN_ANNOTATION: "1", CA_MAX_ANNOTATION: "4"}


def test_a_pool_cluster_autoscaler_manages_is_refused() -> None:
    p = plan1(make_pool(), scale(0, **CA), pods(5))
    assert p.action is Action.REFUSED and p.desired == p.current == 0
    assert "cluster-autoscaler" in p.reason and p.notes[0].reason == "GpuPoolRefused" and p.notes[0].warning


def test_a_pool_whose_nodes_karpenter_launched_is_refused() -> None:
    """Karpenter's nodes in the pool: refused like a cluster-autoscaler pool, whatever the
    target says, and allow_cluster_autoscaler does not open it."""
    ours = node("a-0")
    theirs = node("a-1", karpenter_nodepool="gpu")
    for pool in (make_pool(), make_pool(allow_cluster_autoscaler=True)):
        p = plan1(pool, scale(2), pods(5), nodes=(ours, theirs))
        assert p.action is Action.REFUSED and p.desired == p.current == 2
        assert "Karpenter's (NodePool gpu, label karpenter.sh/nodepool)" in p.reason
        assert p.notes[0].reason == "GpuPoolRefused" and p.notes[0].warning
    assert plan1(make_pool(), scale(2), pods(5), nodes=(ours, node("a-1"))).action is not Action.REFUSED
    labelled = {"metadata": {"name": "n", "labels": {"karpenter.sh/nodepool": "gpu"}}}
    assert pool_node_from_json(labelled, make_pool().template).karpenter_nodepool == "gpu"


def test_allowed_cluster_autoscaler_annotations_are_default_bounds() -> None:
    pool = make_pool(allow_cluster_autoscaler=True, max_replicas=None)
    assert bounds(pool, CA) == (1, 4)
    assert bounds(make_pool(allow_cluster_autoscaler=True, min_replicas=2, max_replicas=3), CA) == (2, 3)
    assert "no max_replicas" in str(bounds(pool, {}))
    assert "not integers" in str(bounds(pool, {CA_MAX_ANNOTATION: "many"}))
    assert "min 5 > max 4" in str(
        bounds(make_pool(allow_cluster_autoscaler=True, min_replicas=5, max_replicas=None), CA)
    )
    p = plan1(pool, scale(0, **CA), pods(9, gpus=8))
    assert p.desired == 4 and p.max_replicas == 4 and p.min_replicas == 1


def test_an_unreadable_target_is_reported_not_planned() -> None:
    p = plan1(make_pool(), None, pods(5), read_error="403 Forbidden")
    assert (
        p.action is Action.REFUSED
        and "403 Forbidden" in p.reason
        and p.notes[0].reason == "GpuPoolUnreadable"
    )


# -- scale-down --------------------------------------------------------------------------------


DOWN = {"min_replicas": 1, "scale_down_unneeded_seconds": 600, "scale_down_cooldown_seconds": 0}


def test_nodes_idle_long_enough_are_drained_longest_idle_first() -> None:
    pool = make_pool(**DOWN)
    nodes = (node("n0"), node("n1"), node("n2"))
    idle = {"n0": NOW - 700, "n1": NOW - 900, "n2": NOW - 100}
    p = plan1(pool, scale(3), nodes=nodes, idle_since=idle)
    assert p.action is Action.SCALE_DOWN and p.drain == ("n1", "n0") and p.desired == 3
    assert p.notes[0].reason == "GpuPoolScaleDown" and "n1 (idle 900s)" in p.notes[0].message


@pytest.mark.parametrize(
    ("case", "changes"),
    [
        ("busy", {"busy": frozenset({"n1"})}),
        ("pending pods", {"pending": pods(1, gpus=8)}),
        ("not idle long enough", {"idle_since": {"n1": NOW - 599}}),
        ("skipped after a failed drain", {"skip_until": {"n1": NOW + 1}}),
    ],
)
def test_no_scale_down_when(case: str, changes: dict[str, Any]) -> None:
    pool = make_pool(**DOWN)
    kw: dict[str, Any] = {
        "nodes": (node("n0"), node("n1")),
        "busy": frozenset({"n0"}),
        "idle_since": {"n1": 0.0},
    }
    pending = changes.pop("pending", [])
    kw.update(changes)
    p = plan1(pool, scale(2), pending, **kw)
    assert p.action is not Action.SCALE_DOWN and not p.drain, case


@pytest.mark.parametrize(
    "n1",
    [
        node("n1", quarantined=True),
        node("n1", excluded=True),
        node("n1", unschedulable=True),
        node("n1", marked=True),
    ],
)
def test_nodes_out_of_service_or_on_their_way_are_not_chosen(n1: PoolNode) -> None:
    p = plan1(
        make_pool(**DOWN), scale(2), nodes=(node("n0"), n1), busy=frozenset({"n0"}), idle_since={"n1": 0.0}
    )
    assert not p.drain


def test_scale_down_respects_min_step_headroom_and_cooldown() -> None:
    nodes = tuple(node(f"n{i}") for i in range(5))
    idle = idle_since(*(n.name for n in nodes))
    assert len(plan1(make_pool(**DOWN), scale(5), nodes=nodes, idle_since=idle).drain) == 4  # min 1
    assert len(plan1(make_pool(**{**DOWN, "max_step": 2}), scale(5), nodes=nodes, idle_since=idle).drain) == 2
    assert (
        len(plan1(make_pool(**{**DOWN, "headroom_nodes": 2}), scale(5), nodes=nodes, idle_since=idle).drain)
        == 3
    )
    cooling = make_pool(**{**DOWN, "scale_down_cooldown_seconds": 300})
    for key in ("scaled_up_at", "scaled_down_at"):
        rec = Record(**{key: NOW - 299})
        assert not plan1(cooling, scale(5, rec), nodes=nodes, idle_since=idle).drain
        rec = Record(**{key: NOW - 301})
        assert plan1(cooling, scale(5, rec), nodes=nodes, idle_since=idle).drain
    assert not plan1(make_pool(**{**DOWN, "min_replicas": 5}), scale(5), nodes=nodes, idle_since=idle).drain


def test_broken_nodes_go_first_and_do_not_count_as_headroom() -> None:
    pool = make_pool(**{**DOWN, "headroom_nodes": 1, "arriving_timeout_seconds": 60})
    nodes = (node("n0"), node("nb", created_at=NOW - 1000, allocatable=False), node("n2"))
    p = plan1(pool, scale(3), nodes=nodes, busy=frozenset({"n2"}), idle_since=idle_since("n0", "nb"))
    assert p.drain == ("nb",)  # n0 is the one empty node headroom keeps


def test_a_removal_under_way_continues_or_is_given_up() -> None:
    pool = make_pool(**{**DOWN, "scale_down_drain_timeout_seconds": 300})
    draining = node("n1", unschedulable=True, removing_since=NOW - 10)
    base: dict[str, Any] = {"nodes": (node("n0"), draining), "busy": frozenset({"n0"})}
    assert plan1(pool, scale(2), **base).drain == ("n1",)
    cases = {
        "a GPU pod runs on it": ({"busy": frozenset({"n0", "n1"})}, []),
        "pending for the pool": ({}, pods(1, gpus=8)),
        "within 300s": ({"nodes": (node("n0"), replace(draining, removing_since=NOW - 301))}, []),
        "quarantined": ({"nodes": (node("n0"), replace(draining, quarantined=True))}, []),
    }
    for why, (changes, pending) in cases.items():
        p = plan1(pool, scale(2), pending, **{**base, **changes})
        assert p.abandon == ("n1",) and not p.drain, why
        if pending:  # pods that fit the node being drained take it back instead of a new node
            assert p.action is Action.NONE
        assert any(n.reason == "GpuPoolScaleDownCancelled" and why in n.message for n in p.notes), why


def test_removal_is_recorded_before_replicas_go_down_and_finished_after_a_restart() -> None:
    pool = make_pool(**DOWN)
    nodes = (node("n0"), node("n1"))
    p = plan1(pool, scale(2), nodes=nodes, idle_since=idle_since("n0", "n1"))
    assert p.drain == ("n0",)
    record, to = removal_record(p, ["n0"], NOW + 1)
    assert to == 1 and record.removal == Removal(("n0",), 2, 1, NOW + 1) and record.scaled_down_at == NOW + 1
    with pytest.raises(ValueError, match="below min"):
        removal_record(p, ["n0", "n1"], NOW + 1)
    marked = (node("n0", marked=True, unschedulable=True, removing_since=NOW), node("n1"))
    # Stopped between the record and the /scale patch: finish it.
    finish = plan1(pool, scale(2, record), nodes=marked, now=NOW + 2)
    assert finish.action is Action.FINISH_REMOVAL and finish.desired == 1 and "n0" in finish.reason
    # Patched: the marked node is no longer counted; nothing arriving, nothing to do.
    done = plan1(pool, scale(1, record), nodes=marked, busy=frozenset({"n1"}), now=NOW + 3)
    assert done.action is Action.NONE and done.arriving == 0 and not done.drain
    # Gone: the record forgets it.
    gone = plan1(pool, scale(1, record), nodes=(node("n1"),), busy=frozenset({"n1"}), now=NOW + 4)
    assert gone.record.removal is None and gone.record_changed


def test_a_node_marked_but_not_recorded_is_carried_on_with() -> None:
    pool = make_pool(**DOWN)
    marked = node("n0", marked=True, unschedulable=True, removing_since=NOW - 5)
    p = plan1(pool, scale(2), nodes=(marked, node("n1")), busy=frozenset({"n1"}))
    assert p.action is Action.SCALE_DOWN and p.drain == ("n0",)


# -- several pools -----------------------------------------------------------------------------


def test_pods_go_to_the_first_pool_that_hosts_them_and_spill_over_at_max() -> None:
    a = make_pool("a", max_replicas=1, template={"resources": {GPU: 8}, "labels": {"kind": "a"}})
    b = make_pool("b", template={"resources": {GPU: 8}, "labels": {"kind": "b"}})
    anywhere, only_b = pods(3, gpus=8), pods(1, gpus=8, prefix="b", node_selector={"kind": "b"})
    pa, pb = plan_pools([PoolInput(a, scale(0)), PoolInput(b, scale(0))], anywhere + only_b, NOW)
    assert pa.desired == 1 and pa.pods == ("ml/p0",)
    assert pb.desired == 3 and set(pb.pods) == {"ml/p1", "ml/p2", "ml/b0"}


def test_arriving_capacity_in_any_pool_comes_before_new_nodes() -> None:
    a, b = make_pool("a"), make_pool("b")
    pa, pb = plan_pools(
        [PoolInput(a, scale(0)), PoolInput(b, scale(1, Record(scaled_up_at=NOW)))], pods(1, gpus=8), NOW
    )
    assert pa.action is Action.NONE and pb.action is Action.NONE and "uid-p0" in pb.record.provided


# -- the record --------------------------------------------------------------------------------


def test_record_round_trips_and_tolerates_garbage() -> None:
    rec = Record(
        provided=MappingProxyType({"u1": 1.5}),
        replaced=MappingProxyType({"n0": 2.0}),
        scaled_up_at=3.0,
        scaled_down_at=4.0,
        removal=Removal(("n1", "n2"), 5, 3, 6.0),
    )
    assert record_from_annotation(record_to_annotation(rec)) == rec
    for text in (None, "", "{", "[]", '{"provided": [1], "removal": {"nodes": "x"}, "scaledUpAt": "soon"}'):
        assert record_from_annotation(text).removal is None
    assert record_from_annotation('{"provided": {"u": "x", "v": 1}}').provided == {"v": 1.0}
