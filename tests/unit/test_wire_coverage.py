"""Every field of the device model's GPU shapes is on the wire, or listed in
``gpumon.wire.v1.NOT_ON_THE_WIRE`` with the reason it stays off.

A snapshot with every field set (none to its default, no two scalars alike: tests/unit/every_field.py)
goes through the exporter's writer, JSON and the readers' parser; each field of each frozen value
in it (GPUs, their fast and slow fields, processes, MIG instances, GPM, pods, DRA claims, ...)
must come back with the value it went in with. A field added to the model fails here until it is
put on the wire or listed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from every_field import every_field
from pydantic import BaseModel

from gpumon.gpu.model import GpuSample, Snapshot, XidEvent
from gpumon.wire import v1 as wire


def _xid_events(doc: wire.GpuDoc) -> tuple[XidEvent, ...]:
    # An event travels inside its GPU, which names the card.
    return tuple(XidEvent(doc.identity.uuid, x.code, x.at, doc.identity.index) for x in doc.xids)


# The fields whose wire form is not the model's: how a reader gets the model's value back from
# the wire form of the value holding it, and the model's value as the writer promises it.
READ_BACK: Mapping[str, tuple[Callable[[Any], object], Callable[[Any], object]]] = {
    # Per code, its latest event (sorted by code) and its count ...
    "GpuSample.xids": (_xid_events, lambda g: tuple(sorted(g.xids, key=lambda e: e.xid))),
    # ... which is the model's count of codes that have an event (the others are counted under
    # XID_OTHER, a series of the exposition only).
    "GpuSample.xid_counts": (lambda doc: {x.code: x.count for x in doc.xids}, lambda g: dict(g.xid_counts)),
    # JSON keys are strings: the (link, kind) key is two fields of each entry.
    "SlowFields.nvlink_errors": (
        lambda slow: {(e.link, e.kind): e.count for e in slow.nvlink_errors},
        lambda s: dict(s.nvlink_errors),
    ),
}


def _gpu(g: GpuSample) -> GpuSample:
    """``g`` as the sampler makes it: its Xid events are of this card, and counted."""
    events = tuple(dataclasses.replace(e, uuid=g.identity.uuid, index=g.identity.index) for e in g.xids)
    counts = {e.xid: count for e, count in zip(events, g.xid_counts.values(), strict=True)}
    return dataclasses.replace(g, xids=events, xid_counts=counts)


def full_snapshot() -> Snapshot:
    s = every_field(Snapshot)
    return dataclasses.replace(s, gpus=tuple(_gpu(g) for g in s.gpus))


class _Walk:
    def __init__(self) -> None:
        # One line per field (the first place it shows), in the order the walk meets them.
        self.problems: dict[str, str] = {}
        self.seen: set[str] = set()

    def same(self, model: object, sent: object, where: str) -> None:
        if dataclasses.is_dataclass(model) and not isinstance(model, type):
            self.fields(model, sent, where)
        elif isinstance(model, tuple):
            assert isinstance(sent, tuple), where
            if len(sent) != len(model):
                self.problems.setdefault(where, f"{where}: {len(model)} items written, {len(sent)} read back")
            for i, (m, s) in enumerate(zip(model, sent, strict=False)):
                self.same(m, s, f"{where}[{i}]")
        elif isinstance(model, frozenset):
            if not isinstance(sent, tuple) or set(sent) != model:
                self.problems.setdefault(where, f"{where}: {sorted(model)!r} written, {sent!r} read back")
        elif isinstance(model, Mapping):
            if not isinstance(sent, Mapping) or sent.keys() != model.keys():
                self.problems.setdefault(where, f"{where}: {dict(model)!r} written, {sent!r} read back")
                return
            for k in model:
                self.same(model[k], sent[k], f"{where}[{k!r}]")
        elif model != sent:
            self.problems.setdefault(where, f"{where}: {model!r} written, {sent!r} read back")

    def fields(self, model: Any, sent: object, where: str) -> None:
        shape = type(model).__name__
        assert isinstance(sent, BaseModel), f"{where}: a {shape} is written as {type(sent).__name__}"
        for f in dataclasses.fields(model):
            key, value, at = f"{shape}.{f.name}", getattr(model, f.name), f"{where}.{f.name}"
            self.seen.add(key)
            if key in wire.NOT_ON_THE_WIRE:
                continue
            if key in READ_BACK:
                read, expected = READ_BACK[key]
                try:
                    got = read(sent)
                except AttributeError as e:
                    self.problems.setdefault(key, f"{key} is not on the wire ({at}: {e})")
                    continue
                if got != expected(model):
                    self.problems.setdefault(at, f"{at}: {expected(model)!r} written, {got!r} read back")
            elif f.name in type(sent).model_fields:
                self.same(value, getattr(sent, f.name), at)
            else:
                self.problems.setdefault(key, _not_on_the_wire(key, at, type(sent).__name__))


def _not_on_the_wire(key: str, at: str, wire_model: str) -> str:
    name = key.split(".")[1]
    return (
        f"{key} is not on the wire ({at}). Put it on: add `{name}` to the wire model "
        f"`{wire_model}` in gpumon/wire/v1.py as an optional field of the same name (with a "
        f"default, so older readers keep working; the writer copies it by name), and say what it "
        f"holds in docs/exporter.md. Or keep it off: add {key!r} with the reason to NOT_ON_THE_WIRE "
        f"in gpumon/wire/v1.py."
    )


def test_every_field_of_the_device_model_is_on_the_wire_or_listed_off_it() -> None:
    snapshot = full_snapshot()
    read_back = wire.parse_snapshot(wire.encode(wire.snapshot_document(snapshot)))
    walk = _Walk()
    walk.same(snapshot, read_back, "snapshot")
    assert not walk.problems, "\n".join(walk.problems.values())
    stale = (wire.NOT_ON_THE_WIRE.keys() | READ_BACK.keys()) - walk.seen
    assert not stale, f"listed, but no field of the device model: {sorted(stale)}"


def test_the_walk_reaches_every_frozen_value_in_a_snapshot() -> None:
    # The shapes the walk compares field by field: a new one nested in the model joins by itself,
    # and this list says which there are today.
    walk = _Walk()
    snapshot = full_snapshot()
    walk.same(snapshot, wire.parse_snapshot(wire.encode(wire.snapshot_document(snapshot))), "snapshot")
    assert {key.split(".")[0] for key in walk.seen} == {
        "Snapshot",
        "DriverInfo",
        "GpuSample",
        "GpuIdentity",
        "FastFields",
        "MemoryInfo",
        "ProcessSample",
        "SlowFields",
        "MigInstance",
        "Profiling",
        "MigProfiling",
        "HealthVerdict",
        "HealthReason",
        "PodGpuUsage",
        "PodRef",
        "ClaimDevice",
        "ClaimRef",
        "DeviceRef",
    }
