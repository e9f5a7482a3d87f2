"""The kubelet pod-resources API (v1 ``PodResourcesLister.List``) over its unix socket.

One gRPC channel for the life of the exporter, polled on the slow cadence and never on a
scrape. A failed poll is counted (``pod_resources`` errors by kind) and leaves the last good
view in place; the channel reconnects on its own, with its backoff capped so that a restarted
kubelet is seen again within a few seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from gpumon.devices.backend import ErrorSink
from gpumon.dra import ClaimDevice, ClaimRef, DeviceRef
from gpumon.exporter.podresources import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

SOURCE = "pod_resources"
_MAX_MESSAGE_BYTES = 16 << 20  # what the kubelet itself allows for this API


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    resource: str
    device_ids: tuple[str, ...]


PodKey = tuple[str, str]
"""(namespace, pod name): the API identifies pods by name only."""

Assignment = DeviceAssignment | ClaimDevice
"""What the kubelet gave a container: devices of a device plugin's resource, or one device of a
DRA ResourceClaim (``dynamic_resources``)."""

PodResourcesView = Mapping[PodKey, Mapping[str, tuple[Assignment, ...]]]
"""Every pod the kubelet runs, by (namespace, name); for each container its assignments of the
watched resources and DRA drivers (empty for containers that hold none)."""


def view_from_response(
    response: api_pb2.ListPodResourcesResponse,
    watched: Callable[[str], bool],
    dra_drivers: frozenset[str] = frozenset(),
) -> PodResourcesView:
    view: dict[PodKey, dict[str, tuple[Assignment, ...]]] = {}
    for pod in response.pod_resources:
        view[(pod.namespace, pod.name)] = {
            c.name: (
                *(
                    DeviceAssignment(d.resource_name, tuple(d.device_ids))
                    for d in c.devices
                    if watched(d.resource_name)
                ),
                *_claim_devices(c, dra_drivers),
            )
            for c in pod.containers
        }
    return view


def _claim_devices(c: api_pb2.ContainerResources, drivers: frozenset[str]) -> tuple[ClaimDevice, ...]:
    # dict: each device once, however many shares of it (share_id) the claim holds.
    return tuple(
        dict.fromkeys(
            ClaimDevice(
                ClaimRef(dr.claim_namespace, dr.claim_name),
                DeviceRef(r.driver_name, r.pool_name, r.device_name),
            )
            for dr in c.dynamic_resources
            for r in dr.claim_resources
            if r.driver_name in drivers and r.device_name
        )
    )


def error_kind(err: grpc.aio.AioRpcError) -> str:
    code = err.code()
    return {
        grpc.StatusCode.UNAVAILABLE: "unavailable",
        grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
        grpc.StatusCode.PERMISSION_DENIED: "forbidden",
        grpc.StatusCode.UNIMPLEMENTED: "unimplemented",
    }.get(code, code.name.lower() if code is not None else "error")


class PodResourcesClient:
    def __init__(
        self,
        socket: Path,
        errors: ErrorSink,
        watched: Callable[[str], bool],
        *,
        timeout_seconds: float,
        dra_drivers: frozenset[str] = frozenset(),
    ) -> None:
        self._socket = socket
        self._errors = errors
        self._watched = watched
        self._dra_drivers = dra_drivers
        self._timeout = timeout_seconds
        self._channel: grpc.aio.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None
        self.view: PodResourcesView | None = None
        self.fresh = False
        self._outage_logged = False

    async def poll(self) -> None:
        """List once; on success replace :attr:`view`, otherwise count why and keep it."""
        self.fresh = False
        if not self._socket.exists():
            self._errors(SOURCE, "socket_missing")
            return
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self._socket.absolute()}",
                options=[
                    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                    ("grpc.initial_reconnect_backoff_ms", 500),
                    ("grpc.max_reconnect_backoff_ms", 5000),
                ],
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        try:
            response = await self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.aio.AioRpcError as e:
            kind = error_kind(e)
            self._errors(SOURCE, kind)
            # Logged once per outage; the error metric counts every failure.
            log.log(
                logging.DEBUG if self._outage_logged else logging.WARNING,
                "pod-resources List failed",
                extra={"kind": kind, "detail": (e.details() or "")[:200]},
            )
            self._outage_logged = True
            return
        self.view = view_from_response(response, self._watched, self._dra_drivers)
        self.fresh = True
        self._outage_logged = False

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None
