"""Properties of the scale planner over generated pools, nodes, pods and records (hypothesis)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_autoscale_planner import NOW, make_pool, node, scale

from gpumon.controller.core.contract.autoscaler import Record
from gpumon.controller.core.demand import Packer, PodDemand, why_not_hosted
from gpumon.controller.core.pools import Pool, PoolNode
from gpumon.controller.core.scale_plan import Action, PoolInput, PoolPlan, plan_pools

GPU = "nvidia.com/gpu"
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pools(draw: st.DrawFn, name: str = "a") -> Pool:
    low = draw(st.integers(0, 3))
    high = draw(st.integers(low, low + 6))
    return make_pool(
        name,
        template={"resources": {GPU: draw(st.sampled_from([1, 2, 4, 8]))}, "labels": {"kind": name}},
        min_replicas=low,
        max_replicas=high,
        max_step=draw(st.integers(1, 4)),
        headroom_nodes=draw(st.integers(0, 2)),
        scale_up_cooldown_seconds=draw(st.sampled_from([0, 60])),
        scale_down_cooldown_seconds=draw(st.sampled_from([0, 300])),
        scale_down_unneeded_seconds=draw(st.sampled_from([0, 600])),
        arriving_timeout_seconds=draw(st.sampled_from([60, 900])),
        replace_quarantined=draw(st.booleans()),
    )


@st.composite
def pool_nodes(draw: st.DrawFn, prefix: str) -> tuple[PoolNode, ...]:
    count = draw(st.integers(0, 8))
    return tuple(
        node(
            f"{prefix}{i}",
            created_at=NOW - draw(st.sampled_from([10, 1000])),
            allocatable=draw(st.booleans()),
            quarantined=draw(st.booleans()),
            unschedulable=draw(st.booleans()),
            marked=draw(st.booleans()),
            removing_since=draw(st.sampled_from([None, NOW - 5, NOW - 5000])),
        )
        for i in range(count)
    )


@st.composite
def pending_pods(draw: st.DrawFn) -> list[PodDemand]:
    out = []
    for i in range(draw(st.integers(0, 15))):
        selector = draw(st.sampled_from([{}, {"kind": "a"}, {"kind": "b"}]))
        out.append(
            PodDemand(
                "ml",
                f"p{i}",
                f"uid-p{i}",
                MappingProxyType({GPU: draw(st.integers(1, 8)) * 1000, "pods": 1000}),
                node_selector=MappingProxyType(selector),
                priority=draw(st.integers(0, 2)),
            )
        )
    return out


@st.composite
def inputs(draw: st.DrawFn, pool: Pool, prefix: str, pods: list[PodDemand]) -> PoolInput:
    nodes = draw(pool_nodes(prefix))
    names = [n.name for n in nodes]
    busy = frozenset(draw(st.lists(st.sampled_from(names), unique=True)) if names else ())
    provided = {p.uid: NOW - draw(st.sampled_from([1, 100, 5000])) for p in pods if draw(st.booleans())}
    record = Record(
        provided=MappingProxyType(provided),
        scaled_up_at=draw(st.sampled_from([None, NOW - 1, NOW - 5000])),
        scaled_down_at=draw(st.sampled_from([None, NOW - 1, NOW - 5000])),
    )
    return PoolInput(
        pool,
        scale(draw(st.integers(0, 10)), record),
        nodes,
        busy=busy,
        idle_since={n: NOW - draw(st.sampled_from([0, 10_000])) for n in names},
        ready_since={n: NOW - draw(st.sampled_from([1, 10_000])) for n in names},
        unregistered_since=draw(st.sampled_from([None, NOW - 5000])),
    )


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[PoolInput], list[PodDemand]]:
    pods = draw(pending_pods())
    ins = [draw(inputs(draw(pools("a")), "a", pods))]
    if draw(st.booleans()):
        ins.append(draw(inputs(draw(pools("b")), "b", pods)))
    return ins, pods


def _planned(world: tuple[list[PoolInput], list[PodDemand]]) -> list[tuple[PoolInput, PoolPlan]]:
    ins, pods = world
    return list(zip(ins, plan_pools(ins, pods, NOW), strict=True))


@PROPERTY
@given(worlds())
def test_never_scales_up_past_max(world: tuple[list[PoolInput], list[PodDemand]]) -> None:
    for inp, plan in _planned(world):
        if plan.desired > plan.current:
            assert plan.desired <= plan.max_replicas
            # At most a step at a time (or what reaching min takes), beyond the machines there.
            added = plan.desired - max(plan.current, len(inp.nodes))
            assert added <= max(inp.pool.max_step, plan.min_replicas)


@PROPERTY
@given(worlds())
def test_never_scales_down_below_min(world: tuple[list[PoolInput], list[PodDemand]]) -> None:
    for _, plan in _planned(world):
        if plan.desired < plan.current:
            assert plan.desired >= plan.min_replicas
        if plan.action is Action.SCALE_DOWN:
            assert plan.current - len(plan.drain) >= plan.min_replicas


@PROPERTY
@given(worlds())
def test_never_drains_a_node_with_gpu_pods_or_one_out_of_service(
    world: tuple[list[PoolInput], list[PodDemand]],
) -> None:
    for inp, plan in _planned(world):
        views = {n.name: n for n in inp.nodes}
        for name in plan.drain:
            assert name not in inp.busy
            assert not views[name].quarantined
        if plan.drain:
            assert plan.pending == 0  # never while pods are pending for the pool


@PROPERTY
@given(pools(), st.integers(1, 6), pending_pods())
def test_never_requests_capacity_for_pods_that_fit_on_arriving_nodes(
    pool: Pool, arriving: int, pods: list[PodDemand]
) -> None:
    pool = make_pool(
        template={"resources": {GPU: 8}, "labels": {"kind": "a"}},
        max_replicas=20,
        headroom_nodes=0,
        min_replicas=0,
        max_step=pool.max_step,
    )
    hosted = [p for p in pods if why_not_hosted(pool.template, p) is None]
    packer = Packer(pool.template, arriving)
    fits = all(
        packer.place(p, may_open=False) is not None
        for p in sorted(hosted, key=lambda p: (-p.requests[GPU], p.key))
    )
    (plan,) = plan_pools([PoolInput(pool, scale(arriving, Record(scaled_up_at=NOW - 1)))], pods, NOW)
    if fits:
        assert plan.action is not Action.SCALE_UP
    assert plan.desired - plan.current <= len(hosted)


@PROPERTY
@given(worlds())
def test_never_a_second_scale_up_for_the_same_pods(world: tuple[list[PoolInput], list[PodDemand]]) -> None:
    ins, pods = world
    first = plan_pools(ins, pods, NOW)
    # Carry the plans out: replicas set, records written; nothing registered yet.
    applied: list[PoolInput] = []
    for inp, plan in zip(ins, first, strict=True):
        if plan.action is Action.REFUSED:
            applied.append(inp)
            continue
        assert inp.scale is not None
        replicas = plan.desired if plan.action is Action.SCALE_UP else inp.scale.spec_replicas
        applied.append(_with_scale(inp, scale(replicas, plan.record)))
    second = plan_pools(applied, pods, NOW + 1)
    asked = {pod for plan in first for pod in plan.pods}
    for plan in second:
        assert not asked & set(plan.pods)


def _with_scale(inp: PoolInput, sc: Any) -> PoolInput:
    from dataclasses import replace

    return replace(inp, scale=sc)
