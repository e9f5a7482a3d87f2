"""The exporter's own protobuf decoding of ListPodResourcesResponse against protobuf itself: any
response built with the generated classes and serialized, with unknown fields of every wire type
anywhere, decodes to the view the exporter built from the parsed message before it stopped
importing protobuf (``oracle`` below is that code)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from protobuf_wire import field, length, varint
from strategies import FUZZ

from gpumon.exporter.podresources import api_pb2
from gpumon.exporter.podresources.view import Assignment, DeviceAssignment, PodKey, view_from_response
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER, ClaimDevice, ClaimRef, DeviceRef

DRIVERS = frozenset({NVIDIA_GPU_DRIVER, "example.com/tpu"})


def watched(resource: str) -> bool:
    return resource.startswith("nvidia.com/")


def oracle(
    response: api_pb2.ListPodResourcesResponse, watched: Callable[[str], bool], drivers: frozenset[str]
) -> dict[PodKey, dict[str, tuple[Assignment, ...]]]:
    """gpumon.exporter.podresources_client.view_from_response as of a4bd73e, on the parsed message."""
    return {
        (pod.namespace, pod.name): {
            c.name: (
                *(
                    DeviceAssignment(d.resource_name, tuple(d.device_ids))
                    for d in c.devices
                    if watched(d.resource_name)
                ),
                *dict.fromkeys(
                    ClaimDevice(
                        ClaimRef(dr.claim_namespace, dr.claim_name),
                        DeviceRef(r.driver_name, r.pool_name, r.device_name),
                    )
                    for dr in c.dynamic_resources
                    for r in dr.claim_resources
                    if r.driver_name in drivers and r.device_name
                ),
            )
            for c in pod.containers
        }
        for pod in response.pod_resources
    }


# Few distinct names, so that pods, containers and devices repeat (the last entry wins).
names = st.sampled_from(["", "a", "train-0", "ünï", "x" * 200])
resources = st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "example.com/nic", ""])
numa = st.builds(
    api_pb2.TopologyInfo, nodes=st.lists(st.builds(api_pb2.NUMANode, ID=st.integers(-(2**63), 2**63 - 1)))
)
claim_resources = st.builds(
    api_pb2.ClaimResource,
    cdi_devices=st.lists(st.builds(api_pb2.CDIDevice, name=names), max_size=1),
    driver_name=st.sampled_from([NVIDIA_GPU_DRIVER, "example.com/tpu", "nic.example.com", ""]),
    pool_name=names,
    device_name=st.sampled_from(["", "gpu-0", "gpu-1", "gpu-2-mig-9-4-4"]),
    share_id=st.none() | names,
)
containers = st.builds(
    api_pb2.ContainerResources,
    name=names,
    devices=st.lists(
        st.builds(
            api_pb2.ContainerDevices,
            resource_name=resources,
            device_ids=st.lists(names, max_size=2),
            topology=numa,
        ),
        max_size=2,
    ),
    cpu_ids=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=2),
    memory=st.lists(
        st.builds(api_pb2.ContainerMemory, memory_type=names, size=st.integers(0, 2**64 - 1), topology=numa),
        max_size=1,
    ),
    dynamic_resources=st.lists(
        st.builds(
            api_pb2.DynamicResource,
            claim_name=names,
            claim_namespace=names,
            claim_resources=st.lists(claim_resources, max_size=3),
        ),
        max_size=2,
    ),
)
responses = st.builds(
    api_pb2.ListPodResourcesResponse,
    pod_resources=st.lists(
        st.builds(
            api_pb2.PodResources, name=names, namespace=names, containers=st.lists(containers, max_size=2)
        ),
        max_size=4,
    ),
)


@FUZZ
@given(responses, st.sampled_from([DRIVERS, frozenset()]))
def test_decodes_to_the_view_of_the_parsed_message(response: Any, drivers: frozenset[str]) -> None:
    assert view_from_response(response.SerializeToString(), watched, drivers) == oracle(
        response, watched, drivers
    )


# A field of every wire type a later kubelet could add. Numbers 1-5 are known in every message
# read: there only other wire types than the field's (which parsers skip as unknown); a
# length-delimited field gets a number no message read uses, or its bytes would be parsed.
any_number = st.integers(1, 2**29 - 1)
unknown_fields = st.lists(
    st.one_of(
        st.tuples(any_number, st.integers(0, 2**64 - 1)).map(lambda f: field(f[0], 0, varint(f[1]))),
        st.tuples(any_number, st.binary(min_size=8, max_size=8)).map(lambda f: field(f[0], 1, f[1])),
        st.tuples(st.integers(6, 2**29 - 1), st.binary(max_size=20)).map(lambda f: length(*f)),
        st.tuples(any_number, st.binary(min_size=4, max_size=4)).map(lambda f: field(f[0], 5, f[1])),
        any_number.map(lambda n: field(n, 3, field(7, 0, b"\x01") + field(n, 4, b""))),
    ),
    max_size=4,
).map(b"".join)


@FUZZ
@given(responses, unknown_fields, unknown_fields)
def test_unknown_fields_of_every_wire_type_are_skipped(response: Any, top: bytes, inner: bytes) -> None:
    # Known numbers with another wire type are unknown fields too, as protobuf treats them.
    wire = top + b"".join(length(1, inner + pod.SerializeToString()) for pod in response.pod_resources)
    parsed = api_pb2.ListPodResourcesResponse.FromString(wire)
    assert view_from_response(wire, watched, DRIVERS) == oracle(parsed, watched, DRIVERS)
