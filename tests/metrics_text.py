"""Reading a scraped /metrics page in tests, for every tier that starts an exporter or a
controller as a process: samples keyed by name and label set, selection by labels, and a free
loopback port to serve on."""

from __future__ import annotations

import socket

from prometheus_client.parser import text_string_to_metric_families

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(text: str) -> Series:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def select(series: Series, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return {ls: v for (n, ls), v in series.items() if n == name and want <= ls}
