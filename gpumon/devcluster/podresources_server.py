"""The kubelet's pod-resources endpoint for nodes that have no kubelet (kwok's): a real gRPC
server speaking the v1 proto on a unix socket, answering List and Get from the pods it is given.
The exporter reads it exactly as it reads a real kubelet's.

:func:`node_pods` reads what a node's kubelet would report for DRA: the pods bound to the node
and, per container, the devices the scheduler allocated to the claims it uses
(``dynamic_resources``), as the kubelet's DRA manager reports them after NVIDIA's plugin
prepared them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpumon.devcluster import resourceslices
from gpumon.exporter.podresources import api_pb2, api_pb2_grpc
from gpumon.k8s import dra
from gpumon.kube.client import KubeApi

Devices = Mapping[str, Sequence[str]]
"""resource name -> device IDs"""


def pod_resources(
    namespace: str,
    name: str,
    containers: Mapping[str, Devices],
    dynamic: Mapping[str, Sequence[api_pb2.DynamicResource]] | None = None,
) -> api_pb2.PodResources:
    """One pod: device-plugin devices per container, and its DRA devices (``dynamic``, by
    container; a container may have both)."""
    dynamic = dynamic or {}
    return api_pb2.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api_pb2.ContainerResources(
                name=cname,
                devices=[
                    api_pb2.ContainerDevices(resource_name=r, device_ids=list(ids))
                    for r, ids in containers.get(cname, {}).items()
                ],
                cpu_ids=[0, 1],
                dynamic_resources=list(dynamic.get(cname, ())),
            )
            for cname in dict.fromkeys([*containers, *dynamic])
        ],
    )


def _serves(result: dra.AllocatedDevice, request: str | None) -> bool:
    # A container entry without `request` gets every device of the claim; with one, the
    # devices of that request (or of its firstAvailable subrequests, "gpu/large").
    return request is None or result.request == request or result.request.startswith(f"{request}/")


def _claim_uses(pod: Mapping[str, Any]) -> list[tuple[str, dra.ClaimRef, str | None]]:
    """(container, claim, request or None for all of it) for every claim a container uses: its
    ``resources.claims``, and the claim the scheduler made for its extended resources where a
    DeviceClass backs them (``status.extendedResourceClaimStatus``, one request per resource)."""
    by_entry = dra.pod_claims_by_entry(pod)
    uses: list[tuple[str, dra.ClaimRef, str | None]] = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        for use in (container.get("resources") or {}).get("claims") or []:
            if (ref := by_entry.get(use.get("name"))) is not None:
                uses.append((container["name"], ref, use.get("request")))
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    if extended.get("resourceClaimName"):
        ref = dra.ClaimRef(
            str((pod.get("metadata") or {}).get("namespace") or ""), extended["resourceClaimName"]
        )
        for m in extended.get("requestMappings") or []:
            uses.append((m["containerName"], ref, m["requestName"]))
    return uses


def dynamic_resources(
    pod: Mapping[str, Any], claims: Mapping[dra.ClaimRef, Mapping[str, Any]]
) -> dict[str, list[api_pb2.DynamicResource]]:
    """A pod's DRA devices per container (the API's JSON for the pod and its claims), as the
    kubelet reports them: for each claim the container uses, the allocated devices it gets, with
    the CDI device NVIDIA's plugin names for each. A claim not yet allocated (or not given)
    reports nothing, as a kubelet that has not prepared it."""
    out: dict[str, list[api_pb2.DynamicResource]] = {}
    for container, ref, request in _claim_uses(pod):
        claim = claims.get(ref)
        results = [r for r in dra.claim_devices(claim) if _serves(r, request)] if claim else []
        if not claim or not results:
            continue
        uid = str((claim.get("metadata") or {}).get("uid") or "")
        out.setdefault(container, []).append(
            api_pb2.DynamicResource(
                claim_name=ref.name,
                claim_namespace=ref.namespace,
                claim_resources=[
                    api_pb2.ClaimResource(
                        cdi_devices=[api_pb2.CDIDevice(name=resourceslices.cdi_device(uid, r.ref.device))],
                        driver_name=r.ref.driver,
                        pool_name=r.ref.pool,
                        device_name=r.ref.device,
                        share_id=r.share_id,
                    )
                    for r in results
                ],
            )
        )
    return out


async def node_pods(api: KubeApi, node: str) -> list[api_pb2.PodResources]:
    """What the node's kubelet lists for DRA: every pod bound to it that has not finished, with
    the devices of its allocated claims (read from the API now: call again after changes)."""
    pods = await api.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
    claims = await api.get(dra.resource_claims_path())
    by_ref = {
        dra.ClaimRef(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims.get("items") or ()
    }
    out = []
    for p in pods.get("items") or ():
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        meta = p["metadata"]
        out.append(pod_resources(meta["namespace"], meta["name"], {}, dynamic_resources(p, by_ref)))
    return out


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
