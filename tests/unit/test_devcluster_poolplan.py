"""The pool simulator's decisions: boots, joins, GPU arrival, scale-down order, status and
when to look again, as a function of what it sees and the time."""

from __future__ import annotations

import pytest

from gpumon.devcluster.poolplan import (
    Boot,
    SimulatedNode,
    SimulatedPoolStatus,
    Timing,
    decode_boots,
    encode_boots,
    plan,
)

T = Timing(boot_delay_seconds=10, gpu_delay_seconds=5)


def node(name: str, joined_at: float = 0, gpus: bool = True, marked: bool = False) -> SimulatedNode:
    return SimulatedNode(name, joined_at, gpus, marked)


def test_scale_up_starts_boots_and_counts_them_as_replicas() -> None:
    p = plan("pool", 3, [node("pool-0")], [], T, now=100)
    assert p.boots == (Boot("pool-1", 100), Boot("pool-2", 100))
    assert (p.join, p.delete, p.enable_gpus) == ((), (), ())
    assert p.status == SimulatedPoolStatus(replicas=3, ready_replicas=1, available_replicas=1)
    assert p.wake_in == 10


def test_boot_joins_once_its_delay_has_passed() -> None:
    boots = [Boot("pool-0", 100), Boot("pool-1", 105)]
    early = plan("pool", 2, [], boots, T, now=109.9)
    assert early.join == () and early.wake_in == pytest.approx(0.1)
    p = plan("pool", 2, [], boots, T, now=110)
    assert p.join == ("pool-0",) and not p.join_with_gpus
    assert p.boots == (Boot("pool-1", 105),)
    assert p.status == SimulatedPoolStatus(replicas=2, ready_replicas=1, available_replicas=0)
    assert p.wake_in == 5  # pool-1 boots at 115, pool-0's GPUs arrive at 115


def test_gpus_become_allocatable_after_their_delay() -> None:
    nodes = [node("pool-0", joined_at=100, gpus=False)]
    assert plan("pool", 1, nodes, [], T, now=104).enable_gpus == ()
    p = plan("pool", 1, nodes, [], T, now=105)
    assert p.enable_gpus == ("pool-0",)
    assert p.status == SimulatedPoolStatus(1, 1, 1)
    assert p.wake_in is None


def test_zero_gpu_delay_joins_nodes_with_gpus() -> None:
    p = plan("pool", 1, [], [Boot("pool-0", 0)], Timing(boot_delay_seconds=0, gpu_delay_seconds=0), now=0)
    assert p.join == ("pool-0",) and p.join_with_gpus
    assert p.status == SimulatedPoolStatus(1, 1, 1)
    assert p.wake_in is None


def test_scale_down_cancels_boots_first_newest_first() -> None:
    boots = [Boot("pool-1", 100), Boot("pool-2", 101)]
    p = plan("pool", 2, [node("pool-0")], boots, T, now=102)
    assert p.boots == (Boot("pool-1", 100),)
    assert p.delete == ()
    assert p.status.replicas == 2


def test_scale_down_removes_marked_then_gpu_less_then_newest_nodes() -> None:
    nodes = [
        node("old", joined_at=1),
        node("new", joined_at=50),
        node("no-gpus", joined_at=2, gpus=False),
        node("marked", joined_at=3, marked=True),
    ]
    assert plan("pool", 3, nodes, [], T, now=100).delete == ("marked",)
    assert plan("pool", 2, nodes, [], T, now=100).delete == ("marked", "no-gpus")
    assert plan("pool", 1, nodes, [], T, now=100).delete == ("marked", "new", "no-gpus")
    p = plan("pool", 0, nodes, [Boot("pool-9", 99)], T, now=100)
    assert p.delete == ("marked", "new", "no-gpus", "old") and p.boots == ()
    assert p.status == SimulatedPoolStatus(0, 0, 0)


def test_steady_pool_does_nothing() -> None:
    p = plan("pool", 2, [node("pool-0"), node("pool-1")], [], T, now=100)
    assert (p.boots, p.join, p.delete, p.enable_gpus, p.wake_in) == ((), (), (), (), None)
    assert p.status == SimulatedPoolStatus(2, 2, 2)


def test_new_names_continue_after_the_highest_index() -> None:
    p = plan("pool", 4, [node("pool-4"), node("other-9")], [], T, now=0)
    assert [b.name for b in p.boots] == ["pool-5", "pool-6"]


def test_a_boot_whose_node_exists_is_not_counted_twice() -> None:
    p = plan("pool", 1, [node("pool-0")], [Boot("pool-0", 0)], T, now=1)
    assert (p.boots, p.join, p.delete) == ((), (), ())
    assert p.status.replicas == 1


def test_negative_desired_is_refused() -> None:
    with pytest.raises(ValueError):
        plan("pool", -1, [], [], T, now=0)


def test_booting_bookkeeping_round_trips_and_tolerates_garbage() -> None:
    boots = (Boot("pool-0", 1.5), Boot("pool-1", 2.0))
    assert decode_boots(encode_boots(boots)) == boots
    assert decode_boots(None) == ()
    assert decode_boots("not json") == ()
    assert decode_boots("[1, 2]") == ()
    assert decode_boots('{"a": "x", "b": 3}') == (Boot("b", 3.0),)
