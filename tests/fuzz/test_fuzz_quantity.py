"""The one quantity grammar (gpumon/k8s/resources.py) on a trust boundary: pod limits, sharing
annotations' resources, config and CEL selectors all reach it. Any text is a value or None,
at once; a text written in the grammar is its value; the whole-number and thousandths readings
agree with the exact one. (tests/pins/test_quantity_grammar.py holds it to Kubernetes' parser.)"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

from hypothesis import given
from hypothesis import strategies as st
from strategies import FUZZ

from gpumon.k8s.resources import milli, quantity, whole_quantity

_SUFFIXES = {
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("", 0), ("k", 3), ("M", 6))},
    **{s: Decimal(10) ** e for s, e in (("G", 9), ("T", 12), ("P", 15), ("E", 18))},
    **{s + "i": Decimal(2) ** (10 * (i + 1)) for i, s in enumerate("KMGTPE")},
}
_NANO = Decimal("1e-9")

_TEXT = st.one_of(
    st.text(),
    st.text(alphabet="0123456789.+-eEKMGTPiumnk \t", max_size=40),
    st.from_regex(r"\A[+-]?[0-9]{0,30}(\.[0-9]{0,30})?([eE][+-]?[0-9]{1,12}|[KMGTPE]i|[numkMGTPE])?\Z"),
)


@FUZZ
@given(_TEXT)
def test_any_text_is_a_quantity_or_none(text: str) -> None:
    exact = quantity(text)
    if exact is None:
        assert whole_quantity(text) is None and milli(text) is None
        return
    assert exact.is_finite() and abs(exact) < 2**63
    assert exact % _NANO == 0
    assert whole_quantity(text) == (int(exact) if exact == exact.to_integral_value() else None)
    assert milli(text) == math.ceil(exact * 1000)


@FUZZ
@given(
    sign=st.sampled_from(["", "+", "-"]),
    whole=st.text(alphabet="0123456789", min_size=1, max_size=12),
    fraction=st.none() | st.text(alphabet="0123456789", max_size=9),
    suffix=st.sampled_from(sorted(_SUFFIXES)),
    exponent=st.none() | st.integers(min_value=-30, max_value=12),
    letter=st.sampled_from("eE"),
)
def test_a_quantity_in_the_grammar_is_its_value(
    sign: str, whole: str, fraction: str | None, suffix: str, exponent: int | None, letter: str
) -> None:
    number = whole + ("" if fraction is None else "." + fraction)
    with localcontext(prec=100):
        value = Decimal(sign + number)
        if exponent is None:
            text, value = f"{sign}{number}{suffix}", value * _SUFFIXES[suffix]
        else:
            text, value = f"{sign}{number}{letter}{exponent:+d}", value.scaleb(exponent)
        if value % _NANO:
            value = value.quantize(_NANO, rounding="ROUND_UP")
    assert quantity(text) == (value if abs(value) <= 2**63 - 1 else None)
