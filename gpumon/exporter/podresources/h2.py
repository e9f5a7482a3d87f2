"""HTTP/2 (RFC 9113) for one request on a client connection, without I/O.

Cleartext with prior knowledge (h2c): the client opens with the preface, its SETTINGS and the
request on stream 1; :meth:`ClientConnection.receive` takes the bytes read and returns the
events of stream 1 and the bytes to write back (SETTINGS and PING acknowledgements). Only the
part of HTTP/2 one request needs is here: one stream, no server push (disabled in our SETTINGS,
so a PUSH_PROMISE is an error), no priorities (ignored), nothing sent after the request.

Flow control is settled up front: our SETTINGS give stream 1 a receive window as large as the
largest reply we accept, and one WINDOW_UPDATE grows the connection's window (65,535 bytes until
then) to the same size. So a reply up to that bound flows without further round trips, and a
server that sends more DATA than that breaks flow control and is refused: the window is also the
bound on the bytes of DATA read.

Every bound on what is read is ours: frames no larger than 16,384 bytes (the default
SETTINGS_MAX_FRAME_SIZE, which we never raise), header blocks and decoded header lists no larger
than ``max_header_list``, DATA no more than the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from gpumon.exporter.podresources.hpack import (
    Decoder,
    Header,
    HeaderListTooLarge,
    HpackError,
    encode_literals,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
STREAM = 1  # the client's first (and here only) stream
MAX_FRAME_SIZE = 16_384
_DEFAULT_WINDOW = 65_535
_FRAME_HEADER = 9


class FrameType(IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


class Setting(IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    INITIAL_WINDOW_SIZE = 0x4
    MAX_HEADER_LIST_SIZE = 0x6


class ErrorCode(IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY = 0x20


class ProtocolError(Exception):
    """The server broke HTTP/2, or went past one of our bounds: the connection is unusable."""


class LimitExceeded(ProtocolError):
    """The server sent more than a bound allows (header list, DATA beyond the window)."""


@dataclass(frozen=True, slots=True)
class Headers:
    fields: list[Header]
    end_stream: bool


@dataclass(frozen=True, slots=True)
class Data:
    data: bytes
    end_stream: bool


@dataclass(frozen=True, slots=True)
class StreamReset:
    code: int


@dataclass(frozen=True, slots=True)
class GoAway:
    last_stream: int
    code: int
    debug: bytes


Event = Headers | Data | StreamReset | GoAway


def frame(kind: FrameType, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error 0x{code:x}"


class ClientConnection:
    """One request on stream 1 of a fresh connection, and what the server answers on it."""

    def __init__(self, *, receive_window: int, max_header_list: int) -> None:
        self._window = receive_window
        self._max_header_list = max_header_list
        self._hpack = Decoder(max_header_list_size=max_header_list)
        self._buffer = bytearray()
        self._received = 0  # DATA bytes (padding included) against the window
        self._settled = False  # the server's first frame, its SETTINGS, has arrived
        self._block: bytearray | None = None  # a header block waiting for its CONTINUATION frames
        self._block_ends_stream = False

    def start(self, headers: list[Header], body: bytes) -> bytes:
        """The bytes that open the connection and make the request, in one write."""
        settings = b"".join(
            key.to_bytes(2, "big") + value.to_bytes(4, "big")
            for key, value in (
                (Setting.ENABLE_PUSH, 0),
                (Setting.INITIAL_WINDOW_SIZE, self._window),
                (Setting.MAX_HEADER_LIST_SIZE, self._max_header_list),
            )
        )
        grow = (self._window - _DEFAULT_WINDOW).to_bytes(4, "big")
        # The server applies our SETTINGS before it reads the request that follows them; until it
        # answers with its own, the defaults hold, under which the request may be sent at once.
        return b"".join(
            (
                PREFACE,
                frame(FrameType.SETTINGS, 0, 0, settings),
                frame(FrameType.WINDOW_UPDATE, 0, 0, grow),
                frame(FrameType.HEADERS, END_HEADERS, STREAM, encode_literals(headers)),
                frame(FrameType.DATA, END_STREAM, STREAM, body),
            )
        )

    def receive(self, data: bytes) -> tuple[list[Event], bytes]:
        """The events of the complete frames read so far, and the bytes to write back."""
        self._buffer += data
        events: list[Event] = []
        out = bytearray()
        while len(self._buffer) >= _FRAME_HEADER:
            length = int.from_bytes(self._buffer[0:3], "big")
            if length > MAX_FRAME_SIZE:
                raise ProtocolError(f"a frame of {length} bytes, above the {MAX_FRAME_SIZE} allowed")
            if len(self._buffer) < _FRAME_HEADER + length:
                break
            kind, flags = self._buffer[3], self._buffer[4]
            stream = int.from_bytes(self._buffer[5:9], "big") & 0x7FFF_FFFF
            payload = bytes(self._buffer[_FRAME_HEADER : _FRAME_HEADER + length])
            del self._buffer[: _FRAME_HEADER + length]
            self._frame(kind, flags, stream, payload, events, out)
        return events, bytes(out)

    def _frame(
        self, kind: int, flags: int, stream: int, payload: bytes, events: list[Event], out: bytearray
    ) -> None:
        if self._block is not None and (kind != FrameType.CONTINUATION or stream != STREAM):
            raise ProtocolError("a header block interrupted before its END_HEADERS")
        if not self._settled and kind != FrameType.SETTINGS:
            raise ProtocolError(f"the server's first frame is not SETTINGS but type {kind}")
        if kind == FrameType.SETTINGS:
            self._settings(flags, stream, payload, out)
        elif kind == FrameType.DATA:
            self._on_stream(stream, kind)
            self._received += len(payload)
            if self._received > self._window:
                raise LimitExceeded(f"more DATA than the {self._window}-byte window")
            events.append(Data(_unpad(flags, payload, 0), bool(flags & END_STREAM)))
        elif kind == FrameType.HEADERS:
            self._on_stream(stream, kind)
            self._block = bytearray(_unpad(flags, payload, 5 if flags & PRIORITY else 0))
            self._block_ends_stream = bool(flags & END_STREAM)
            self._continue(self._block, flags, events)
        elif kind == FrameType.CONTINUATION:
            if self._block is None:
                raise ProtocolError("CONTINUATION without a header block")
            self._block += payload
            self._continue(self._block, flags, events)
        elif kind == FrameType.RST_STREAM:
            _expect_length(kind, payload, 4)
            self._on_stream(stream, kind)
            events.append(StreamReset(int.from_bytes(payload, "big")))
        elif kind == FrameType.PING:
            _expect_length(kind, payload, 8)
            if stream:
                raise ProtocolError("PING on a stream")
            if not flags & ACK:
                out += frame(FrameType.PING, ACK, 0, payload)
        elif kind == FrameType.GOAWAY:
            if stream or len(payload) < 8:
                raise ProtocolError("malformed GOAWAY")
            last = int.from_bytes(payload[0:4], "big") & 0x7FFF_FFFF
            events.append(GoAway(last, int.from_bytes(payload[4:8], "big"), payload[8:]))
        elif kind == FrameType.PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE although our SETTINGS disable push")
        # PRIORITY, WINDOW_UPDATE (the request is sent whole at once) and unknown types
        # (RFC 9113 5.5: ignored) change nothing here.

    def _settings(self, flags: int, stream: int, payload: bytes, out: bytearray) -> None:
        if stream:
            raise ProtocolError("SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolError("SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise ProtocolError("SETTINGS payload not a multiple of 6 bytes")
        # The server's settings bound what we send, and everything is sent already: the request
        # fits any legal frame size and header list, and its 5 bytes any window (RFC 9113 6.9.2
        # lets a window go negative after it was used).
        self._settled = True
        out += frame(FrameType.SETTINGS, ACK, 0)

    def _continue(self, block: bytearray, flags: int, events: list[Event]) -> None:
        if len(block) > self._max_header_list:
            raise LimitExceeded(f"a header block larger than {self._max_header_list} bytes")
        if not flags & END_HEADERS:
            return
        self._block = None
        try:
            fields = self._hpack.decode(bytes(block))
        except HeaderListTooLarge as e:
            raise LimitExceeded(str(e)) from e
        except HpackError as e:
            raise ProtocolError(f"header block: {e}") from e
        events.append(Headers(fields, self._block_ends_stream))

    @staticmethod
    def _on_stream(stream: int, kind: int) -> None:
        # Push is off, so the server opens no stream: anything but ours names an idle stream.
        if stream != STREAM:
            raise ProtocolError(f"frame type {kind} on stream {stream}, not {STREAM}")


def _expect_length(kind: int, payload: bytes, length: int) -> None:
    if len(payload) != length:
        raise ProtocolError(f"frame type {kind} of {len(payload)} bytes, not {length}")


def _unpad(flags: int, payload: bytes, skip: int) -> bytes:
    """The frame's content without its padding and the ``skip`` bytes (HEADERS' priority) after
    the pad length."""
    pad = 0
    if flags & PADDED:
        if not payload:
            raise ProtocolError("PADDED frame without a pad length")
        pad, payload = payload[0], payload[1:]
    if pad + skip > len(payload):
        raise ProtocolError("padding longer than the frame")
    return payload[skip : len(payload) - pad]
