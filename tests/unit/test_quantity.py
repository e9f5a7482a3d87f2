"""One quantity grammar for both programs (gpumon/k8s/resources.py): Kubernetes' own, as recorded
in tests/kubernetes_quantities.py."""

from __future__ import annotations

from decimal import Decimal

import pytest
from kubernetes_quantities import KUBERNETES, REFUSED_ON_PURPOSE

from gpumon.k8s.resources import milli, quantity, whole_quantity


@pytest.mark.parametrize(("text", "value"), KUBERNETES)
def test_a_quantity_is_read_as_kubernetes_reads_it(text: str, value: str | None) -> None:
    assert quantity(text) == (None if value is None else Decimal(value))


@pytest.mark.parametrize(("text", "kubernetes"), REFUSED_ON_PURPOSE)
def test_what_gpumon_refuses_on_purpose(text: str, kubernetes: str) -> None:
    assert quantity(text) is None


@pytest.mark.parametrize("text", ["1e999999", "1" * 5000, "1e" + "0" * 5000 + "3", "." + "0" * 5000 + "1"])
def test_a_long_or_large_text_is_answered_at_once(text: str) -> None:
    # Before the merge, milli("1e999999") raised decimal.Overflow, and an integer of it took 86 s.
    assert quantity(text) in (None, Decimal(1000), Decimal("1e-9"))
    assert milli(text) in (None, 1_000_000, 1)


# The sharing schedulers' limits (gpushare's aliyun.com/gpu-mem, cGPU's core percentage) and DRA
# capacities in config are whole numbers: the same grammar, and a whole value.
@pytest.mark.parametrize(
    ("text", "value"),
    [
        *[("4", 4), ("+4", 4), ("4000m", 4), ("1e3", 1000), ("2k", 2000), ("1Ki", 1024), ("3Gi", 3 << 30)],
        *[(" 7 ", 7), ("-1", -1), ("0", 0), ("1.5", None), ("500m", None), ("1n", None), ("x", None)],
    ],
)
def test_a_whole_quantity(text: str, value: int | None) -> None:
    assert whole_quantity(text) == value
