"""Protobuf's wire format written by hand, for messages protobuf's own classes cannot make:
unknown fields of every wire type, and malformed ones."""

from __future__ import annotations


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def field(number: int, wire: int, value: bytes) -> bytes:
    return varint(number << 3 | wire) + value


def length(number: int, value: bytes) -> bytes:
    return field(number, 2, varint(len(value)) + value)
