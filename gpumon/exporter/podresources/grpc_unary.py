"""One unary gRPC call over HTTP/2, without I/O: the request's headers and message, and the reply's
message or the status it failed with.

The wire is gRPC's PROTOCOL-HTTP2.md: a POST to ``/<service>/<method>`` with ``content-type:
application/grpc``, ``te: trailers`` and ``grpc-timeout``; each message is a 5-byte prefix
(compressed flag, big-endian length) and its bytes; the reply is HEADERS (``:status`` 200), the
message in DATA, then trailers carrying ``grpc-status`` and ``grpc-message`` (or one HEADERS with
all of them, "Trailers-Only", when the call fails at once). Failures without a gRPC status are
mapped as gRPC's http-grpc-status-mapping.md maps them (HTTP status, RST_STREAM codes); a
server breaking HTTP/2 or gRPC framing is INTERNAL, a reply past our bounds RESOURCE_EXHAUSTED,
a connection closed or refused before the reply ended UNAVAILABLE.

We accept no compression (no ``grpc-accept-encoding`` is sent, so a compressed reply is an error).
"""

from __future__ import annotations

import math
from enum import IntEnum
from urllib.parse import unquote_to_bytes

from gpumon.exporter.podresources.h2 import (
    ClientConnection,
    Data,
    ErrorCode,
    Event,
    GoAway,
    Headers,
    LimitExceeded,
    ProtocolError,
    StreamReset,
    error_name,
)
from gpumon.exporter.podresources.hpack import Header

_PREFIX = 5
_MAX_HEADER_LIST = 16_384  # the reply's headers and trailers: a status, a message, a few names
_MAX_MESSAGE_TEXT = 1_000  # grpc-message kept for the log


class GrpcStatus(IntEnum):
    """gRPC status codes (grpc/doc/statuscodes.md)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class CallFailed(Exception):
    def __init__(self, status: GrpcStatus, message: str) -> None:
        super().__init__(f"{status.name}: {message}")
        self.status = status
        self.message = message


_FROM_HTTP = {
    400: GrpcStatus.INTERNAL,
    401: GrpcStatus.UNAUTHENTICATED,
    403: GrpcStatus.PERMISSION_DENIED,
    404: GrpcStatus.UNIMPLEMENTED,
    429: GrpcStatus.UNAVAILABLE,
    502: GrpcStatus.UNAVAILABLE,
    503: GrpcStatus.UNAVAILABLE,
    504: GrpcStatus.UNAVAILABLE,
}
_FROM_RESET: dict[int, GrpcStatus] = {
    ErrorCode.REFUSED_STREAM: GrpcStatus.UNAVAILABLE,
    ErrorCode.CANCEL: GrpcStatus.CANCELLED,
    ErrorCode.ENHANCE_YOUR_CALM: GrpcStatus.RESOURCE_EXHAUSTED,
    ErrorCode.INADEQUATE_SECURITY: GrpcStatus.PERMISSION_DENIED,
}


def grpc_timeout(seconds: float) -> bytes:
    """The ``grpc-timeout`` value: at most 8 digits and a unit; milliseconds, rounded up."""
    millis = max(1, math.ceil(seconds * 1000))
    return f"{millis}m".encode() if millis < 10**8 else f"{min(math.ceil(seconds), 10**8 - 1)}S".encode()


class UnaryCall:
    """Feed it what the connection reads; :attr:`reply` is set when the call succeeded, and
    :class:`CallFailed` is raised as soon as it cannot."""

    def __init__(self, path: str, request: bytes, *, timeout_seconds: float, max_message: int) -> None:
        self._path = path.encode()
        self._request = request
        self._timeout = timeout_seconds
        self._max_message = max_message
        self._connection = ClientConnection(
            receive_window=max_message + _PREFIX, max_header_list=_MAX_HEADER_LIST
        )
        self._answered = False  # the reply's first HEADERS arrived
        self._body = bytearray()
        self._expected: int | None = None  # the message's length, from its prefix
        self.reply: bytes | None = None

    def start(self) -> bytes:
        headers: list[Header] = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", self._path),
            (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"grpc-timeout", grpc_timeout(self._timeout)),
        ]
        message = b"\x00" + len(self._request).to_bytes(4, "big") + self._request
        return self._connection.start(headers, message)

    def receive(self, data: bytes) -> bytes:
        """Takes bytes read; gives the bytes to write back."""
        try:
            events, out = self._connection.receive(data)
        except LimitExceeded as e:
            raise CallFailed(GrpcStatus.RESOURCE_EXHAUSTED, str(e)) from e
        except ProtocolError as e:
            raise CallFailed(GrpcStatus.INTERNAL, f"HTTP/2: {e}") from e
        for event in events:
            if self.reply is None:
                self._event(event)
        return out

    def closed(self) -> None:
        """The server closed the connection; unless the reply was complete, that is a failure."""
        if self.reply is None:
            raise CallFailed(GrpcStatus.UNAVAILABLE, "the connection closed before the reply ended")

    def _event(self, event: Event) -> None:
        if isinstance(event, Headers):
            if not self._answered and not event.end_stream:
                self._response_headers(event.fields)
            elif event.end_stream:  # trailers, or Trailers-Only (the first and last HEADERS)
                self._trailers(event.fields)
            else:
                raise CallFailed(GrpcStatus.INTERNAL, "a second HEADERS that does not end the stream")
        elif isinstance(event, Data):
            self._data(event)
        elif isinstance(event, StreamReset):
            status = _FROM_RESET.get(event.code, GrpcStatus.INTERNAL)
            raise CallFailed(status, f"the server reset the stream ({error_name(event.code)})")
        elif isinstance(event, GoAway) and event.last_stream < 1:
            # Our stream was never processed: the server is shutting down (RFC 9113 6.8).
            detail = event.debug[:200].decode("utf-8", "replace")
            raise CallFailed(
                GrpcStatus.UNAVAILABLE, f"GOAWAY before the call ({error_name(event.code)}) {detail}"
            )
        # A GOAWAY that covers our stream lets it finish: the reply still comes, or the close.

    def _response_headers(self, fields: list[Header]) -> None:
        self._answered = True
        values = dict(fields)
        http = values.get(b":status", b"")
        if http != b"200":
            # Three digits, or int() of a long one would raise (and cost) beyond our statuses.
            status = (
                _FROM_HTTP.get(int(http), GrpcStatus.UNKNOWN)
                if http.isdigit() and len(http) == 3
                else GrpcStatus.INTERNAL
            )
            raise CallFailed(status, f"HTTP status {http[:10].decode('ascii', 'replace')}")
        if not values.get(b"content-type", b"").startswith(b"application/grpc"):
            raise CallFailed(GrpcStatus.INTERNAL, "the reply's content-type is not application/grpc")

    def _data(self, event: Data) -> None:
        if not self._answered:
            raise CallFailed(GrpcStatus.INTERNAL, "DATA before the reply's HEADERS")
        self._body += event.data
        if self._expected is None and len(self._body) >= _PREFIX:
            if self._body[0]:
                raise CallFailed(GrpcStatus.INTERNAL, "a compressed message, although none was accepted")
            self._expected = int.from_bytes(self._body[1:_PREFIX], "big")
            if self._expected > self._max_message:
                raise CallFailed(
                    GrpcStatus.RESOURCE_EXHAUSTED,
                    f"a message of {self._expected} bytes, above the {self._max_message} accepted",
                )
        if self._expected is not None and len(self._body) > _PREFIX + self._expected:
            raise CallFailed(GrpcStatus.INTERNAL, "more than one message in a unary reply")
        if event.end_stream:
            raise CallFailed(GrpcStatus.INTERNAL, "the stream ended without trailers")

    def _trailers(self, fields: list[Header]) -> None:
        values = dict(fields)
        if not self._answered:  # Trailers-Only: :status and content-type are here
            self._answered = True
            if values.get(b":status") != b"200":
                self._response_headers(fields)
        raw = values.get(b"grpc-status")
        if raw is None or not raw.isdigit() or len(raw) > 3:
            raise CallFailed(GrpcStatus.INTERNAL, "trailers without a grpc-status")
        code = int(raw)
        if code != GrpcStatus.OK:
            status = GrpcStatus(code) if code <= max(GrpcStatus) else GrpcStatus.UNKNOWN
            message = unquote_to_bytes(values.get(b"grpc-message", b"")[: 3 * _MAX_MESSAGE_TEXT])
            raise CallFailed(status, message.decode("utf-8", "replace")[:_MAX_MESSAGE_TEXT])
        if self._expected is None or len(self._body) != _PREFIX + self._expected:
            raise CallFailed(GrpcStatus.INTERNAL, "status OK without a whole reply message")
        self.reply = bytes(self._body[_PREFIX:])
