"""Garbage from the kubelet's socket through the exporter's own HTTP/2 and HPACK: whatever a
server sends, in whatever pieces, the call ends with a reply or a CallFailed (a gRPC status),
and a header block decodes or raises HpackError; nothing else escapes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from strategies import FUZZ

from gpumon.exporter.podresources.grpc_unary import CallFailed, UnaryCall
from gpumon.exporter.podresources.h2 import FrameType, frame
from gpumon.exporter.podresources.hpack import Decoder, HpackError

# Frames of every type with random flags and payloads, mostly on our stream, after the SETTINGS
# a server must send first: garbage that gets past the first checks.
frames = st.builds(
    frame,
    st.sampled_from(list(FrameType)),
    st.integers(0, 255),
    st.sampled_from([0, 1, 1, 1, 3]),
    st.binary(max_size=40),
)
servers = st.one_of(
    st.binary(max_size=300),
    st.lists(frames, max_size=8).map(lambda fs: frame(FrameType.SETTINGS, 0, 0) + b"".join(fs)),
)


@FUZZ
@given(servers, st.lists(st.integers(1, 50), max_size=5))
def test_any_server_bytes_end_in_a_reply_or_a_status(wire: bytes, cuts: list[int]) -> None:
    call = UnaryCall("/v1.PodResourcesLister/List", b"", timeout_seconds=1, max_message=1 << 20)
    call.start()
    try:
        for size in [*cuts, len(wire)]:
            piece, wire = wire[:size], wire[size:]
            call.receive(piece)
        call.closed()
    except CallFailed:
        return
    assert call.reply is not None


@FUZZ
@given(st.lists(st.binary(max_size=60), max_size=4))
def test_any_header_blocks_decode_or_raise_hpack_error(blocks: list[bytes]) -> None:
    decoder = Decoder(max_header_list_size=4096)
    for block in blocks:  # one decoder: what a block leaves in the table affects the next
        try:
            headers = decoder.decode(block)
        except HpackError:
            continue
        assert all(isinstance(n, bytes) and isinstance(v, bytes) for n, v in headers)
