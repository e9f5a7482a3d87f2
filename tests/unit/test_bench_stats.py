"""The bench's statistics helpers (bench/stats.py): percentiles, ratios and how they read."""

from __future__ import annotations

import math

import pytest

from bench.stats import format_ms, format_ratio, improvement, meets, percentile, summarize


def test_percentile_interpolates_between_the_closest_ranks() -> None:
    values = [float(v) for v in range(1, 101)]  # 1 .. 100
    assert percentile(values, 0) == 1
    assert percentile(values, 100) == 100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)


def test_percentile_ignores_input_order_and_handles_one_value() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.007], 99) == 0.007


def test_one_slow_sample_in_two_hundred_does_not_become_the_p99() -> None:
    values = [0.001] * 199 + [0.5]
    assert percentile(values, 99) < 0.01
    assert percentile(values, 100) == 0.5


@pytest.mark.parametrize("q", [-1, 100.5])
def test_percentile_refuses_a_rank_outside_0_to_100(q: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 100"):
        percentile([1.0], q)


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_summarize() -> None:
    s = summarize([0.004, 0.001, 0.002, 0.003])
    assert (s.count, s.max) == (4, 0.004)
    assert s.p50 == pytest.approx(0.0025)
    assert s.p99 == pytest.approx(0.00397)


def test_improvement_is_above_one_when_gpumon_is_better_either_way() -> None:
    assert improvement(0.001, 0.030, lower_is_better=True) == pytest.approx(30)
    assert improvement(8000, 100, lower_is_better=False) == pytest.approx(80)
    assert improvement(54, 44, lower_is_better=True) == pytest.approx(44 / 54)


@pytest.mark.parametrize("measured, baseline", [(0, 5), (5, 0), (-1, 5), (math.nan, 5), (5, math.inf)])
def test_improvement_makes_no_ratio_from_zero_or_nonsense(measured: float, baseline: float) -> None:
    assert improvement(measured, baseline, lower_is_better=True) is None


@pytest.mark.parametrize(
    "ratio, text",
    [
        (None, "—"),
        (152.4, "152×"),
        (10.0, "10×"),
        (9.96, "10×"),
        (3.44, "3.4×"),
        (0.996, "1.0×"),
        (0.8153, "0.82×"),
    ],
)
def test_format_ratio(ratio: float | None, text: str) -> None:
    assert format_ratio(ratio) == text


@pytest.mark.parametrize(
    "seconds, text", [(0.00042, "0.42 ms"), (0.0079, "7.9 ms"), (0.0251, "25 ms"), (1.53, "1530 ms")]
)
def test_format_ms(seconds: float, text: str) -> None:
    assert format_ms(seconds) == text


def test_meets_in_both_directions_and_at_the_boundary() -> None:
    assert meets(0.002, 0.002, lower_is_better=True) == "yes"
    assert meets(0.0021, 0.002, lower_is_better=True) == "**no**"
    assert meets(2000, 2000, lower_is_better=False) == "yes"
    assert meets(1999, 2000, lower_is_better=False) == "**no**"
