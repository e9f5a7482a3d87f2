"""The Xid thread's hand-overs to the loop: at once after a quiet spell, at most once per
interval during a storm, nothing lost or reordered (issue #18)."""

from __future__ import annotations

from gpumon.exporter.xid_handover import Handover
from gpumon.gpu.model import XidEvent

INTERVAL = 0.1


def xid(code: int) -> XidEvent:
    return XidEvent("GPU-0", code, 0.0)


def test_the_first_event_after_a_quiet_spell_goes_at_once() -> None:
    state, due = Handover().add([xid(79)], now=100.0, interval=INTERVAL)
    assert due == (xid(79),) and state.held == ()


def test_a_storm_is_handed_over_once_per_interval_in_order() -> None:
    state, due = Handover().add([xid(1)], now=0.0, interval=INTERVAL)
    handed = [due]
    # 5,000 a second, in polls of 50 every 10 ms, for one second.
    for poll in range(1, 101):
        now = poll * 0.01
        state, due = state.add([xid(2 + (poll * 50 + i) % 200) for i in range(50)], now, INTERVAL)
        if due:
            handed.append(due)
    assert 10 <= len(handed) <= 11, len(handed)  # was 101 hand-overs: one a poll
    events = [e for batch in handed for e in batch] + list(state.held)
    assert len(events) == 1 + 100 * 50
    assert events[1:51] == [xid(2 + (50 + i) % 200) for i in range(50)]


def test_the_thread_waits_no_longer_than_the_held_events_allow() -> None:
    state, _ = Handover().add([xid(1)], now=10.0, interval=INTERVAL)
    assert state.wait_seconds(10.0, idle=1.0, interval=INTERVAL) == 1.0  # nothing held
    state, due = state.add([xid(2)], now=10.03, interval=INTERVAL)
    assert due == ()
    assert abs(state.wait_seconds(10.03, idle=1.0, interval=INTERVAL) - 0.07) < 1e-9
    assert state.wait_seconds(10.5, idle=1.0, interval=INTERVAL) == 0.0  # overdue: do not block
    state, due = state.add([], now=10.11, interval=INTERVAL)
    assert due == (xid(2),) and state.held == ()
