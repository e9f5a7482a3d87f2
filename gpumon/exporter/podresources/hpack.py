"""HPACK (RFC 7541), the header compression of HTTP/2, for the pod-resources client.

Decoding is complete, because the server chooses the representation: the kubelet is Go's gRPC,
whose encoder indexes headers in the dynamic table and Huffman-codes strings when that is
shorter. Encoding writes every header as a literal without indexing and without Huffman, which
is always legal and keeps the encoder's state empty (the request has six short headers).

Everything read is bounded: integers, string lengths against the block, the dynamic table
against the size our SETTINGS allow, and the decoded header list (RFC 7541 section 4.1 sizes).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from gpumon.exporter.podresources.hpack_tables import HUFFMAN_CODES, STATIC_TABLE

Header = tuple[bytes, bytes]

DEFAULT_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE's initial value, which the client keeps
_ENTRY_OVERHEAD = 32  # RFC 7541 4.1: an entry's size is name + value + 32
_MAX_INTEGER_SHIFT = 28  # five continuation bytes at most: values below 2**35, far above any bound
_EOS = 256

_HUFFMAN_DECODE = {(length, code): symbol for symbol, (code, length) in enumerate(HUFFMAN_CODES)}


class HpackError(ValueError):
    """The header block is not valid HPACK (an HTTP/2 COMPRESSION_ERROR)."""


class HeaderListTooLarge(HpackError):
    """The decoded header list is larger than the decoder's bound."""


def decode_integer(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    """The integer at ``data[pos]`` with an N-bit prefix (RFC 7541 5.1), and the position after it."""
    if pos >= len(data):
        raise HpackError("header block ends inside an integer")
    mask = (1 << prefix_bits) - 1
    value = data[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        if pos >= len(data):
            raise HpackError("header block ends inside an integer")
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > _MAX_INTEGER_SHIFT:
            raise HpackError("integer longer than five continuation bytes")


def encode_integer(value: int, prefix_bits: int, first_byte: int = 0) -> bytes:
    """``value`` with an N-bit prefix, ``first_byte`` holding the representation's flag bits."""
    mask = (1 << prefix_bits) - 1
    if value < mask:
        return bytes([first_byte | value])
    out = bytearray([first_byte | mask])
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def huffman_decode(data: bytes) -> bytes:
    """RFC 7541 5.2 and Appendix B: bit by bit against the code (header strings are short, so
    a table walk per bit costs microseconds); EOS inside the string, or padding longer than
    7 bits or not all ones, is an error."""
    out = bytearray()
    code = length = 0
    for byte in data:
        for shift in range(7, -1, -1):
            code = (code << 1) | ((byte >> shift) & 1)
            length += 1
            symbol = _HUFFMAN_DECODE.get((length, code))
            if symbol is None:
                continue
            if symbol == _EOS:
                raise HpackError("EOS inside a Huffman-coded string")
            out.append(symbol)
            code = length = 0
    # The code is complete (every 30-bit sequence has a prefix that is a code), so what is left
    # is shorter than any code of a symbol ending here: the padding.
    if length > 7 or code != (1 << length) - 1:
        raise HpackError("Huffman padding is not a prefix of EOS")
    return bytes(out)


def _string(data: bytes, pos: int) -> tuple[bytes, int]:
    huffman = pos < len(data) and bool(data[pos] & 0x80)
    length, pos = decode_integer(data, pos, 7)
    end = pos + length
    if end > len(data):
        raise HpackError("string longer than the header block")
    raw = data[pos:end]
    return (huffman_decode(raw) if huffman else raw), end


class Decoder:
    """The decoding context of one connection: its dynamic table lives as long as the connection."""

    def __init__(self, *, max_header_list_size: int, max_table_size: int = DEFAULT_TABLE_SIZE) -> None:
        self._max_list = max_header_list_size
        self._allowed_table = max_table_size  # what our SETTINGS told the peer
        self._table_limit = max_table_size  # what the peer's last size update chose
        self._table: deque[Header] = deque()  # newest first, as indices count
        self._table_size = 0

    def decode(self, block: bytes) -> list[Header]:
        headers: list[Header] = []
        list_size = 0
        pos = 0
        while pos < len(block):
            byte = block[pos]
            if byte & 0x80:  # indexed field (6.1)
                index, pos = decode_integer(block, pos, 7)
                header = self._entry(index)
            elif byte & 0x40:  # literal with incremental indexing (6.2.1)
                header, pos = self._literal(block, pos, 6)
                self._add(header)
            elif byte & 0x20:  # dynamic table size update (6.3): only before the first field
                if headers:
                    raise HpackError("table size update after a header field")
                size, pos = decode_integer(block, pos, 5)
                if size > self._allowed_table:
                    raise HpackError(f"table size update to {size}, above the {self._allowed_table} allowed")
                self._table_limit = size
                self._evict(0)
                continue
            else:  # literal without indexing (0000) or never indexed (0001) (6.2.2, 6.2.3)
                header, pos = self._literal(block, pos, 4)
            list_size += len(header[0]) + len(header[1]) + _ENTRY_OVERHEAD
            if list_size > self._max_list:
                raise HeaderListTooLarge(f"header list larger than {self._max_list} bytes")
            headers.append(header)
        return headers

    def _literal(self, block: bytes, pos: int, prefix_bits: int) -> tuple[Header, int]:
        index, pos = decode_integer(block, pos, prefix_bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _string(block, pos)
        value, pos = _string(block, pos)
        return (name, value), pos

    def _entry(self, index: int) -> Header:
        if 1 <= index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        dynamic = index - len(STATIC_TABLE) - 1
        if 0 <= dynamic < len(self._table):
            return self._table[dynamic]
        raise HpackError(f"index {index} is in neither table")

    def _add(self, header: Header) -> None:
        size = len(header[0]) + len(header[1]) + _ENTRY_OVERHEAD
        if size > self._table_limit:  # 4.4: an entry larger than the table empties it
            self._table.clear()
            self._table_size = 0
            return
        self._evict(size)
        self._table.appendleft(header)
        self._table_size += size

    def _evict(self, room: int) -> None:
        while self._table and self._table_size + room > self._table_limit:
            name, value = self._table.pop()
            self._table_size -= len(name) + len(value) + _ENTRY_OVERHEAD


def encode_literals(headers: Iterable[Header]) -> bytes:
    """Each header as a literal without indexing, with a literal name and no Huffman (6.2.2)."""
    out = bytearray()
    for name, value in headers:
        out += b"\x00"
        out += encode_integer(len(name), 7) + name
        out += encode_integer(len(value), 7) + value
    return bytes(out)
