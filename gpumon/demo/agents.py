"""What kwok does not play on its nodes and the exporters need: the kubelet's device manager
(which GPUs a pod was given, served on the node's pod-resources socket) and the gpushare
scheduler extender (the ``ALIYUN_COM_GPU_MEM_*`` annotations naming a shared pod's GPU).

The assignments are pure functions of the pods bound to a node and what they already hold
(devices stick to a pod for its life, as the kubelet's checkpoint keeps them); :class:`NodeAgents`
serves and writes them.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpumon.demo.views import ClusterView, PodRow
from gpumon.devcluster import nodes, podresources_server
from gpumon.devcluster.podresources_server import PodResourcesFixture
from gpumon.exporter.podresources import api_pb2
from gpumon.k8s.sharing import GPUSHARE_ASSIGNED, GPUSHARE_INDEX, GPUSHARE_POD_MEMORY
from gpumon.kube.client import KubeApi, KubeError, NotFound

log = logging.getLogger(__name__)


def assign_gpus(
    pods: Sequence[PodRow], held: Mapping[str, tuple[int, ...]], gpu_count: int
) -> dict[str, tuple[int, ...]]:
    """GPU indexes per pod key: kept where already held, the lowest free ones for a new pod.
    A pod that does not fit (the scheduler would not have bound it) gets nothing yet."""
    alive = {p.key: p for p in pods if p.holds_node and p.gpus > 0}
    out = {k: v for k, v in held.items() if k in alive}
    used = {i for v in out.values() for i in v}
    for key, pod in sorted(alive.items(), key=lambda kv: (kv[1].created_at, kv[0])):
        if key in out:
            continue
        free = [i for i in range(gpu_count) if i not in used]
        if len(free) >= pod.gpus:
            out[key] = tuple(free[: pod.gpus])
            used.update(out[key])
    return out


def assign_shared(pods: Sequence[PodRow], gpu_count: int, gib_per_gpu: int) -> dict[str, int]:
    """GPU index per shared pod not yet placed (``gpushare_index`` unset): the fullest GPU that
    still has room, as gpushare's binpack policy does."""
    alive = [p for p in pods if p.holds_node and p.gpu_memory > 0]
    used = [0] * gpu_count
    for p in alive:
        if p.gpushare_index is not None and 0 <= p.gpushare_index < gpu_count:
            used[p.gpushare_index] += p.gpu_memory
    out: dict[str, int] = {}
    for p in sorted((p for p in alive if p.gpushare_index is None), key=lambda p: (p.created_at, p.key)):
        fits = [i for i in range(gpu_count) if used[i] + p.gpu_memory <= gib_per_gpu]
        if fits:
            best = max(fits, key=lambda i: (used[i], -i))
            out[p.key] = best
            used[best] += p.gpu_memory
    return out


def listing(pods: Sequence[PodRow], assigned: Mapping[str, tuple[int, ...]]) -> list[api_pb2.PodResources]:
    """What the node's kubelet says over pod-resources: each pod with its GPUs (index IDs, the
    device plugin's ``DEVICE_ID_STRATEGY=index``)."""
    return [
        podresources_server.pod_resources(
            p.namespace,
            p.name,
            {p.container: {nodes.GPU: [str(i) for i in assigned[p.key]]} if p.key in assigned else {}},
        )
        for p in pods
        if p.holds_node
    ]


class NodeAgents:
    """One pod-resources server per node (sockets in a short temporary directory: a unix socket
    path holds at most 107 bytes), fed from each :class:`ClusterView`."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._dir = Path(tempfile.mkdtemp(prefix="gpumon-demo-"))
        self._stack = contextlib.ExitStack()
        self._listers: dict[str, tuple[PodResourcesFixture, int]] = {}  # node -> (lister, GPUs)
        self._held: dict[str, dict[str, tuple[int, ...]]] = {}

    def socket(self, node: str, gpu_count: int) -> Path:
        """The node's pod-resources socket, served from now on."""
        path = self._dir / f"{node}.sock"
        if node not in self._listers:
            lister = self._stack.enter_context(podresources_server.serve(path, PodResourcesFixture()))
            self._listers[node] = (lister, gpu_count)
        return path

    async def sync(self, view: ClusterView, shared_gib_per_gpu: Mapping[str, int]) -> None:
        by_node: dict[str, list[PodRow]] = {}
        for p in view.pods:
            if p.node is not None:
                by_node.setdefault(p.node, []).append(p)
        for node, (lister, gpu_count) in self._listers.items():
            pods = by_node.get(node, [])
            held = assign_gpus(pods, self._held.get(node, {}), gpu_count)
            self._held[node] = held
            lister.pods = tuple(listing(pods, held))
            if node in shared_gib_per_gpu:
                await self._place_shared(pods, gpu_count, shared_gib_per_gpu[node])

    async def _place_shared(self, pods: Sequence[PodRow], gpu_count: int, gib_per_gpu: int) -> None:
        memory = {p.key: p.gpu_memory for p in pods}
        for key, index in assign_shared(pods, gpu_count, gib_per_gpu).items():
            namespace, name = key.split("/", 1)
            patch = {
                "metadata": {
                    "annotations": {
                        GPUSHARE_INDEX: str(index),
                        GPUSHARE_POD_MEMORY: str(memory[key]),
                        GPUSHARE_ASSIGNED: "true",
                    }
                }
            }
            try:
                await self._api.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", patch)
            except NotFound:
                pass
            except KubeError as e:
                log.warning("could not place shared pod", extra={"pod": key, "error": str(e)})

    def close(self) -> None:
        self._stack.close()
        shutil.rmtree(self._dir, ignore_errors=True)
