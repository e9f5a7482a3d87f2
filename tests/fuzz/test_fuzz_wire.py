"""Garbage at the wire schema (gpumon.wire.v1), what every byte from an exporter passes: a watch
line or a snapshot body is a value or a WireError, never another exception."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from strategies import FUZZ, json_objects, json_values

from gpumon.devices.simulated import SimulatedBackend
from gpumon.exporter.gpu_state import GpuState, to_sample, with_fast, with_slow
from gpumon.gpu.health import HealthPolicy
from gpumon.gpu.model import Snapshot
from gpumon.wire import v1 as wire


def _real_documents() -> tuple[dict[str, Any], dict[str, Any]]:
    """A real state line and snapshot, to mutate: garbage that gets past the first field."""
    b = SimulatedBackend(2, seed=1)
    driver = b.open()
    gpus = []
    for ident in b.devices():
        s = with_slow(with_fast(GpuState(ident), b.read_fast(ident.index), 1.0), b.read_slow(ident.index))
        gpus.append(to_sample(s, now=1.0, policy=HealthPolicy()))
    b.close()
    snap = Snapshot(
        node="n", driver=driver, gpus=tuple(gpus), pods=(), taken_at=1.0, backend_up=True, complete=True
    )
    line = json.loads(wire.encode(wire.state_line(snap, node="n", now=1.0)))
    doc = json.loads(wire.snapshot_document(snap).model_dump_json())
    return line, doc


STATE_LINE, SNAPSHOT = _real_documents()


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[path[0]] = _replaced(doc[path[0]], path[1:], value)
    return copy


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    doc: Any = base
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        doc = _replaced(doc, path, draw(json_values))
    return json.dumps(doc).encode()


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()  # Infinity/NaN included, as a broken exporter might send


documents = st.one_of(
    st.binary(max_size=200),
    json_values.map(_json_bytes),
    json_objects.map(_json_bytes),
    mutated(STATE_LINE),
)


@FUZZ
@given(documents)
def test_a_watch_line_is_a_line_or_a_wire_error(raw: bytes) -> None:
    with contextlib.suppress(wire.WireError):
        wire.parse_watch_line(raw)


@FUZZ
@given(st.one_of(st.binary(max_size=200), json_objects.map(_json_bytes), mutated(SNAPSHOT)))
def test_a_snapshot_is_a_document_or_a_wire_error(raw: bytes) -> None:
    with contextlib.suppress(wire.WireError):
        wire.parse_snapshot(raw)


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=20), st.integers(1, 64))
def test_the_line_splitter_never_holds_more_than_its_limit(chunks: list[bytes], limit: int) -> None:
    splitter = wire.LineSplitter(limit)
    for chunk in chunks:
        try:
            lines = splitter.feed(chunk)
        except wire.WireError:
            return
        assert all(b"\n" not in line for line in lines)
        assert len(splitter._buf) <= limit
