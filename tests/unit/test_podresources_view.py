"""The exporter's own protobuf decoding of ListPodResourcesResponse: fields skipped and messages
refused. Its equivalence with protobuf's parse is a property in the fuzz tier
(tests/fuzz/test_fuzz_podresources_view.py)."""

from __future__ import annotations

import pytest
from protobuf_wire import field, length, varint

from gpumon.exporter.podresources import api_pb2
from gpumon.exporter.podresources.protowire import DecodeError
from gpumon.exporter.podresources.view import view_from_response
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER


def watched(resource: str) -> bool:
    return resource.startswith("nvidia.com/")


def test_a_known_number_of_another_wire_type_is_skipped() -> None:
    pod = field(1, 0, varint(5)) + length(2, b"ml") + length(1, b"p") + field(3, 5, b"\x00\x00\x00\x00")
    wire = length(1, pod)
    parsed = api_pb2.ListPodResourcesResponse.FromString(wire).pod_resources[0]
    assert (parsed.namespace, parsed.name, len(parsed.containers)) == ("ml", "p", 0)
    assert view_from_response(wire, watched) == {("ml", "p"): {}}


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        (length(1, b"")[:-1], "truncated length"),
        (b"\x0a\x05ab", "a field longer than its message"),
        (field(1, 0, b"\xff" * 10 + b"\x01"), "a varint of 11 bytes"),
        (field(9, 6, b""), "wire type 6"),
        (field(9, 4, b""), "an end of group nobody opened"),
        (field(9, 3, field(8, 4, b"")), "a group ended by another number"),
        (field(9, 3, b""), "a group never ended"),
        (b"\x00\x01", "field number 0"),
        (field(9, 3, b"") * 101 + field(9, 4, b"") * 101, "groups nested past 100"),
        (length(1, length(1, b"\xff\xfe")), "a pod name that is not UTF-8"),
        (field(9, 1, b"1234567"), "a 64-bit field cut short"),
    ],
)
def test_malformed_messages_are_refused(wire: bytes, why: str) -> None:
    with pytest.raises(DecodeError):
        view_from_response(wire, watched, frozenset({NVIDIA_GPU_DRIVER}))
