"""The pod-resources client's HTTP/2 and gRPC parts without a socket: what a server could send,
frame by frame, and what the call makes of it. The real grpcio server is in
test_podresources.py and test_podresources_h2c.py."""

from __future__ import annotations

import pytest

from gpumon.exporter.podresources import h2
from gpumon.exporter.podresources.grpc_unary import CallFailed, GrpcStatus, UnaryCall, grpc_timeout
from gpumon.exporter.podresources.h2 import ErrorCode, FrameType, frame
from gpumon.exporter.podresources.hpack import Decoder, encode_literals

MAX = 1 << 20
SETTINGS = frame(FrameType.SETTINGS, 0, 0)
OK_HEADERS = frame(
    FrameType.HEADERS,
    h2.END_HEADERS,
    1,
    encode_literals([(b":status", b"200"), (b"content-type", b"application/grpc")]),
)


def trailers(status: int, message: bytes = b"", flags: int = h2.END_HEADERS | h2.END_STREAM) -> bytes:
    fields = [(b"grpc-status", str(status).encode())] + ([(b"grpc-message", message)] if message else [])
    return frame(FrameType.HEADERS, flags, 1, encode_literals(fields))


def message(body: bytes, flags: int = 0) -> bytes:
    return frame(FrameType.DATA, flags, 1, b"\x00" + len(body).to_bytes(4, "big") + body)


def call() -> UnaryCall:
    c = UnaryCall("/v1.PodResourcesLister/List", b"", timeout_seconds=0.5, max_message=MAX)
    c.start()
    return c


def failure(*chunks: bytes) -> CallFailed:
    c = call()
    with pytest.raises(CallFailed) as e:
        for chunk in chunks:
            c.receive(chunk)
        c.closed()
    return e.value


def test_the_request_is_a_grpc_post_with_a_deadline() -> None:
    sent = UnaryCall("/v1.PodResourcesLister/List", b"", timeout_seconds=0.5, max_message=MAX).start()
    assert sent.startswith(h2.PREFACE)
    frames = []
    rest = sent[len(h2.PREFACE) :]
    while rest:
        length = int.from_bytes(rest[:3], "big")
        frames.append((rest[3], rest[4], int.from_bytes(rest[5:9], "big"), rest[9 : 9 + length]))
        rest = rest[9 + length :]
    kinds = [f[0] for f in frames]
    assert kinds == [FrameType.SETTINGS, FrameType.WINDOW_UPDATE, FrameType.HEADERS, FrameType.DATA]
    # The connection's window grown to the stream's: a reply up to the bound flows at once.
    assert int.from_bytes(frames[1][3], "big") == MAX + 5 - 65_535
    assert dict(Decoder(max_header_list_size=4096).decode(frames[2][3])) == {
        b":method": b"POST",
        b":scheme": b"http",
        b":path": b"/v1.PodResourcesLister/List",
        b":authority": b"localhost",
        b"content-type": b"application/grpc",
        b"te": b"trailers",
        b"grpc-timeout": b"500m",
    }
    assert frames[3][1:] == (h2.END_STREAM, 1, b"\x00\x00\x00\x00\x00")


@pytest.mark.parametrize(
    ("seconds", "value"), [(0.5, b"500m"), (0.0001, b"1m"), (10, b"10000m"), (200_000, b"200000S")]
)
def test_grpc_timeout_fits_eight_digits(seconds: float, value: bytes) -> None:
    assert grpc_timeout(seconds) == value


def test_a_reply_split_anywhere_is_the_same_reply() -> None:
    wire = SETTINGS + OK_HEADERS + message(b"\x0a\x03abc") + trailers(0)
    for cut in range(len(wire)):
        c = call()
        c.receive(wire[:cut])
        c.receive(wire[cut:])
        assert c.reply == b"\x0a\x03abc"


def test_settings_and_pings_are_acknowledged() -> None:
    c = call()
    out = c.receive(SETTINGS + frame(FrameType.PING, 0, 0, b"12345678"))
    assert out == frame(FrameType.SETTINGS, h2.ACK, 0) + frame(FrameType.PING, h2.ACK, 0, b"12345678")
    assert c.receive(frame(FrameType.PING, h2.ACK, 0, b"87654321")) == b""


def test_padding_priority_and_continuation_are_understood() -> None:
    block = encode_literals([(b":status", b"200"), (b"content-type", b"application/grpc+proto")])
    padded_headers = frame(
        FrameType.HEADERS,
        h2.PADDED | h2.PRIORITY,
        1,
        bytes([3]) + b"\x00\x00\x00\x00\x10" + block[:5] + b"pad",
    )
    continuation = frame(FrameType.CONTINUATION, h2.END_HEADERS, 1, block[5:])
    data = frame(FrameType.DATA, h2.PADDED, 1, bytes([2]) + b"\x00\x00\x00\x00\x01x" + b"\x00\x00")
    c = call()
    c.receive(
        SETTINGS + padded_headers + continuation + frame(0xF0, 0, 0, b"unknown type") + data + trailers(0)
    )
    assert c.reply == b"x"


def test_an_empty_reply_is_a_message_of_no_bytes() -> None:
    c = call()
    c.receive(SETTINGS + OK_HEADERS + message(b"") + trailers(0))
    assert c.reply == b""


@pytest.mark.parametrize(
    ("status", "text", "want"),
    [
        (12, b"unknown service v1.PodResourcesLister", GrpcStatus.UNIMPLEMENTED),
        (7, b"refused%20by%20the%20test", GrpcStatus.PERMISSION_DENIED),
        (99, b"", GrpcStatus.UNKNOWN),
    ],
)
def test_trailers_only_carry_the_status(status: int, text: bytes, want: GrpcStatus) -> None:
    fields = [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", str(status).encode()),
    ]
    only = frame(
        FrameType.HEADERS,
        h2.END_HEADERS | h2.END_STREAM,
        1,
        encode_literals([*fields, (b"grpc-message", text)]),
    )
    e = failure(SETTINGS + only)
    assert e.status == want
    assert "%20" not in e.message


@pytest.mark.parametrize(
    ("chunks", "want"),
    [
        # The server breaks HTTP/2.
        ([b"HTTP/1.1 400 Bad Request\r\n\r\n"], GrpcStatus.INTERNAL),  # a 4-MiB "frame": refused unread
        ([OK_HEADERS], GrpcStatus.INTERNAL),  # no SETTINGS first
        (
            [SETTINGS + frame(FrameType.PUSH_PROMISE, h2.END_HEADERS, 1, b"\x00\x00\x00\x02")],
            GrpcStatus.INTERNAL,
        ),
        ([SETTINGS + frame(FrameType.DATA, 0, 3, b"x")], GrpcStatus.INTERNAL),  # a stream nobody opened
        ([SETTINGS + frame(FrameType.PING, 0, 0, b"short")], GrpcStatus.INTERNAL),
        (
            [SETTINGS + frame(FrameType.HEADERS, h2.END_HEADERS, 1, b"\x80")],  # HPACK index 0
            GrpcStatus.INTERNAL,
        ),
        (
            [SETTINGS + frame(FrameType.HEADERS, 0, 1, b"") + OK_HEADERS],  # no CONTINUATION
            GrpcStatus.INTERNAL,
        ),
        # The server breaks gRPC.
        ([SETTINGS + message(b"x")], GrpcStatus.INTERNAL),  # DATA before HEADERS
        ([SETTINGS + OK_HEADERS + message(b"x", h2.END_STREAM)], GrpcStatus.INTERNAL),  # no trailers
        ([SETTINGS + OK_HEADERS + trailers(0)], GrpcStatus.INTERNAL),  # OK without a message
        ([SETTINGS + OK_HEADERS + message(b"x") + message(b"y")], GrpcStatus.INTERNAL),  # two messages
        ([SETTINGS + OK_HEADERS + frame(FrameType.DATA, 0, 1, b"\x01\x00\x00\x00\x00")], GrpcStatus.INTERNAL),
        ([SETTINGS + OK_HEADERS + message(b"x") + trailers(0, flags=h2.END_HEADERS)], GrpcStatus.INTERNAL),
        (
            [SETTINGS + frame(FrameType.HEADERS, h2.END_HEADERS, 1, encode_literals([(b":status", b"200")]))],
            GrpcStatus.INTERNAL,  # no content-type
        ),
        (
            [
                SETTINGS
                + frame(FrameType.HEADERS, h2.END_HEADERS, 1, encode_literals([(b":status", b"9" * 5000)]))
            ],
            GrpcStatus.INTERNAL,  # a status int() would refuse: more digits than Python converts
        ),
        # HTTP statuses and resets as gRPC maps them.
        (
            [SETTINGS + frame(FrameType.HEADERS, h2.END_HEADERS, 1, encode_literals([(b":status", b"404")]))],
            GrpcStatus.UNIMPLEMENTED,
        ),
        (
            [SETTINGS + frame(FrameType.RST_STREAM, 0, 1, ErrorCode.REFUSED_STREAM.to_bytes(4, "big"))],
            GrpcStatus.UNAVAILABLE,
        ),
        (
            [SETTINGS + frame(FrameType.RST_STREAM, 0, 1, ErrorCode.CANCEL.to_bytes(4, "big"))],
            GrpcStatus.CANCELLED,
        ),
        ([SETTINGS + frame(FrameType.RST_STREAM, 0, 1, (0x77).to_bytes(4, "big"))], GrpcStatus.INTERNAL),
        # Going away: before our stream, or leaving it unfinished.
        ([SETTINGS + frame(FrameType.GOAWAY, 0, 0, bytes(8) + b"shutting down")], GrpcStatus.UNAVAILABLE),
        (
            [SETTINGS + frame(FrameType.GOAWAY, 0, 0, b"\x00\x00\x00\x01" + bytes(4)) + OK_HEADERS],
            GrpcStatus.UNAVAILABLE,
        ),
        ([SETTINGS + OK_HEADERS + message(b"abc")[:-1]], GrpcStatus.UNAVAILABLE),  # closed mid-message
        ([], GrpcStatus.UNAVAILABLE),  # closed before anything
    ],
)
def test_what_a_broken_server_sends_fails_the_call(chunks: list[bytes], want: GrpcStatus) -> None:
    assert failure(*chunks).status == want


def test_a_reply_beyond_the_bound_is_refused_at_its_prefix() -> None:
    prefix = frame(FrameType.DATA, 0, 1, b"\x00" + (MAX + 1).to_bytes(4, "big"))
    e = failure(SETTINGS + OK_HEADERS + prefix)
    assert e.status == GrpcStatus.RESOURCE_EXHAUSTED


def test_data_beyond_the_window_is_refused() -> None:
    # A message within the bound, but padding pushing the DATA past the window.
    chunk = frame(
        FrameType.DATA, h2.PADDED, 1, bytes([255]) + bytes(h2.MAX_FRAME_SIZE - 1 - 255) + bytes(255)
    )
    c = call()
    c.receive(SETTINGS + OK_HEADERS + frame(FrameType.DATA, 0, 1, b"\x00" + MAX.to_bytes(4, "big")))
    with pytest.raises(CallFailed) as e:
        for _ in range(MAX // h2.MAX_FRAME_SIZE + 2):
            c.receive(chunk)
    assert e.value.status == GrpcStatus.RESOURCE_EXHAUSTED
    assert "window" in e.value.message


def test_endless_continuation_is_bounded() -> None:
    c = call()
    c.receive(SETTINGS + frame(FrameType.HEADERS, 0, 1, b"\x82"))
    with pytest.raises(CallFailed) as e:
        for _ in range(100):
            c.receive(frame(FrameType.CONTINUATION, 0, 1, b"\x82" * 1000))
    assert e.value.status == GrpcStatus.RESOURCE_EXHAUSTED


def test_an_oversized_frame_is_refused_from_its_header() -> None:
    c = call()
    c.receive(SETTINGS)
    with pytest.raises(CallFailed) as e:
        c.receive(
            (h2.MAX_FRAME_SIZE + 1).to_bytes(3, "big") + bytes([FrameType.DATA, 0]) + b"\x00\x00\x00\x01"
        )
    assert e.value.status == GrpcStatus.INTERNAL
    assert "16384" in e.value.message
