from __future__ import annotations

import pytest

from gpumon.controller.core.breaker import Candidate, PoolView, SafetyPolicy, admit, breaker_limit
from gpumon.controller.core.contract.breakers import (
    BreakerTrip,
    breaker_key,
    breaker_to_annotation,
    breakers_from_annotations,
)


def cands(*names: str, pool: str = "a") -> list[Candidate]:
    return [Candidate(n, pool, float(i)) for i, n in enumerate(names)]


@pytest.mark.parametrize(("size", "limit"), [(1, 2), (5, 2), (10, 2), (14, 2), (15, 3), (100, 20)])
def test_limit_is_max_of_two_nodes_and_twenty_percent(size, limit):
    assert breaker_limit(size, SafetyPolicy()) == limit


def test_three_of_five_at_once_quarantines_two_and_trips_the_breaker():
    out = admit(cands("n3", "n1", "n2"), {"a": PoolView(5)}, {}, now=100.0, policy=SafetyPolicy())
    assert out.admitted == {"n3", "n1"}  # oldest faults first
    assert set(out.refused) == {"n2"}
    assert out.refused["n2"].startswith("circuit breaker tripped: 3 of 5 nodes in pool 'a'")
    assert "over the limit of 2" in out.refused["n2"]
    (trip,) = out.tripped
    assert (trip.pool, trip.opened_at) == ("a", 100.0)


def test_recent_quarantines_in_the_window_count():
    pools = {"a": PoolView(5, quarantined_at=(10.0, 3000.0))}
    out = admit(cands("n9"), pools, {}, now=3700.0, policy=SafetyPolicy())  # 10.0 left the 3600 s window
    assert out.admitted == {"n9"}
    out = admit(cands("n9"), pools, {}, now=3500.0, policy=SafetyPolicy())
    assert out.admitted == frozenset() and out.tripped


def test_open_breaker_refuses_until_cleared_but_only_its_pool():
    trip = BreakerTrip("a", 50.0, "3 of 5")
    out = admit(
        [*cands("n1"), *cands("m1", pool="b")],
        {"a": PoolView(5), "b": PoolView(5)},
        {"a": trip},
        now=1e6,
        policy=SafetyPolicy(),
    )
    assert out.admitted == {"m1"}
    assert out.refused["n1"] == "circuit breaker open for pool 'a' since 1970-01-01T00:00:50Z (3 of 5)"
    assert out.tripped == ()
    # Disabled in config: the recorded trip no longer applies.
    out = admit(
        cands("n1"), {"a": PoolView(5)}, {"a": trip}, now=1e6, policy=SafetyPolicy(breaker_enabled=False)
    )
    assert out.admitted == {"n1"}


def test_rate_limit_defers_without_tripping():
    policy = SafetyPolicy(rate_limit_max=2, rate_limit_window_seconds=600, breaker_max_fraction=1.0)
    pools = {"a": PoolView(100, quarantined_at=(100.0,)), "b": PoolView(100)}
    late = Candidate("m1", "b", 9.0)
    out = admit([*cands("n1", "n2"), late], pools, {}, now=200.0, policy=policy)
    assert out.admitted == {"n1"}
    assert set(out.refused) == {"n2", "m1"}
    assert out.refused["n2"].startswith("rate limit: at most 2 new quarantines per 600s")
    assert out.tripped == () and out.retry_at == 700.0


def test_paused_refuses_everything():
    out = admit(cands("n1"), {"a": PoolView(50)}, {}, now=0.0, policy=SafetyPolicy(paused=True))
    assert out.admitted == frozenset() and out.refused == {"n1": "paused"}


def test_unknown_pool_counts_as_a_pool_of_one():
    out = admit(cands("x", "y", "z", pool="nowhere"), {}, {}, now=0.0, policy=SafetyPolicy())
    assert out.admitted == {"x", "y"}


def test_breaker_annotations_round_trip_and_garbage_still_counts_as_open():
    key, value = breaker_to_annotation(BreakerTrip("a100", 60.0, "3 of 5"))
    assert key == breaker_key("a100") == "breaker.gpumon.io/a100"
    got = breakers_from_annotations({key: value, "breaker.gpumon.io/b": "tripped!", "unrelated": "x"})
    assert got["a100"] == BreakerTrip("a100", 60.0, "3 of 5")
    assert got["b"].opened_at == 0.0 and "tripped!" in got["b"].reason
    assert set(got) == {"a100", "b"}
