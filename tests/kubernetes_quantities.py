"""Kubernetes' answers for quantity strings, shared by tests/unit/test_quantity.py (gpumon's
parser against them) and tests/pins/test_quantity_grammar.py (them against Kubernetes' parser).

The verdicts in ``KUBERNETES`` are what k8s.io/apimachinery v0.36.3 (the version the local
control plane is built from) answers for each string through ``Quantity.UnmarshalJSON``, the API
server's decoder: the exact value, or a refusal; the pins test runs that parser again over this
table, so it cannot drift from it."""

from __future__ import annotations

# (text, the value ParseQuantity reads, or None where it refuses the string)
KUBERNETES: list[tuple[str, str | None]] = [
    ("2", "2"),
    ("0", "0"),
    ("007", "7"),
    ("+5", "5"),
    ("-3", "-3"),
    ("1.5", "1.5"),
    ("1.", "1"),
    (".5", "0.5"),
    ("+.5", "0.5"),
    ("500m", "0.5"),
    ("1n", "0.000000001"),
    ("0.1n", "0.000000001"),  # kept to the nano, rounded away from zero
    ("1u", "0.000001"),
    ("1k", "1000"),
    ("1M", "1000000"),
    ("1G", "1000000000"),
    ("1T", "1000000000000"),
    ("1P", "1000000000000000"),
    ("1E", "1000000000000000000"),
    ("1Ki", "1024"),
    ("1Mi", "1048576"),
    ("1Gi", "1073741824"),
    ("1Ti", "1099511627776"),
    ("1Pi", "1125899906842624"),
    ("1Ei", "1152921504606846976"),
    ("1.5Gi", "1610612736"),
    ("1.G", "1000000000"),
    ("1e3", "1000"),
    ("1E3", "1000"),
    ("1e+3", "1000"),
    ("1e-3", "0.001"),
    ("1.5e3", "1500"),
    ("1e0018", "1000000000000000000"),
    (" 3 ", "3"),  # the JSON decoder trims whitespace
    ("9223372036854775807", "9223372036854775807"),
    ("", None),
    ("abc", None),
    ("1X", None),
    ("1K", None),
    ("1ki", None),
    ("1KI", None),
    ("1kB", None),
    ("1e", None),
    ("1e+", None),
    ("1e1.5", None),
    ("1e3Ki", None),
    ("1Mi5", None),
    ("1.2.3", None),
    ("--1", None),
    ("+-1", None),
    ("0x10", None),
    ("1_000", None),
    ("\u0661\u0662", None),  # Arabic-Indic digits: Python's int() takes them, Kubernetes does not
    ("1 Gi", None),
]

# Where gpumon refuses what ParseQuantity reads (the comment above resources._QUANTITY says why).
REFUSED_ON_PURPOSE: list[tuple[str, str]] = [
    ("+", "0"),
    ("-", "0"),
    (".", "0"),
    ("Gi", "0"),
    ("m", "0"),
    ("e3", "0"),
    ("9Ei", "9223372036854775807"),  # capped there by ParseQuantity
    ("9223372036854775808", "9223372036854775808"),
    ("1e2147483648", "(an int32 wrap: minutes of work)"),
]
