"""The kubelet's pod-resources endpoint for nodes that have no kubelet (kwok's): a real gRPC
server speaking the v1 proto on a unix socket, answering List and Get from the pods it is given.
The exporter reads it exactly as it reads a real kubelet's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from gpumon.exporter.podresources import api_pb2, api_pb2_grpc

Devices = Mapping[str, Sequence[str]]
"""resource name -> device IDs"""


def pod_resources(namespace: str, name: str, containers: Mapping[str, Devices]) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api_pb2.ContainerResources(
                name=cname,
                devices=[
                    api_pb2.ContainerDevices(resource_name=r, device_ids=list(ids))
                    for r, ids in devices.items()
                ],
                cpu_ids=[0, 1],
            )
            for cname, devices in containers.items()
        ],
    )


class PodResourcesFixture(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """Answers from ``pods``; replace the whole sequence to change what the kubelet says (the
    server's threads read it without a lock)."""

    def __init__(self) -> None:
        self.pods: Sequence[api_pb2.PodResources] = ()

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        return api_pb2.ListPodResourcesResponse(pod_resources=list(self.pods))

    def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        for p in self.pods:
            if (p.namespace, p.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=p)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        raise AssertionError("unreachable")


@contextlib.contextmanager
def serve(socket: Path, lister: PodResourcesFixture) -> Iterator[PodResourcesFixture]:
    """Serve ``lister`` on ``socket`` until the block exits; the socket is removed after."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield lister
    finally:
        server.stop(grace=None).wait()
        socket.unlink(missing_ok=True)
