"""A GPU's state between ticks (gpumon.exporter.gpu_state): pure, so no loop and no clock."""

from __future__ import annotations

from gpumon.exporter.gpu_state import GpuState, carry_over, to_sample, with_xids
from gpumon.gpu.health import HealthPolicy
from gpumon.gpu.model import MAX_DOCUMENTED_XID, XID_OTHER, GpuIdentity, HealthState, XidEvent
from gpumon.wire.v1 import MAX_XIDS_PER_GPU

POLICY = HealthPolicy()


IDENT = GpuIdentity(0, "GPU-a", "NVIDIA A100-SXM4-80GB", "00000000:07:00.0")


def _xid(code: int, at: float) -> XidEvent:
    return XidEvent(IDENT.uuid, code, at, 0)


def test_xids_keep_their_backend_time_and_are_judged_within_the_window() -> None:
    s = GpuState(IDENT)
    for code, at in ((79, 10.0), (79, 20.0), (13, 30.0)):
        s = with_xids(s, [_xid(code, at)])
    assert dict(s.xid_counts) == {79: 2, 13: 1} and s.last_xid == 13
    at_30 = to_sample(s, now=30.0, policy=POLICY)
    assert at_30.health.state is HealthState.UNHEALTHY
    assert at_30.xids == (_xid(13, 30.0), _xid(79, 20.0)), "the latest event of each code, as delivered"
    at_621 = to_sample(s, now=621.0, policy=POLICY)
    assert at_621.health.state is HealthState.HEALTHY, "the exporter's own window judges its verdict"
    assert at_621.xids == at_30.xids, "the events stay: readers judge recency with their own window"


def test_xid_codes_are_bounded_per_gpu_oldest_code_first() -> None:
    s = GpuState(IDENT)
    for code in range(MAX_XIDS_PER_GPU + 5):
        s = with_xids(s, [_xid(code, float(code))])
    assert min(s.xids) == 5, "the oldest codes went"
    s = with_xids(s, [_xid(5, 1000.0)])  # seen again: now the newest
    s = with_xids(s, [_xid(500, 1001.0)])
    assert len(s.xids) == MAX_XIDS_PER_GPU and 5 in s.xids and 500 in s.xids and 6 not in s.xids
    assert sum(s.xid_counts.values()) == MAX_XIDS_PER_GPU + 7, "every event is counted"


def test_carry_over_keeps_counters_by_uuid() -> None:
    old = {0: with_xids(GpuState(IDENT), [_xid(48, 1.0)])}
    moved = GpuIdentity(1, "GPU-a", IDENT.model, IDENT.pci_bus_id)
    new = GpuIdentity(0, "GPU-b", IDENT.model, "00000000:0F:00.0")
    states = carry_over(old, [new, moved])
    assert dict(states[1].xid_counts) == {48: 1} and states[1].identity.index == 1
    assert states[0] == GpuState(new)


def test_undocumented_xid_codes_are_counted_under_other() -> None:
    # Issue #18: a storm of codes 1..999 made 3,707 series; only documented codes get their own.
    state = GpuState(IDENT)
    for code in (79, 256, 999, 0, -3, MAX_DOCUMENTED_XID):
        state = with_xids(state, [XidEvent(IDENT.uuid, code, 1.0)])
    assert dict(state.xid_counts) == {79: 1, MAX_DOCUMENTED_XID: 1, XID_OTHER: 4}


def test_distinct_xid_counters_per_gpu_are_bounded() -> None:
    state = GpuState(IDENT)
    for code in range(1, MAX_DOCUMENTED_XID + 1):
        state = with_xids(state, [XidEvent(IDENT.uuid, code, float(code))])
    state = with_xids(state, [XidEvent(IDENT.uuid, 1, 999.0)])  # a code already counted keeps counting
    assert len(state.xid_counts) == MAX_XIDS_PER_GPU + 1
    assert state.xid_counts[1] == 2
    assert state.xid_counts[XID_OTHER] == MAX_DOCUMENTED_XID - MAX_XIDS_PER_GPU
    assert sum(state.xid_counts.values()) == MAX_DOCUMENTED_XID + 1, "every event is counted once"


def test_a_batch_folds_as_its_events_one_by_one() -> None:
    events = [_xid(code, float(i)) for i, code in enumerate([79, 13, 79, 300, 48, 13])]
    one_by_one = GpuState(IDENT)
    for ev in events:
        one_by_one = with_xids(one_by_one, [ev])
    assert with_xids(GpuState(IDENT), events) == one_by_one
