"""Protocol Buffers' wire format (https://protobuf.dev/programming-guides/encoding/), read
without the protobuf library, for the few messages the exporter reads.

Every field the exporter reads is a string or an embedded message, so the reader yields the
length-delimited fields and skips the others, of every wire type (varint, 64-bit, 32-bit, and
the deprecated groups, nested up to a depth). A field of an expected number but another wire type
is skipped too, as protobuf's own parsers treat it as unknown. What is malformed raises
:class:`DecodeError`: truncation, a varint over 10 bytes, field number 0, wire types 6 and 7, an
unmatched end of group; lengths are checked against the bytes there are, so nothing is read
beyond the message.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, I64, LEN, SGROUP, EGROUP, I32 = range(6)
_MAX_GROUP_DEPTH = 100  # what protobuf's parsers allow for nesting


class DecodeError(ValueError):
    """The bytes are not a valid protobuf message."""


def length_delimited(data: memoryview) -> Iterator[tuple[int, memoryview]]:
    """(field number, bytes) of each length-delimited field of the message, in wire order."""
    pos = 0
    while pos < len(data):
        number, wire, pos = _key(data, pos)
        if wire == LEN:
            length, pos = _varint(data, pos)
            end = pos + length
            if end > len(data):
                raise DecodeError(f"field {number} is longer than its message")
            yield number, data[pos:end]
            pos = end
        else:
            pos = _skip(data, pos, number, wire, 0)


def text(data: memoryview) -> str:
    """A string field (protobuf's strings are UTF-8, and its parsers refuse anything else)."""
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError("a string field is not UTF-8") from e


def _key(data: memoryview, pos: int) -> tuple[int, int, int]:
    key, pos = _varint(data, pos)
    number, wire = key >> 3, key & 7
    if number == 0 or number >= 1 << 29:
        raise DecodeError(f"field number {number}")
    return number, wire, pos


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise DecodeError("the message ends inside a varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("a varint longer than 10 bytes")


def _skip(data: memoryview, pos: int, number: int, wire: int, depth: int) -> int:
    """The position after the value of a field of any wire type."""
    if wire == VARINT:
        return _varint(data, pos)[1]
    if wire in (I64, I32):
        end = pos + (8 if wire == I64 else 4)
    elif wire == LEN:
        length, pos = _varint(data, pos)
        end = pos + length
    elif wire == SGROUP:
        if depth >= _MAX_GROUP_DEPTH:
            raise DecodeError("groups nested too deep")
        while True:
            inner, inner_wire, pos = _key(data, pos)
            if inner_wire == EGROUP:
                if inner != number:
                    raise DecodeError(f"group {number} ended by {inner}")
                return pos
            pos = _skip(data, pos, inner, inner_wire, depth + 1)
    else:
        raise DecodeError(f"wire type {wire} of field {number} where no group is open")
    if end > len(data):
        raise DecodeError(f"field {number} is longer than its message")
    return end
